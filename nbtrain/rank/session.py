"""Sessions, rank side: a namespace per session name, kept between jobs (``%%distributed --session NAME``).

A plain job runs in a fresh ``__main__`` module that is dropped afterwards. A job that names a session runs
in the module this rank keeps for that session: the first job creates it (with the runtime names, as a fresh
one has them), later jobs find the model, the optimizer and the loader the earlier cells left there, on the
same device and with the process group still up. The notebook's inputs are set into it as into a fresh one.

A cell that fails must not cost the user the session: before the job its bindings are copied (a shallow
copy of the module's dict, no object is copied), and when the job fails they are put back, so every name
is bound again to what it was before the cell — names the cell added are gone, names it rebound are
restored. Objects the cell changed in place before failing (a model trained for a few steps) stay changed;
copying them would cost what sessions exist to avoid. The dict itself is kept, not replaced, because
functions defined in earlier cells read their globals from it.

After a session's job the rank reports what the session holds (name and type of each name) and, where
CUDA is initialised, the GPU memory its tensors take, so the kernel can list sessions without asking.
``CloseSession`` drops the module; the worker then collects garbage and empties the CUDA cache.

Each session also keeps ``nbtrain.log()``'s step counters after its last job, and its next job starts
from them: the session's cells log one curve (cell 2's first ``loss`` is the step after cell 1's last).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable

from ..wire import protocol as P
from ..wire.names import RUNTIME_NAMES


class RankSessions:
    """The namespaces this rank keeps, by session name, and the bindings of the job running in one."""

    def __init__(self) -> None:
        self._modules: dict[str, types.ModuleType] = {}
        self._before: dict | None = None
        self._steps: dict[str, dict[str, int]] = {}  # session -> nbtrain.log()'s step counters after its last job

    def step_counters(self, job: P.Job) -> dict[str, int]:
        """Where ``job``'s logged series start: its session's counters (a plain job: none, from 0)."""
        return dict(self._steps.get(job.session, {})) if job.session else {}

    def keep_step_counters(self, job: P.Job, counters: dict[str, int]) -> None:
        if job.session and job.session in self._modules:
            self._steps[job.session] = dict(counters)

    def enter(self, job: P.Job, fresh: Callable[[], types.ModuleType]) -> types.ModuleType:
        """The module ``job`` runs in: its session's (created by ``fresh`` the first time), else ``fresh()``."""
        self._before = None
        if not job.session:
            return fresh()
        module = self._modules.get(job.session)
        if module is None:
            module = self._modules[job.session] = fresh()
        self._before = dict(module.__dict__)  # bindings only: put back if the job fails
        return module

    def leave(self, job: P.Job, module: types.ModuleType, reply, torch):
        """After the job: a failure's bindings rolled back; a success's reply says what the session holds."""
        before, self._before = self._before, None
        if not job.session or before is None:
            return reply
        if isinstance(reply, P.Failed):
            module.__dict__.clear()
            module.__dict__.update(before)
            return reply
        if isinstance(reply, P.Done):
            return dataclasses.replace(reply, held=held_names(module.__dict__), gpu_bytes=_gpu_bytes(torch))
        return reply

    def close(self, name: str) -> None:
        module = self._modules.pop(name, None)
        self._steps.pop(name, None)
        if module is not None:
            module.__dict__.clear()  # cells' functions refer to this dict: empty it, not only forget it


def held_names(ns: dict) -> tuple[tuple[str, str], ...]:
    """(name, type name) of the names a session holds, less the runtime's and dunder names."""
    return tuple((name, type(value).__name__) for name, value in ns.items()
                 if name not in RUNTIME_NAMES and name != "display" and not name.startswith("__"))


def _gpu_bytes(torch) -> int | None:
    if not torch.cuda.is_initialized():  # never start CUDA to measure it
        return None
    return int(torch.cuda.memory_allocated())
