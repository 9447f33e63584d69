"""Training inside a ``%%distributed`` cell: prepare(), AMP, gradient accumulation, checkpoints, nbtrain.log,
MFU (see docs/training.md).

Rank side: it imports :mod:`nbtrain.wire`, :mod:`nbtrain.gpu`'s peak table and nothing of the kernel. Inside,
the imports run one way, from the floor up::

    settings (wire) · amp · accumulate · reduce · metrics (nbtrain.log) · flops (one step's FLOPs)
    stepmeter (step rate, MFU, data wait)
    state (the cell's TrainContext: begin, end, current)
    checkpoint · steps (nbtrain.backward, clip_grad_norm_, autocast)
    preempt_checkpoint (a notice's checkpoint at the next step boundary)
    data · optim
    prepare

``tests/test_layering.py`` checks that no two of them import each other, even inside a function.
"""
