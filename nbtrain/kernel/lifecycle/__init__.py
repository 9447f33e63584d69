"""A run from the cell to its outcome: the entry point that checks everything then runs (:mod:`.entry`), one
cell on a rank group (:mod:`.run`), runs again after a rank died (:mod:`.restarts`), the sessions that keep
pools warm (:mod:`.sessions`), the stop button (:mod:`.stopping`) and what is said while ranks are missing
(:mod:`.waiting`). The top layer of :mod:`nbtrain.kernel`: it may import every other sub-package.
"""
