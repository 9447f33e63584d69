"""What a GPU's SMs actually did, from NVML's GPU Performance Monitoring (GPM; Hopper and later).

NVML's "utilization" is the share of time *any* kernel ran: one small kernel at a time on one SM reads 100 %.
GPM counts what the hardware did between two samples: the share of SMs busy (*SM active*), of warps resident
against the maximum (*SM occupancy*), of time any tensor core ran (*tensor active*), and of the DRAM bandwidth
used (*DRAM bandwidth*). :class:`GpmSampler` keeps one sample per GPU and, at each read, takes a new one and asks
NVML for the metrics between the two (``nvmlGpmSampleGet`` / ``nvmlGpmMetricsGet``): the first read of a GPU has
no baseline yet and gives no values. A GPU without GPM (before Hopper, a VM that hides it, bindings that lack
it) reads N/A with the reason, once, in :attr:`~nbtrain.gpu.health.GpuHealth.unread`; under MIG the whole GPU is
not sampled (its instances are apart). Values are whole percents, so they travel in a heartbeat as the other
health counts do.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import nvml

# field name -> NVML_GPM_METRIC_* id (nvidia-ml-py's constants; written out so that older bindings still import)
METRICS = {"sm_active": 2, "sm_occupancy": 3, "tensor_active": 5, "dram_bw": 10}
SUCCESS = 0


@dataclass
class _Slot:
    """One GPU's samples: the last one taken (the baseline) and a spare that the next read fills."""

    baseline: object
    spare: object


class GpmSampler:
    """GPM metrics per GPU between consecutive reads (see the module docstring); owned by a DeviceReader."""

    def __init__(self) -> None:
        self._slots: dict[int, _Slot] = {}
        self._why: dict[int, str] = {}  # GPUs that have no GPM, and why

    def read(self, lib, gpu: nvml.GpuInfo) -> tuple[dict[str, int | None], str]:
        """The metrics since the last read of ``gpu`` (None each on the first), and why there are none ("" if any)."""
        empty = dict.fromkeys(METRICS)
        if gpu.index not in self._why:  # the first read: the baseline is taken now, the metrics come next time
            self._why[gpu.index] = self._start(lib, gpu)
            return empty, f"GPM: {self._why[gpu.index]}" if self._why[gpu.index] else ""
        if self._why[gpu.index]:
            return empty, f"GPM: {self._why[gpu.index]}"
        slot = self._slots[gpu.index]
        try:
            lib.nvmlGpmSampleGet(gpu.handle, slot.spare)
            values = _metrics_between(lib, slot.baseline, slot.spare)
        except Exception as exc:  # NVMLError: said as why, the next read tries again from a fresh baseline
            return empty, f"GPM: {exc}"
        finally:
            slot.baseline, slot.spare = slot.spare, slot.baseline
        return values, ""

    def _start(self, lib, gpu: nvml.GpuInfo) -> str:
        """Allocate ``gpu``'s samples and take its first; the reason it has no GPM, or ""."""
        if gpu.mig:
            return "not read for a GPU in MIG mode (its instances are sampled apart)"
        if getattr(lib, "nvmlGpmQueryDeviceSupport", None) is None:
            return "these NVML bindings have no GPM (nvidia-ml-py 12.535 or later has)"
        try:
            if not lib.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
                return "this GPU has none (GPM needs Hopper or later)"
            slot = _Slot(lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc())
            self._slots[gpu.index] = slot
            lib.nvmlGpmSampleGet(gpu.handle, slot.baseline)
        except Exception as exc:  # Not Supported (a VM), No Permission
            return f"not readable ({exc})"
        return ""

    def close(self, lib) -> None:
        """Free every sample (NVML allocates them)."""
        slots, self._slots = self._slots, {}
        for slot in slots.values():
            for sample in (slot.baseline, slot.spare):
                nvml.query(lib.nvmlGpmSampleFree, sample, quiet=True)


def _metrics_between(lib, first, second) -> dict[str, int | None]:
    """NVML's metrics between two samples, as whole percents (None where NVML could not compute one)."""
    request = lib.c_nvmlGpmMetricsGet_t()
    request.version = getattr(lib, "NVML_GPM_METRICS_GET_VERSION", 1)
    request.numMetrics = len(METRICS)
    request.sample1, request.sample2 = first, second
    for position, metric in enumerate(METRICS.values()):
        request.metrics[position].metricId = metric
    lib.nvmlGpmMetricsGet(request)
    values: dict[str, int | None] = {}
    for position, name in enumerate(METRICS):
        answer = request.metrics[position]
        values[name] = round(min(max(answer.value, 0.0), 100.0)) if answer.nvmlReturn == SUCCESS else None
    return values
