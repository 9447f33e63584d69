"""Following a run without knowing its loop: the observer interface and the run's states (:mod:`.events`), and
what observes — the kernel's record of every logged series (:mod:`.history`), the run registry that the
JupyterLab panel reads (:mod:`.registry`), this kernel's table of runs (:mod:`.runlog`) and the experiment
trackers (:mod:`.trackers`). The dashboard (:mod:`nbtrain.kernel.dashboard`) is another observer.

Of the launch sub-packages it imports only :mod:`nbtrain.kernel.relay` (nothing of the run, the ranks or the request).
"""
