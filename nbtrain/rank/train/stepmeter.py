"""Where a cell's steps go, measured on each rank: the step rate, the FLOPs it achieves, the share spent waiting for data.

**The split.** Each window also sums the time of each step's forward, backward and optimizer (:mod:`.stepsplit`);
with the data wait they make the cell's step split, in percent of the step, with the rest as *other*.

**The clock.** Wall time between optimizer steps, summed over windows of at least :data:`REPORT_S` seconds:
on a GPU the host waits for the device once its launch queue is full, so over a window the host's step time
is the device's. The window before the first optimizer step is left out (the FLOP count, compiling and the
first batch's workers make it slow). **Data wait** is the time a prepared DataLoader's ``next()`` took
(:mod:`.data`): a step that waits for its batch is a step the GPU idles.

**What is told.** Rank 0 logs, per window, ``tflops`` (achieved, per GPU or per process on the CPU, once
one step's FLOPs are counted: :mod:`.flops`), ``mfu`` in percent where the GPU's dense peak for the precision
in use is known, and ``data_wait`` in percent of the step: series in ``history`` and the live chart like any
``nbtrain.log`` value. When the cell ends, every rank sends its means over the cell as a
:class:`~nbtrain.wire.protocol.Setup` fact (the summary's first line, and the advisor comparing ranks) —
only after a cell that trained: no optimizer step, nothing said.
"""

from __future__ import annotations

import time

import torch

from . import metrics
from .commwait import LastGradient
from .flops import FlopCount, peak_of, precision_of
from .stepsplit import PHASES, StepSplit, first_tensor

REPORT_S = 2.0  # how often rank 0 logs its rates


class _Window:
    """Seconds, steps, seconds of data wait, samples and tokens read, and seconds per phase (:mod:`.stepsplit`),
    summed."""

    def __init__(self) -> None:
        self.seconds, self.steps, self.data_s = 0.0, 0, 0.0
        self.samples, self.tokens = 0, 0
        self.phases = dict.fromkeys(PHASES, 0.0)

    def add(self, other: _Window) -> None:
        self.seconds, self.steps, self.data_s = (self.seconds + other.seconds, self.steps + other.steps,
                                                 self.data_s + other.data_s)
        self.samples, self.tokens = self.samples + other.samples, self.tokens + other.tokens
        for phase, seconds in other.phases.items():
            self.phases[phase] += seconds

    def split(self) -> dict[str, float]:
        """Percent of the steps' time: data, forward, backward, optimizer, and the rest (other)."""
        if self.seconds <= 0:
            return {}
        shares = {"data": 100.0 * self.data_s / self.seconds,
                  **{phase: 100.0 * seconds / self.seconds for phase, seconds in self.phases.items()}}
        shares["other"] = max(0.0, 100.0 - sum(shares.values()))
        return shares


class StepMeter:
    """One cell's step measurements on one rank (owned by its TrainContext)."""

    def __init__(self, rank: int, precision: str, peak_tflops: float | None, on_cpu: bool, world_size: int = 1) -> None:
        self.rank, self.precision, self.peak_tflops, self.on_cpu = rank, precision, peak_tflops, on_cpu
        self.world_size = world_size  # the ranks reading as many samples as this one: the rate over all of them
        self._read = (0, 0)  # samples and tokens read since the last optimizer step
        self.flops = FlopCount()
        self.split = StepSplit(on_gpu=not on_cpu)  # forward, backward, comm, optimizer
        self._last_gradients: list[LastGradient] = []  # one per DDP model: its backward's comm
        self._started: float | None = None  # when the current window began (at an optimizer step)
        self._window = _Window()
        self._total = _Window()  # over the cell, the windows already closed
        self._data_s = 0.0  # data wait since the last optimizer step

    def training_forward(self, model, inputs: tuple[tuple, dict] | None) -> None:
        self.flops.training_forward(model, inputs)

    def all_reduced(self, model) -> None:
        """``model``'s gradients are all-reduced by DDP: the part of its backward that waits for that is *comm*."""
        self._last_gradients.append(LastGradient(model, self.split))

    def not_countable(self, why: str) -> None:
        self.flops.not_countable(why)

    def data_waited(self, seconds: float) -> None:
        """A prepared loader's ``next()`` took ``seconds``."""
        self._data_s += seconds

    def batch_read(self, batch) -> None:
        """A prepared loader gave ``batch``: its samples, and its tokens where it holds token ids."""
        samples, tokens = samples_and_tokens(batch)
        self._read = (self._read[0] + samples, self._read[1] + tokens)

    def optimizer_began(self) -> None:
        self.split.optimizer_began()

    def optimizer_stepped(self, step: int) -> None:
        """An optimizer step ended (``step`` steps so far)."""
        self.split.optimizer_ended()
        now = time.perf_counter()
        self.flops.finish()
        data_s, self._data_s = self._data_s, 0.0
        (samples, tokens), self._read = self._read, (0, 0)
        if self._started is None:  # the first step: its window is left out
            self._started = now
            self.split.forget()
            return
        window = self._window
        window.steps, window.data_s = window.steps + 1, window.data_s + data_s
        window.samples, window.tokens = window.samples + samples, window.tokens + tokens
        window.seconds = now - self._started
        if window.seconds < REPORT_S:
            return
        window.phases = self.split.take()
        self._total.add(window)
        self._started, self._window = now, _Window()
        if self.rank == 0:
            metrics.log_own(step, self.rates(window))

    def rates(self, window: _Window) -> dict[str, float]:
        rates = {"data_wait": 100.0 * window.data_s / window.seconds} if window.seconds > 0 else {}
        if window.samples and window.seconds > 0:  # over every rank: each reads as many as this one
            rates["samples_per_s"] = window.samples * self.world_size / window.seconds
        if window.tokens and window.seconds > 0:
            rates["tokens_per_s"] = window.tokens * self.world_size / window.seconds
        if self.flops.per_step and window.seconds > 0:
            rates["tflops"] = self.flops.per_step * window.steps / window.seconds / 1e12
            if self.peak_tflops:
                rates["mfu"] = 100.0 * rates["tflops"] / self.peak_tflops
        return rates

    def close(self, loaders: list[dict]) -> None:
        """The cell ended: its means, and its prepared loaders' settings, go to the kernel (if it trained)."""
        self.flops.drop()
        for watch in self._last_gradients:
            watch.close()
        if self._started is None:
            return
        self._window.phases = self.split.take()
        total = _Window()
        total.add(self._total)
        total.add(self._window)
        fact: dict = {"flops_per_step": self.flops.per_step, "precision": self.precision,
                      "peak_tflops": self.peak_tflops, "on_cpu": self.on_cpu, "steps_timed": total.steps,
                      "loaders": loaders, "split": total.split(), **self.rates(total)}
        if self.flops.uncounted:
            fact["flops_uncounted"] = self.flops.uncounted
        metrics.send_setup(fact)


def samples_and_tokens(batch) -> tuple[int, int]:
    """A batch's samples (its first tensor's first dimension) and tokens (that tensor's elements, where it holds
    integer ids of two dimensions or more: a language model's input); (0, 0) for a batch with no tensor."""
    first = first_tensor(batch)
    if first is None or first.dim() == 0:
        return 0, 0
    is_ids = not first.is_floating_point() and not first.is_complex() and first.dtype != torch.bool
    return int(first.shape[0]), int(first.numel()) if is_ids and first.dim() >= 2 else 0


def for_device(rank: int, device, amp_dtype, world_size: int = 1) -> StepMeter:
    """A rank's StepMeter: the peak of its GPU for the precision in use (none on the CPU)."""
    precision = precision_of(amp_dtype)
    return StepMeter(rank, precision, peak_of(device, precision), device.type != "cuda", world_size)
