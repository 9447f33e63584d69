"""Why a GPU is slow or failing, read through NVML: clocks and what holds them down, the PCIe link, ECC errors.

:func:`read_health` reads, for one GPU, what the dashboard's device panel and ``%gpus`` show beside load and
memory — the SM clock against its maximum and the current *clock event reasons* (power cap, thermal, sync
boost, …: why the clock is below its maximum), the PCIe link's generation and width against the board's
(a link trained at x4 of x16 starves the GPU) and its rx/tx throughput, and the volatile ECC error counts
(corrected; uncorrected ones mean the results may be wrong). Each value the driver cannot give is ``None``
(shown as N/A), never an error: consumer boards have no ECC, MIG instances no clocks of their own, some
drivers no PCIe counters. What the reader of the GPU learnt about a field it could not read travels in
:attr:`GpuHealth.unread` (said once under the panel, as a note). The reader (:class:`~nbtrain.gpu.devices.DeviceReader`)
adds the NVLink links and traffic (:mod:`nbtrain.gpu.fabric`), what the SMs did since its last read
(:mod:`nbtrain.gpu.gpm`) and, where it watches them, the Xid errors since it started (:mod:`nbtrain.gpu.xid`). :meth:`GpuHealth.to_json` / :meth:`GpuHealth.from_json` carry it in a
node's heartbeat, every field. The maxima never change and are read once per GPU, with the GPU's other fixed
facts (:class:`~nbtrain.gpu.nvml.GpuInfo`); the PCIe throughput, which NVML samples (62 ms a call on an
H200), only where the caller asks for it (:class:`~nbtrain.gpu.devices.DeviceReader`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from . import jsonfields as J
from . import nvml

# nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*): bit -> what it means, in words.
CLOCK_EVENT_REASONS = {
    0x1: "idle",
    0x2: "application clocks",
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake",
    0x100: "display clocks",
}
NOT_SLOWED = {"idle", "application clocks", "display clocks"}  # reasons that are no slowdown of a busy GPU
_CLOCK_SM, _PCIE_TX, _PCIE_RX, _CORRECTED, _UNCORRECTED, _VOLATILE = 1, 0, 1, 0, 1, 0


@dataclass(frozen=True)
class GpuHealth:
    sm_clock: int | None = None  # MHz
    sm_clock_max: int | None = None
    clock_reasons: tuple[str, ...] | None = None  # why the clock is held down now (CLOCK_EVENT_REASONS)
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None  # lanes
    pcie_width_max: int | None = None
    pcie_rx: int | None = None  # bytes/s received by the GPU
    pcie_tx: int | None = None  # bytes/s sent
    ecc_corrected: int | None = None  # volatile: since the driver loaded
    ecc_uncorrected: int | None = None
    nvlinks: int | None = None  # NVLink links up; None: no NVLink on the board (or not readable: see unread)
    nvlink_rx: int | None = None  # bytes/s over all links (None on the first sample: no baseline yet)
    nvlink_tx: int | None = None
    xid_errors: int | None = None  # Xid errors since the watcher started; None: not watched, or not readable
    xid_last: int | None = None  # the last Xid code
    sm_active: int | None = None  # GPM (nbtrain.gpu.gpm), % since the last read: SMs busy
    sm_occupancy: int | None = None  # warps resident, of the maximum
    tensor_active: int | None = None  # time any tensor core ran
    dram_bw: int | None = None  # DRAM bandwidth used, of the maximum
    unread: tuple[str, ...] = ()  # why fields read N/A, such as "NVLink: no NVLink (Not Supported)"

    @property
    def slowed_by(self) -> tuple[str, ...]:
        """The reasons that slow a busy GPU (power cap, thermal, …), without idle and clock settings."""
        return tuple(r for r in self.clock_reasons or () if r not in NOT_SLOWED)

    @property
    def pcie_degraded(self) -> bool:
        """The link runs narrower or at an older generation than the board's (an idle link may drop its
        generation to save power, so only the width counts alone)."""
        return bool(self.pcie_width and self.pcie_width_max and self.pcie_width < self.pcie_width_max)

    def to_json(self) -> dict:
        """Every field, JSON-safe (tuples as lists, None kept): how a node's heartbeat carries it."""
        return J.plain(self)

    @classmethod
    def from_json(cls, data) -> GpuHealth | None:
        """What :meth:`to_json` made, each field checked: one of the wrong type or size is None (N/A), a missing
        one None, an unknown one ignored (a newer agent's); None when ``data`` is no dict."""
        if not isinstance(data, dict):
            return None
        counts = {f.name: J.whole(data.get(f.name)) for f in fields(cls) if f.name not in _TEXTS}
        return cls(**counts, clock_reasons=J.texts(data.get("clock_reasons")), unread=J.texts(data.get("unread")) or ())


_TEXTS = ("clock_reasons", "unread")  # GpuHealth's fields that are lists of words; the others are counts


def reasons(mask: int | None) -> tuple[str, ...] | None:
    if mask is None:
        return None
    return tuple(name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit)


def read_health(lib, gpu: nvml.GpuInfo, throughput: tuple[int | None, int | None] | None = None,
                **read_elsewhere) -> GpuHealth:
    """What the driver says now about ``gpu``'s clocks, link and ECC; ``None`` for what it cannot say.
    ``throughput``: the PCIe (rx, tx) to report instead of asking (NVML samples it for about 20 ms);
    ``read_elsewhere``: the NVLink, Xid and ``unread`` fields, as the reader found them."""
    handle = gpu.handle
    event_reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    rx, tx = throughput if throughput is not None else read_throughput(lib, gpu)
    return GpuHealth(
        sm_clock=nvml.optional(lib, "nvmlDeviceGetClockInfo", handle, _CLOCK_SM),
        sm_clock_max=gpu.sm_clock_max,
        clock_reasons=reasons(nvml.query(event_reasons, handle, quiet=True)) if event_reasons else None,
        pcie_gen=nvml.optional(lib, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        pcie_gen_max=gpu.pcie_gen_max,
        pcie_width=nvml.optional(lib, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        pcie_width_max=gpu.pcie_width_max,
        pcie_rx=rx,
        pcie_tx=tx,
        ecc_corrected=nvml.optional(lib, "nvmlDeviceGetTotalEccErrors", handle, _CORRECTED, _VOLATILE),
        ecc_uncorrected=nvml.optional(lib, "nvmlDeviceGetTotalEccErrors", handle, _UNCORRECTED, _VOLATILE),
        **read_elsewhere,
    )


def read_throughput(lib, gpu: nvml.GpuInfo) -> tuple[int | None, int | None]:
    """PCIe bytes/s (received, sent) by ``gpu`` now."""
    return (_kib(nvml.optional(lib, "nvmlDeviceGetPcieThroughput", gpu.handle, _PCIE_RX)),
            _kib(nvml.optional(lib, "nvmlDeviceGetPcieThroughput", gpu.handle, _PCIE_TX)))


def _kib(value) -> int | None:
    return None if value is None else int(value) * 1024  # NVML counts PCIe throughput in KB/s


def describe(health: GpuHealth | None) -> str:
    """One line: ``SM 1980/1980 MHz · PCIe 5 x16/16 · in 1.20 GB/s out 0.10 GB/s · NVLink 18 up, in 12.00 GB/s out
    11.00 GB/s · ECC 0 corrected, 0 uncorrected · Xid 0 · slowed by power cap``."""
    if health is None:
        return ""
    h, na = health, "N/A"
    parts = [f"SM {_or(h.sm_clock, na)}/{_or(h.sm_clock_max, na)} MHz",
             f"PCIe {_or(h.pcie_gen, na)} x{_or(h.pcie_width, na)}/{_or(h.pcie_width_max, na)}"
             + (" (narrower than the board's)" if h.pcie_degraded else "")]
    if h.pcie_rx is not None or h.pcie_tx is not None:
        parts.append(f"in {_rate(h.pcie_rx)} out {_rate(h.pcie_tx)}")
    if h.nvlinks is not None:
        parts.append(f"NVLink {h.nvlinks} up, in {_rate(h.nvlink_rx)} out {_rate(h.nvlink_tx)}")
    else:
        parts.append("NVLink N/A" if any(r.startswith("NVLink") for r in h.unread) else "no NVLink")
    parts.append(f"ECC {_or(h.ecc_corrected, na)} corrected, {_or(h.ecc_uncorrected, na)} uncorrected")
    if h.xid_errors is not None:
        parts.append(f"Xid {h.xid_errors}" + (f" (last {h.xid_last})" if h.xid_errors else ""))
    elif any(reason.startswith("Xid") for reason in h.unread):
        parts.append("Xid N/A")
    if (activity := describe_activity(h)):
        parts.append(activity)
    if h.slowed_by:
        parts.append("slowed by " + ", ".join(h.slowed_by))
    return " · ".join(parts)


def describe_activity(health: GpuHealth | None) -> str:
    """``SM active 62 %, occupancy 40 %, tensor 41 %, DRAM 30 %`` from GPM; "" where the GPU has none (yet)."""
    if health is None:
        return ""
    named = (("SM active", health.sm_active), ("occupancy", health.sm_occupancy), ("tensor", health.tensor_active),
             ("DRAM", health.dram_bw))
    return ", ".join(f"{name} {value} %" for name, value in named if value is not None)


def _or(value, fallback: str):
    return fallback if value is None else value


def _rate(value: int | None) -> str:
    return "N/A" if value is None else f"{value / 1e9:.2f} GB/s"
