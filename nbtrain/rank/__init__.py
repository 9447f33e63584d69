"""One rank's process: started by the kernel (or a node agent), or forked by the zygote (see :mod:`nbtrain.rank.main`).

It imports :mod:`nbtrain.wire` (the messages, the payload format), :mod:`nbtrain.common` and its own
:mod:`nbtrain.rank.train` (the cell's training context), never another process's package (:mod:`nbtrain.kernel`,
:mod:`nbtrain.node`, :mod:`nbtrain.server`).
"""
