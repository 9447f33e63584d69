"""What a finished run brings back to the notebook: rank 0's names, and the :class:`RunResult` of the run."""

from __future__ import annotations

from ...wire.payload import Results, unpack_results
from ..observers.coldstart import ColdStart
from ..observers.history import RunResult


def bring_back(run, seconds: float) -> RunResult:
    """A finished run's result: rank 0's names unpacked into the notebook's namespace, and what the run measured.
    ``run``: the run's loop (:class:`~.run._Run`)."""
    warm, deleted = run.warm, run.cell.deleted
    # rank 0's; under --ft, with rank 0's group lost, the first rank of the first group that finished
    results = next((run.done[r].results for r in sorted(run.done) if isinstance(run.done[r].results, Results)), None)
    values, skipped = unpack_results(results, run.inputs.arena.originals) if results is not None else ({}, {})
    if results is not None and results.missing:
        skipped.update({name: "not defined on rank 0 when the cell ended" for name in results.missing
                        if name not in deleted})
    run.cell.namespace.update(values)
    return RunResult(
        returned=tuple(values), skipped=skipped,
        moved_to_cpu=tuple(results.moved_to_cpu) if results is not None else (),
        seconds=seconds, rank_seconds={r: d.seconds for r, d in sorted(run.done.items())},
        devices=run.pool.devices, warm=warm, backend=run.pool.spec.backend, history=run.history, notes=list(run.inputs.notes),
        profiles=run.profiles, setup=run.setup, cold_start=None if warm else _cold_start(run),
        shared_bytes=run.inputs.arena.written, pack_seconds=run.inputs.seconds, metering=run.metering)


def _cold_start(run) -> ColdStart | None:
    start = run.pool.local_start()  # ranks on this machine only (one clock)
    return None if start is None else run.marks.split(start.started_at, start.forked, run.nprocs)
