"""One cell's run, as one object: what :func:`~.entry.run_source` checked and decided, handed down whole.

:func:`~.entry.run_source` builds a :class:`CellRun` once from the request; every step after it — holding the
checkpoint folder, packing the inputs, the restarts, the loop on the ranks, bringing the results back — takes
the object instead of the same nine values passed from function to function. A restart is the same cell run
again (:meth:`CellRun.again`): resuming from its checkpoint, heard by the restart's own followers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..observers.events import RunObserver
from ..observers.history import RunOutcome
from ..request.cell import CellInfo
from ..request.config import LaunchConfig
from .pools import PoolManager


@dataclass(frozen=True)
class CellRun:
    """A checked cell and everything its run needs (see the module docstring)."""

    info: CellInfo  # the cell's source, what it reads and assigns, its line offset
    config: LaunchConfig  # the resolved options
    namespace: dict  # the notebook's: its inputs come from here, rank 0's results go back here
    manager: PoolManager  # the kernel's pools (a throwaway one when the caller gave none)
    write: Callable[[str, str], None]  # (stream, text) into the cell
    outcome: RunOutcome  # receives what was logged, however the run ends
    observers: tuple[RunObserver, ...] = ()
    code_name: Callable | None = None  # IPython's name for the cell's code, for tracebacks
    names: tuple[str, ...] = ()  # the notebook's names the ranks get
    stop: threading.Event | None = None  # set from elsewhere, it stops the run as the stop button does

    def again(self, restart: int, observers) -> CellRun:
        """The same cell after a lost rank or node (``restart`` of ``--max-restarts``): it resumes from its
        checkpoint, heard by ``observers``."""
        train = replace(self.config.train, resume=True, restart=restart)
        return replace(self, config=replace(self.config, train=train), observers=tuple(observers))

    @property
    def deleted(self) -> tuple[str, ...]:
        """Names the cell's own ``del`` removed: not said missing when they do not come back."""
        return tuple(self.info.deletes) if self.config.out_names is None else ()
