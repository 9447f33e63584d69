"""Explaining a run: a rank's failure mapped to the cell's lines (:mod:`.failures`), where each rank is
(:mod:`.stacks`), uneven collectives (:mod:`.mismatch`), the bottleneck advisor (:mod:`.advisor`), what
``prepare()`` set up (:mod:`.setup_facts`) and the ``--profile`` table (:mod:`.profiling`).

Only :mod:`nbtrain.kernel.relay` and :mod:`nbtrain.kernel.observers` sit below it: it reads what happened, and
never imports the request, the ranks or the run.
"""
