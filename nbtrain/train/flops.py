"""Model FLOPs utilisation (MFU): the FLOPs of one optimizer step, counted once, over the time steps take.

**The count.** torch's :class:`~torch.utils.flop_counter.FlopCounterMode` — the matrix products and
convolutions of forward and backward, the FLOPs MFU is defined by (PaLM's appendix, torchtitan) — runs
from the first training forward of a prepared model to the end of the first optimizer step: one whole
step, accumulation window included, once per cell (a dispatch mode slows every op it sees, so no more).
Not counted, and said so: compiled models (the mode cannot look inside a compiled graph) and models
sharded with ``--shard`` (FSDP2's DTensors); a forward without gradients (evaluation) never starts it.

**The rate.** Wall time between optimizer steps, summed over windows of at least :data:`REPORT_S` seconds:
on a GPU the host waits for the device once its launch queue is full, so over a window the host's step
time is the device's. Rank 0 logs ``tflops`` (achieved per GPU, or per process on the CPU) and, where the
GPU's dense peak for the precision in use is known (:mod:`nbtrain.gpu.peaks`), ``mfu`` in percent — series
in ``history`` and the live chart like any ``nbtrain.log`` value. At the cell's end every rank sends its
mean (or why it has none) as a :class:`~nbtrain.wire.protocol.Setup` fact for the summary's first line —
only after a cell that trained: no optimizer step, no word of MFU.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..gpu.peaks import dense_peak_tflops
from . import metrics

REPORT_S = 2.0  # how often rank 0 logs tflops / mfu


class StepFlops:
    """One cell's FLOP count and step rate on one rank (owned by its TrainContext)."""

    def __init__(self, rank: int, precision: str, peak_tflops: float | None, on_cpu: bool) -> None:
        self.rank, self.precision, self.peak_tflops, self.on_cpu = rank, precision, peak_tflops, on_cpu
        self.per_step: int | None = None  # FLOPs of one optimizer step, once counted
        self.uncounted: str | None = None  # why there is no count
        self._mode: FlopCounterMode | None = None
        self._window: tuple[float, int] | None = None  # (started, steps) of the current report window
        self._total: tuple[float, int] = (0.0, 0)  # (seconds, steps) over the cell, the counted step excluded
        self._stepped = False  # an optimizer step ended in this cell: it trained, so the summary speaks of MFU

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def training_forward(self, model_speed) -> None:
        """A prepared model's forward with gradients is about to run: the first one starts the count."""
        if self.per_step is not None or self._mode is not None or self.uncounted is not None:
            return
        if model_speed.compile is not None:
            self.uncounted = "a compiled model's FLOPs are not counted"
            return
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()

    def sharded(self) -> None:
        """--shard: FSDP2's DTensors are not counted."""
        if self.per_step is None:
            self.uncounted = "a sharded model's FLOPs are not counted"

    def optimizer_stepped(self, step: int) -> None:
        """An optimizer step ended (``step`` steps so far): end the count, or time the step."""
        now = time.perf_counter()
        self._stepped = True
        if self._mode is not None:
            self._finish_count()
            self._window = (now, 0)
            return
        if self.per_step is None or self._window is None:
            return
        started, steps = self._window[0], self._window[1] + 1
        if now - started < REPORT_S:
            self._window = (started, steps)
            return
        self._total = (self._total[0] + now - started, self._total[1] + steps)
        self._window = (now, 0)
        if self.rank == 0:
            metrics.log_own(step, self.rates(now - started, steps))

    def rates(self, seconds: float, steps: int) -> dict[str, float]:
        tflops = self.per_step * steps / seconds / 1e12 if self.per_step and seconds > 0 else 0.0
        return {"tflops": tflops, **({"mfu": 100.0 * tflops / self.peak_tflops} if self.peak_tflops else {})}

    def close(self) -> None:
        """The cell ended: a count still open is dropped; the cell's mean goes to the kernel."""
        if self._mode is not None:  # a forward with gradients, but no optimizer step: nothing trained, nothing to say
            self._finish_count()
            self.per_step, self.uncounted = None, "no optimizer step ended the first counted step"
        if not self._stepped:
            return
        seconds, steps = self._total
        if self._window is not None and self._window[1]:  # the last, shorter window counts too
            seconds, steps = seconds + time.perf_counter() - self._window[0], steps + self._window[1]
        fact: dict = {"flops_per_step": self.per_step, "precision": self.precision, "peak_tflops": self.peak_tflops,
                      "on_cpu": self.on_cpu}
        if self.per_step and steps:
            fact.update(self.rates(seconds, steps))
        if self.uncounted:
            fact["flops_uncounted"] = self.uncounted
        if self.per_step or self.uncounted:
            metrics.send_setup(fact)

    def _finish_count(self) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        try:
            mode.__exit__(None, None, None)
        except Exception as exc:  # another dispatch mode entered meanwhile and is still open
            self.uncounted = f"the FLOP count could not close ({type(exc).__name__})"
            return
        self.per_step = int(mode.get_total_flops()) or None
        if self.per_step is None:
            self.uncounted = "the first step ran no matrix product nbtrain could count"


def precision_of(amp_dtype) -> str:
    """The precision matrix products run in: the autocast dtype, else TF32 where allowed, else FP32."""
    if amp_dtype is torch.bfloat16:
        return "bf16"
    if amp_dtype is torch.float16:
        return "fp16"
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"


def for_device(rank: int, device, amp_dtype) -> StepFlops:
    """A rank's StepFlops: the peak of its GPU for the precision in use (none on the CPU)."""
    precision = precision_of(amp_dtype)
    peak = dense_peak_tflops(torch.cuda.get_device_name(device), precision) if device.type == "cuda" else None
    return StepFlops(rank, precision, peak, on_cpu=device.type != "cuda")
