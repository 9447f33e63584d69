"""Time to first step, explained: a cold start split into what it was spent on.

A cell on new ranks waits for: the **process start** (a fork of the zygote, or a new interpreter), the
**imports** (torch and nbtrain's rank side; a forked rank has them already, less what the notebook imported
since the zygote started), the **rendezvous** (joining the kernel's store), the **communicator set-up** (the
default process group: gloo's connections, NCCL's communicator), the **job's names arriving** (the job sent
once every rank connected, its inputs unpickled and their shared-memory pages mapped in, so the inputs' transfer
is not counted in the first step) and the **cell's first step** (its first optimizer step;
a cell without one: the whole cell).

:class:`StartMarks` collects when each rank passed each point — its own :class:`~nbtrain.wire.protocol.StartTimes`
(in its ``Ready``), when the kernel got its ``Loaded``, its ``Done``'s first step — and :meth:`StartMarks.split`
turns them into a :class:`ColdStart`: the phases of the rank that reached its first step last (the one the
cell waited for), which add up to the whole. Only ranks on this machine are split (one clock).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

PHASES = ("process start", "imports", "rendezvous", "communicator", "names arrive", "first step")


def latency(seconds: float) -> str:
    """``40 ms``, ``0.17 s``, ``5.8 s``, ``95 s``: a start's times run from milliseconds (forked ranks) to minutes
    (spawned ranks on a busy machine), and "0.0 s" would say nothing about the first."""
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 1:
        return f"{seconds:.2f} s"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


@dataclass(frozen=True)
class ColdStart:
    how: str  # "forked" | "spawned" | "forked and spawned"
    phases: tuple[tuple[str, float], ...]  # (PHASES name, seconds), in order
    total_s: float
    rank: int  # whose phases these are: the last to reach its first step
    stepped: bool = True  # False: the cell took no optimizer step (the last phase is the whole cell)

    def seconds(self, phase: str) -> float:
        return dict(self.phases).get(phase, 0.0)

    def line(self) -> str:
        end = "" if self.stepped else " (the cell took no optimizer step: its end)"
        parts = " · ".join(f"{name} {latency(seconds)}" for name, seconds in self.phases)
        return f"cold start {latency(self.total_s)} to the first step{end}, {self.how}: {parts}"


@dataclass
class StartMarks:
    """What the run heard while its ranks started (fed by the run's loop; see the module docstring)."""

    ready: dict = field(default_factory=dict)  # rank -> StartTimes
    loaded: dict[int, float] = field(default_factory=dict)  # rank -> time.time() the kernel got its Loaded
    ended: dict[int, tuple[float, bool]] = field(default_factory=dict)  # rank -> (first step or Done, stepped)

    def on_ready(self, rank: int, times) -> None:
        if times is not None:
            self.ready[rank] = times

    def on_loaded(self, rank: int) -> None:
        self.loaded.setdefault(rank, time.time())

    def on_done(self, rank: int, first_step: float | None) -> None:
        self.ended[rank] = (first_step, True) if first_step is not None else (time.time(), False)

    def split(self, started_at: float, forked: dict[int, float], nprocs: int) -> ColdStart | None:
        """The cold start of ranks started at ``started_at`` (``forked``: rank -> the zygote's import seconds)."""
        ranks = [r for r in range(nprocs) if r in self.ready and r in self.loaded and r in self.ended]
        if not started_at or len(ranks) != nprocs:
            return None
        last = max(ranks, key=lambda r: self.ended[r][0])
        t, end, imports_before = self.ready[last], self.ended[last], forked.get(last, 0.0)
        marks = [started_at, t.launched - imports_before, t.imported, t.joined, t.built, self.loaded[last], end[0]]
        if last in forked:  # the zygote imported for it before forking: its imports come before its process
            marks[1:3] = [started_at + imports_before, t.launched]
            phases = [PHASES[1], PHASES[0], *PHASES[2:]]
        else:
            phases = list(PHASES)
        durations = [max(0.0, b - a) for a, b in itertools.pairwise(marks)]
        ordered = dict(zip(phases, durations, strict=True))
        how = "forked" if len(forked) == nprocs else "spawned" if not forked else "forked and spawned"
        return ColdStart(how, tuple((name, ordered[name]) for name in PHASES), max(0.0, end[0] - started_at), last,
                         stepped=end[1])
