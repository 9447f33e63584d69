"""Training inside a ``%%distributed`` cell: prepare(), AMP, gradient accumulation, checkpoints, nbtrain.log
(see docs/training.md).

Rank side: it imports :mod:`nbtrain.wire` and nothing of the kernel side. Inside, the imports run one
way, from the floor up::

    settings (wire) · amp · accumulate · reduce
    state (the cell's TrainContext: begin, end, current) · metrics (nbtrain.log)
    checkpoint · steps (nbtrain.backward, clip_grad_norm_, autocast)
    preemption (a notice's checkpoint at the next step boundary)
    data · optim
    prepare

``tests/test_layering.py`` checks that no two of them import each other, even inside a function.
"""
