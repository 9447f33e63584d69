"""A telemetry :class:`~nbtrain.gpu.telemetry.Snapshot` as plain JSON values and back, each value checked.

A detached run's agent samples its ranks and GPUs as the dashboard would and records each sample in the run's
folder (:mod:`nbtrain.node.detached_telemetry`); a kernel that follows the run later draws them. The GPUs travel as
a heartbeat carries them (:meth:`~nbtrain.gpu.devices.GpuStatus.to_json`: their processes stay behind, the ranks'
own GPU memory is in their usage); reading back, a value of the wrong type reads N/A (:mod:`.jsonfields`), and a
sample without its time is no sample.
"""

from __future__ import annotations

from . import jsonfields as J
from .devices import GpuStatus
from .processes import HostStatus
from .telemetry import RankUsage, Snapshot

MAX_GPUS = 64
MAX_RANKS = 1024


def snapshot_to_json(snap: Snapshot) -> dict:
    return {"time": snap.time, "gpus": [gpu.to_json() for gpu in snap.gpus],
            "ranks": [J.plain(usage) for usage in snap.ranks], "host": J.plain(snap.host),
            "nvml_error": snap.nvml_error, "notes": list(snap.notes)}


def snapshot_from_json(data) -> Snapshot | None:
    """What :func:`snapshot_to_json` made; None where ``data`` is no sample (no dict, or no time)."""
    if not isinstance(data, dict) or (when := J.number(data.get("time"))) is None:
        return None
    gpus = tuple(g for g in map(GpuStatus.from_json, J.items(data.get("gpus"), MAX_GPUS) or []) if g is not None)
    ranks = tuple(r for r in map(_usage, J.items(data.get("ranks"), MAX_RANKS) or []) if r is not None)
    return Snapshot(when, gpus, ranks, _host(data.get("host")), J.text(data.get("nvml_error")),
                    J.texts(data.get("notes")) or ())


def _usage(data) -> RankUsage | None:
    if not isinstance(data, dict) or (rank := J.whole(data.get("rank"))) is None:
        return None
    return RankUsage(rank=rank, pid=J.whole(data.get("pid")) or 0, device=J.text(data.get("device")),
                     gpu_index=J.whole(data.get("gpu_index")), gpu_memory=J.whole(data.get("gpu_memory")),
                     cpu_percent=J.number(data.get("cpu_percent")), rss=J.whole(data.get("rss")),
                     alive=data.get("alive") is not False, mig_uuid=J.text(data.get("mig_uuid")))


def _host(data) -> HostStatus:
    data = data if isinstance(data, dict) else {}
    return HostStatus(cpu_percent=J.number(data.get("cpu_percent")), cpu_count=J.whole(data.get("cpu_count")) or 1,
                      memory_used=J.whole(data.get("memory_used")), memory_total=J.whole(data.get("memory_total")))
