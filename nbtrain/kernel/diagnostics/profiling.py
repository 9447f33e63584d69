"""``--profile STEPS`` in the kernel: the option checked before any process starts, and the table after the run.

``--profile 3`` records 3 optimizer steps after 1 skipped and 1 warm-up step; ``--profile 2,1,5`` gives the
schedule as ``wait,warmup,active`` (:func:`parse_profile`). Each rank profiles itself
(:mod:`nbtrain.rank.train.profile`) and writes its trace into the profile directory: ``DIR/profile`` with
``--tensorboard DIR`` (where TensorBoard's profiler plugin looks), else ``profiles/`` in the notebook's
current directory (:func:`profile_dir`).

After the run, :func:`format_profile` turns the ranks' :class:`~nbtrain.wire.protocol.ProfileSummary`
into the lines printed under the cell: a table of the top operators by self time, one column per rank,
then each rank's time in communication against compute, and where the traces are.
"""

from __future__ import annotations

import os

from ...wire.protocol import ProfileSummary

DEFAULT_WAIT, DEFAULT_WARMUP = 1, 1
TABLE_ROWS = 8
NAME_WIDTH = 36


class ProfileOptionError(ValueError):
    """``--profile`` is not ``N`` or ``WAIT,WARMUP,ACTIVE``."""


def parse_profile(text: str) -> tuple[int, int, int]:
    """``"3"`` → (1, 1, 3); ``"2,1,5"`` → (2, 1, 5)."""
    parts = [part.strip() for part in text.split(",")]
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        numbers = []
    if len(numbers) == 1:
        numbers = [DEFAULT_WAIT, DEFAULT_WARMUP, numbers[0]]
    if len(numbers) != 3 or min(numbers) < 0 or numbers[2] < 1:
        raise ProfileOptionError(f"--profile takes the number of steps to record, such as --profile 3, or "
                                 f"WAIT,WARMUP,ACTIVE steps, such as --profile 1,1,3 (got {text!r}).")
    wait, warmup, active = numbers
    return wait, warmup, active


def profile_dir(cwd: str, tensorboard_dir: str | None) -> str:
    """Where the ranks write their traces."""
    return os.path.join(tensorboard_dir, "profile") if tensorboard_dir else os.path.join(cwd, "profiles")


def format_profile(summaries: dict[int, ProfileSummary]) -> list[str]:
    """The lines shown after a profiled run (none without summaries)."""
    if not summaries:
        return []
    ranks = sorted(summaries)
    if not any(s.total_us for s in summaries.values()):
        steps = max(s.steps for s in summaries.values())
        return [f"nbtrain: profile: nothing was recorded: the cell made {steps} optimizer step(s), fewer than the "
                "schedule skips and warms up (--profile WAIT,WARMUP,ACTIVE)"]
    times: dict[str, dict[int, float]] = {}
    for rank, summary in summaries.items():
        for name, _, us in summary.operators:
            times.setdefault(name, {})[rank] = us
    top = sorted(times, key=lambda name: -max(times[name].values()))[:TABLE_ROWS]
    header = f"{'operator (self time, ms)':<{NAME_WIDTH}}" + "".join(f"{'rank ' + str(r):>10}" for r in ranks)
    lines = ["nbtrain: profile of the recorded steps", header]
    for name in top:
        label = name if len(name) <= NAME_WIDTH - 2 else name[:NAME_WIDTH - 3] + "…"
        cells = "".join(f"{times[name][r] / 1000:>10.2f}" if r in times[name] else f"{'-':>10}" for r in ranks)
        lines.append(f"{label:<{NAME_WIDTH}}{cells}")
    for rank in ranks:
        s = summaries[rank]
        share = 100 * s.communication_us / s.total_us if s.total_us else 0.0
        lines.append(f"rank {rank}: communication {s.communication_us / 1000:.2f} ms ({share:.0f} %), "
                     f"compute {(s.total_us - s.communication_us) / 1000:.2f} ms")
    folders = sorted({os.path.dirname(s.trace_file) for s in summaries.values() if s.trace_file})
    if folders:
        lines.append(f"traces (Chrome/Perfetto, TensorBoard): {', '.join(folders)}")
    return lines
