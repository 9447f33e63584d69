"""What a GPU is made of and joined by, read through NVML: its NVLink links and their traffic, its MIG instances.

* **NVLink**: the links in the active state are counted once per GPU (``nvmlDeviceGetNvLinkState`` per link,
  up to the first link the board does not have), on the first read of the GPU; a board without NVLink answers
  "Not Supported" for link 0 (shown as "no NVLink"); any other error is the reason given for N/A. The traffic is NVML's throughput
  counters summed over all links (field values ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX``/``_TX``, scope
  ``UINT_MAX``, KiB since the driver loaded, one call per GPU per sample): :class:`NvLinkRates` turns two
  readings into bytes/s, so the first sample reads N/A, as a rank's CPU % does.
* **MIG**: a GPU in MIG mode is split into instances, each with its own memory and UUID (``MIG-…``). They are
  enumerated once (``nvmlDeviceGetMaxMigDeviceCount`` slots, ``nvmlDeviceGetMigDeviceHandleByIndex`` for each
  occupied one); their memory is read each sample (:func:`read_mig_devices`), and the processes NVML lists on
  an instance map ranks to it (:class:`MigDevice`'s ``pids``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import jsonfields as J
from . import nvml

NVLINK_RX, NVLINK_TX = 139, 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX / _TX, in KiB
ALL_LINKS = 0xFFFFFFFF  # a field value's scope: summed over every link
MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of the bindings that lack the constant
ENABLED = 1  # NVML_FEATURE_ENABLED: the link is up


def nvlink_links(lib, handle) -> tuple[int | None, str | None]:
    """(links up, None); (None, None) for a board without NVLink; (None, why) when NVML cannot say."""
    state = getattr(lib, "nvmlDeviceGetNvLinkState", None)
    if state is None:
        return None, "these NVML bindings cannot read NVLink"
    up = 0
    for link in range(getattr(lib, "NVML_NVLINK_MAX_LINKS", MAX_LINKS)):
        try:
            up += state(handle, link) == ENABLED
        except Exception as exc:  # NotSupported: no NVLink at all; InvalidArgument: past the board's last link
            if link == 0:
                absent = isinstance(exc, getattr(lib, "NVMLError_NotSupported", ()))
                return None, None if absent else f"NVML could not read link 0 ({exc})"
            break
    return up, None


class NvLinkRates:
    """Bytes/s received and sent over one GPU's NVLinks, from NVML's counters between two samples."""

    def __init__(self) -> None:
        self._last: tuple[float, float, float] | None = None  # (seconds, rx KiB, tx KiB)
        self.reason: str | None = None  # why the counters cannot be read, once known

    def read(self, lib, handle) -> tuple[int | None, int | None]:
        fn = getattr(lib, "nvmlDeviceGetFieldValues", None)
        if fn is None:
            self.reason = "these NVML bindings cannot read NVLink counters"
            return None, None
        values = nvml.query(fn, handle, [(NVLINK_RX, ALL_LINKS), (NVLINK_TX, ALL_LINKS)], quiet=True)
        if values is None or any(v.nvmlReturn for v in values):
            self.reason = "the driver does not count NVLink traffic"
            return None, None
        now = (values[0].timestamp / 1e6, float(values[0].value.ullVal), float(values[1].value.ullVal))
        last, self._last = self._last, now
        if last is None or now[0] <= last[0]:
            return None, None
        seconds = now[0] - last[0]
        return (int(max(0.0, now[1] - last[1]) * 1024 / seconds), int(max(0.0, now[2] - last[2]) * 1024 / seconds))


@dataclass(frozen=True)
class MigSlot:
    """A MIG instance as enumerated: fixed while the kernel lives."""

    index: int  # its slot on the GPU
    uuid: str  # "MIG-…"
    memory_total: int | None
    handle: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance at one moment: its own device, with its memory and the processes NVML lists on it."""

    index: int
    uuid: str
    memory_used: int | None
    memory_total: int | None
    pids: tuple[int, ...] = ()

    def to_json(self) -> dict:
        """Its fields, JSON-safe: how a node's heartbeat carries it."""
        return J.plain(self)

    @classmethod
    def from_json(cls, data) -> MigDevice | None:
        """What :meth:`to_json` made, each field checked (a wrong one reads N/A); None without a slot and a UUID,
        which tell an instance apart."""
        if not isinstance(data, dict):
            return None
        index, uuid = J.whole(data.get("index")), J.text(data.get("uuid"))
        if index is None or uuid is None:
            return None
        return cls(index, uuid, J.whole(data.get("memory_used")), J.whole(data.get("memory_total")),
                   J.wholes(data.get("pids")) or ())


def mig_slots(lib, handle) -> tuple[MigSlot, ...]:
    """The MIG instances of a GPU in MIG mode (read once); () when there are none or NVML cannot say."""
    count = nvml.optional(lib, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    slots = []
    for index in range(count):
        instance = nvml.optional(lib, "nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
        if instance is None:  # an empty slot: NotFound
            continue
        memory = nvml.memory_info(lib, instance, quiet=True)
        slots.append(MigSlot(index, nvml.text(nvml.optional(lib, "nvmlDeviceGetUUID", instance) or ""),
                             getattr(memory, "total", None), instance))
    return tuple(slots)


def read_mig_devices(lib, slots: tuple[MigSlot, ...]) -> tuple[MigDevice, ...]:
    devices = []
    for slot in slots:
        memory = nvml.memory_info(lib, slot.handle, quiet=True)
        listed = nvml.optional(lib, "nvmlDeviceGetComputeRunningProcesses", slot.handle) or ()
        devices.append(MigDevice(slot.index, slot.uuid, getattr(memory, "used", None),
                                 slot.memory_total if slot.memory_total is not None else getattr(memory, "total", None),
                                 tuple(int(p.pid) for p in listed)))
    return tuple(devices)


# nvmlGpuTopologyLevel_t: how far apart two GPUs are, nearest first (NVLink counts as nearest, NVML's own level 0)
TOPOLOGY_FAR = 60  # unknown: as far as two GPUs on one machine can be (NVML's SYSTEM is 50)


def topology_distance(lib, first, second) -> int:
    """How close two GPUs (NVML handles) are: 0 on one board, 10 under one PCIe switch, 20 under several, 30 on one
    host bridge, 40 on one NUMA node, 50 across the system (NVML's common ancestor); NVLink between them counts as
    0. Unknown (no topology, a VM): :data:`TOPOLOGY_FAR`."""
    if nvml.optional(lib, "nvmlDeviceGetP2PStatus", first, second, getattr(lib, "NVML_P2P_CAPS_INDEX_NVLINK", 3)) == 0:
        return 0  # NVML_P2P_STATUS_OK over NVLink
    level = nvml.optional(lib, "nvmlDeviceGetTopologyCommonAncestor", first, second)
    return TOPOLOGY_FAR if level is None else int(level)
