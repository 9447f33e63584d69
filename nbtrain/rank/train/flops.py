"""One optimizer step's FLOPs, counted once per cell: the numerator of model FLOPs utilisation (MFU).

torch's :class:`~torch.utils.flop_counter.FlopCounterMode` — the matrix products and convolutions of forward
and backward, the FLOPs MFU is defined by (PaLM's appendix, torchtitan) — runs from the first training
forward of a prepared model to the end of the first optimizer step: one whole step, accumulation window
included, once per cell (a dispatch mode slows every op it sees, so no more). Not counted, and said so:
compiled models, by ``--compile`` or by the cell's own ``torch.compile`` (under a dispatch mode Dynamo runs
nothing compiled — the step would run eagerly, and a ``fullgraph=True`` model raises) and sharded models under activation checkpointing
(:mod:`.shard_meter`); a forward without gradients (evaluation) never starts it. The peak it is divided by comes from
:mod:`nbtrain.gpu.peaks`; the step rate from :mod:`.stepmeter`.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ...gpu.peaks import dense_peak_tflops


class FlopCount:
    """The FLOPs of one optimizer step of one cell on one rank."""

    def __init__(self) -> None:
        self.per_step: int | None = None  # FLOPs of one optimizer step, once counted
        self.uncounted: str | None = None  # why there is no count
        self._mode: FlopCounterMode | None = None

    @property
    def counting(self) -> bool:
        return self._mode is not None

    @property
    def waiting(self) -> bool:
        """Neither counted, counting, nor given up: the next training forward decides."""
        return self.per_step is None and self._mode is None and self.uncounted is None

    def training_forward(self, compiled: bool) -> None:
        """A prepared model's forward with gradients is about to run (``compiled``: under ``--compile``): the first
        one starts the count."""
        if self.per_step is not None or self._mode is not None or self.uncounted is not None:
            return
        if compiled:  # under a dispatch mode Dynamo runs nothing compiled, and fullgraph=True raises
            self.uncounted = "a compiled model's FLOPs are not counted"
            return
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()

    def not_countable(self, why: str) -> None:
        """A prepared model whose FLOPs a count would get wrong (``why``): no count, unless one was made."""
        if self.per_step is None and self._mode is None:
            self.uncounted = why

    def finish(self) -> None:
        """The first optimizer step ended: the count is its FLOPs."""
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

    def drop(self) -> None:
        """The cell ended inside the first step (no optimizer step closed it): no count."""
        if self._mode is not None:
            self.finish()
            self.per_step, self.uncounted = None, "no optimizer step ended the first counted step"


def precision_of(amp_dtype) -> str:
    """The precision matrix products run in: the autocast dtype, else TF32 where allowed, else FP32."""
    if amp_dtype is torch.bfloat16:
        return "bf16"
    if amp_dtype is torch.float16:
        return "fp16"
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"


def peak_of(device, precision: str) -> float | None:
    """The dense peak TFLOP/s of the rank's GPU for ``precision``; none on the CPU or for a GPU not in the table."""
    return dense_peak_tflops(torch.cuda.get_device_name(device), precision) if device.type == "cuda" else None
