"""``--profile STEPS`` in a rank: a ``torch.profiler`` trace of a few training steps, and its summary.

With ``--profile`` the cell runs under :class:`torch.profiler.profile` on every rank, with the schedule
``wait, warmup, active`` (``--profile 3`` is 1, 1, 3): the first ``wait`` steps run as usual, ``warmup``
steps are profiled and thrown away (the profiler's own start-up), ``active`` steps are recorded. A step
ends at every optimizer step — a global ``Optimizer`` step hook, so any training loop counts without a
change — so the trace covers whole iterations.

When the recording ends, ``torch.profiler.tensorboard_trace_handler`` writes the rank's trace to
``DIR/rank<k>.<time>.pt.trace.json``: Chrome's trace format, which Perfetto (ui.perfetto.dev) and
``chrome://tracing`` open, named as TensorBoard's profiler plugin reads it. When the cell ends, the rank
sends a :class:`~nbtrain.wire.protocol.ProfileSummary`: its top operators by self time, and its time in
communication (collectives: gloo, NCCL and c10d operators) against everything else, for the table the
kernel prints (:mod:`nbtrain.kernel.diagnostics.profiling`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from collections.abc import Iterator

from ...wire.protocol import ProfileSummary

TOP_OPERATORS = 10
COMMUNICATION_WORDS = ("nccl", "gloo", "c10d::", "all_reduce", "allreduce", "all_gather", "allgather",
                       "broadcast", "reduce_scatter", "barrier", "all_to_all", "send", "recv")

_state: dict = {"profiler": None, "hook": None, "dir": None, "rank": 0, "steps": 0}


@contextlib.contextmanager
def scope(schedule: tuple[int, int, int] | None, trace_dir: str | None, rank: int, device, job_id: int,
          send) -> Iterator[None]:
    """Profile a cell if ``--profile`` asked for it; at its end the summary goes through ``send`` (a broken profiler
    must not lose the cell's reply: it is said, and the cell ends as it would have)."""
    _begin(schedule, trace_dir, rank, device)
    try:
        yield
    finally:
        try:
            summary = _end(job_id)
        except Exception as exc:
            print(f"nbtrain: the profiler failed ({exc!r})", file=sys.stderr)
        else:
            if summary is not None:
                send(summary)


def _begin(schedule: tuple[int, int, int] | None, trace_dir: str | None, rank: int, device) -> None:
    if schedule is None or trace_dir is None:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler
    from torch.profiler import schedule as make_schedule

    # Read when the profiler first starts. Kineto logs its errors at level 2 and, on every start and stop, a
    # "USDT: … profiler_start" line at level 5: 6 keeps the cell's stderr for the user's own output.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    wait, warmup, active = schedule
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if getattr(device, "type", "") == "cuda" else [])
    os.makedirs(trace_dir, exist_ok=True)
    profiler = profile(activities=activities, schedule=make_schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                       on_trace_ready=tensorboard_trace_handler(trace_dir, worker_name=f"rank{rank}"))
    profiler.start()

    def step(optimizer, args, kwargs) -> None:
        _state["steps"] += 1
        profiler.step()

    _state.update(profiler=profiler, hook=register_optimizer_step_post_hook(step), dir=trace_dir, rank=rank, steps=0)


def _end(job_id: int) -> ProfileSummary | None:
    """Stop profiling (writing the trace if the recording had begun); the summary for the kernel."""
    profiler, hook = _state["profiler"], _state["hook"]
    if profiler is None:
        return None
    _state.update(profiler=None, hook=None)
    hook.remove()
    profiler.stop()
    rank, trace_dir = _state["rank"], _state["dir"]
    traces = sorted(glob.glob(os.path.join(trace_dir, f"rank{rank}.*.pt.trace.json")), key=os.path.getmtime)
    try:
        events = profiler.key_averages()
    except (AssertionError, RuntimeError):  # nothing was recorded (fewer steps than the schedule's wait + warmup)
        events = []
    events = [e for e in events if not e.key.startswith("ProfilerStep")]  # the schedule's own step markers
    on_device = any((getattr(e, "self_device_time_total", 0) or 0) > 0 for e in events)
    operators = sorted(((e.key, e.count, _self_us(e, on_device)) for e in events), key=lambda row: -row[2])
    operators = [row for row in operators if row[2] > 0]
    communication = sum(us for name, _, us in operators if _is_communication(name))
    total = sum(us for _, _, us in operators)
    return ProfileSummary(job_id, rank, tuple(operators[:TOP_OPERATORS]), communication, total, _state["steps"],
                          traces[-1] if traces else None)


def _self_us(event, on_device: bool) -> float:
    """Self time in microseconds where the work is done: on the GPU when GPU kernels were recorded, else the CPU."""
    return float((getattr(event, "self_device_time_total", 0) or 0) if on_device else event.self_cpu_time_total)


def _is_communication(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in COMMUNICATION_WORDS)
