"""What a group of ranks yields to the run (``poll_events``): one small union, the same from local and remote ranks.

Local ranks' events come from their pipes (:mod:`.procs`) and their channel (:mod:`.channel`); a ``--nodes``
group (:mod:`nbtrain.kernel.cluster.group`) makes the same ones from its agents' messages. The run takes each through
one dispatcher (:meth:`nbtrain.kernel.lifecycle.run._Run.take`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Output:
    """A piece of a rank's stdout or stderr, as it came."""

    rank: int
    stream: str  # "stdout" | "stderr"
    text: str


@dataclass(frozen=True)
class Exited:
    """A rank's process ended."""

    rank: int
    code: int  # negative: killed by that signal


@dataclass(frozen=True)
class Message:
    """A rank's message to the kernel (:mod:`nbtrain.wire.protocol`), received on its authenticated channel."""

    rank: int
    message: object


@dataclass(frozen=True)
class Sampled:
    """The run's load as its agent sampled it (a :class:`~nbtrain.gpu.telemetry.Snapshot`): only from a detached
    run's record (:mod:`nbtrain.kernel.cluster.recorded`), which holds no live process of this kernel to sample."""

    snapshot: object


RankEvent = Output | Exited | Message | Sampled
