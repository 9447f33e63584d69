"""Background cells: ``%%distributed --background`` returns at once with a handle while its ranks train.

* :mod:`.handle` — :class:`~.handle.BackgroundRun`: ``state``, ``wait()``, ``stop()``, ``result``, ``history``;
* :mod:`.runner` — :class:`~.runner.BackgroundRuns`: checks the cell, runs it in a thread whose output goes to
  the cell that started it, on ranks of its own;
* :mod:`.arrivals` — the names a run assigned reach the notebook between two cells (or in ``wait()``), and a cell
  that reads them too early is warned.
"""

from .handle import BackgroundRun
from .runner import BackgroundCell, BackgroundRuns

__all__ = ["BackgroundCell", "BackgroundRun", "BackgroundRuns"]
