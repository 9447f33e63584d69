"""What the ranks write and ask, relayed into the running cell: output lines (:mod:`.output`), rank 0's rich
displays (:mod:`.displays`) and prompts answered through the notebook's stdin (:mod:`.stdin`).

The lowest layer of :mod:`nbtrain.kernel`: it knows only :mod:`nbtrain.wire`'s messages.
"""
