"""The rank side of nbtrain: one process per rank, started by the kernel (see :mod:`nbtrain.rank.main`).

It imports :mod:`nbtrain.wire` (the messages, the payload format) and :mod:`nbtrain.rank.train` (the cell's
training context), never the kernel side (:mod:`nbtrain.kernel`, the dashboard, the server).
"""
