"""The names every rank provides to a cell: ``rank``, ``local_rank``, ``world_size``, ``device``.

A rank sets them in each cell's fresh ``__main__`` (:mod:`nbtrain.rank.main`), so the kernel neither
sends the notebook's variables of those names nor brings them back (:mod:`nbtrain.kernel.request.cell`), and a
rank never lets an input overwrite them. Both sides read this one set.
"""

RUNTIME_NAMES = frozenset({"rank", "local_rank", "world_size", "device"})
