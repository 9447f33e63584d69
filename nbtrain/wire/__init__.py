"""What the kernel and its ranks share: the messages, the payload format, shared memory, the settings.

nbtrain runs in two kinds of process, and each side imports this package, never the other side::

    kernel side (the notebook's kernel)          rank side (python -m nbtrain.rank)
    magics, launch, dashboard, server            worker, train
                    │                                     │
                    └────────────►  wire  ◄───────────────┘

* :mod:`.protocol` — the messages on each rank's socket (``Hello`` … ``Job`` … ``Done`` / ``Failed``);
* :mod:`.payload` — inputs pickled once for all ranks, rank 0's results back;
* :mod:`.shm` — large tensors and arrays through ``/dev/shm`` files, both ways, never leaked;
* :mod:`.options` — how an option is declared once, on a dataclass field (flag, help, environment variable);
* :mod:`.settings` — the training options (:class:`~nbtrain.wire.settings.TrainOptions`) and the
  :class:`~nbtrain.wire.settings.TrainSettings` made from them: checked in the kernel, sent in each Job, and
  read from ``NBTRAIN_*`` variables by a rank started outside a cell, through the same declarations;
* :mod:`.names` — the names a rank provides to a cell (``rank``, ``world_size``, ``device`` …);
* :mod:`.workdir` — how a rank builds its ``sys.path`` from the Job, a rule the kernel applies too.

Nothing here imports the kernel side or the rank side (``tests/test_layering.py`` checks it), and
importing any of it imports nothing heavy: torch is imported where a tensor is actually handled.
"""
