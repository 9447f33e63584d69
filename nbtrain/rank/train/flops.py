"""One optimizer step's FLOPs, counted once per cell: the numerator of model FLOPs utilisation (MFU).

torch's :class:`~torch.utils.flop_counter.FlopCounterMode` — the matrix products and convolutions of forward
and backward, the FLOPs MFU is defined by (PaLM's appendix, torchtitan) — runs from the first training
forward of a prepared model to the end of the first optimizer step: one whole step, accumulation window
included, once per cell (a dispatch mode slows every op it sees, so no more). A compiled model — by ``--compile``
or by the cell's own ``torch.compile`` — cannot run under that mode (Dynamo runs nothing compiled under it, and
a ``fullgraph=True`` model raises): each forward of its first step is counted instead on a copy of the model
that holds no memory (:mod:`.meta_flops`). Not counted, and said so: compiled sharded models, sharded models
under activation checkpointing (:mod:`.shard_meter`), a forward a meta-device copy cannot run. A forward without
gradients (evaluation) never starts a count. The peak it is divided by comes from :mod:`nbtrain.gpu.peaks`; the
step rate from :mod:`.stepmeter`.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ...gpu.peaks import dense_peak_tflops
from . import speed
from .meta_flops import count_on_meta


class FlopCount:
    """The FLOPs of one optimizer step of one cell on one rank."""

    def __init__(self) -> None:
        self.per_step: int | None = None  # FLOPs of one optimizer step, once counted
        self.uncounted: str | None = None  # why there is no count
        self._mode: FlopCounterMode | None = None
        self._per_forward: dict[int, int] = {}  # id of a model → one forward and backward of it, counted on a copy
        self._meta_total: int | None = None  # the first step's forwards so far, counted on copies
        self._compiled: dict[int, bool] = {}  # id of a model → whether torch.compile runs it or a part of it

    @property
    def counting(self) -> bool:
        return self._mode is not None

    @property
    def open(self) -> bool:
        """Not counted yet, nor given up: training forwards are told (:meth:`training_forward`)."""
        return self.per_step is None and self.uncounted is None

    def training_forward(self, model, inputs: tuple[tuple, dict] | None) -> None:
        """A prepared model's forward with gradients is about to run on ``inputs`` (its arguments; None where no
        copy of the model can run them: a sharded one). The first one chooses how the step is counted: a dispatch
        mode around it, or — for a compiled model, which Dynamo would run uncompiled under the mode (and
        ``fullgraph=True`` raises) — each of the step's forwards on a copy of its model (:mod:`.meta_flops`)."""
        if not self.open:
            return
        if id(model) not in self._compiled:  # once per model: a cell whose optimizer is not prepared stays open
            self._compiled[id(model)] = speed.compiled(model)
        compiled = self._compiled[id(model)]
        if self._mode is not None:
            if compiled:  # another model of the step is compiled: the mode must not be open around it
                self._close_mode()
                self.uncounted = "a step with a compiled and an uncompiled model is not counted"
            return
        if self._meta_total is None and not compiled:
            self._mode = FlopCounterMode(display=False)
            self._mode.__enter__()
        elif inputs is None:
            self.uncounted = "a compiled sharded model's FLOPs are not counted"
        else:
            self._count_on_meta(model, inputs)

    def _count_on_meta(self, model, inputs: tuple[tuple, dict]) -> None:
        try:
            if id(model) not in self._per_forward:  # the step's later forwards: the same model on alike batches
                self._per_forward[id(model)] = count_on_meta(model, *inputs)
        except Exception as exc:  # a forward that needs real values, a module that cannot be copied
            self.uncounted = f"a compiled model's FLOPs could not be counted on a meta-device copy ({_first_line(exc)})"
            return
        self._meta_total = (self._meta_total or 0) + self._per_forward[id(model)]

    def not_countable(self, why: str) -> None:
        """A prepared model whose FLOPs a count would get wrong (``why``): no count, unless one was made."""
        if self.per_step is None and self._mode is None:
            self.uncounted = why

    def finish(self) -> None:
        """The first optimizer step ended: the count is its FLOPs."""
        if self._meta_total is not None and self.open:
            self.per_step = self._meta_total or None
        mode = self._close_mode()
        if mode is None:
            return
        self.per_step = int(mode.get_total_flops()) or None
        if self.per_step is None:
            self.uncounted = "the first step ran no matrix product nbtrain could count"

    def drop(self) -> None:
        """The cell ended inside the first step (no optimizer step closed it): no count."""
        if self._mode is not None or (self._meta_total is not None and self.open):
            self.finish()
            self.per_step, self.uncounted = None, "no optimizer step ended the first counted step"

    def _close_mode(self) -> FlopCounterMode | None:
        """The dispatch mode closed (None if none was open, or it could not close: then said why)."""
        mode, self._mode = self._mode, None
        if mode is None:
            return None
        try:
            mode.__exit__(None, None, None)
        except Exception as exc:  # another dispatch mode entered meanwhile and is still open
            self.uncounted = f"the FLOP count could not close ({type(exc).__name__})"
            return None
        return mode


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


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
