"""Where one rank's step time goes: forward, backward and the optimizer, timed around the prepared objects.

**The phases.** *forward* is a prepared model's training forward (grad enabled), from its call to its return;
*backward* runs from the moment autograd reaches that forward's output (a hook on the output's gradient) to the
return of ``nbtrain.backward()``, or else to whichever comes first of the optimizer's ``step()``, the next
forward and the next batch asked of a prepared loader — so after a plain ``loss.backward()`` it holds what the
cell does before ``step()`` (gradient clipping); either way it holds, under DDP, the part of the all-reduce that
backward did not hide; *optimizer* is the prepared optimizer's
``step()``. Under DDP, *comm* is the part of backward that waited for the all-reduce after the last gradient was
computed (:mod:`.commwait`), taken out of *backward*; under FSDP2, the wait for its reduce-scatters at backward's
end and, on the CPU, where gloo's reduce-scatter blocks backward, each reduce-scatter (:mod:`.shard_meter`).
The data wait is the prepared loader's (:mod:`.stepmeter`);
what is left of the step is *other*: the loss, logging, the cell's own code.

**The clock.** On the CPU, wall time. On a GPU the host runs ahead of the device, so each mark is a CUDA event on
the current stream and the phases are the device's time between them; the events are read when a window closes
(every couple of seconds, after the window's last event is done), never in the step.
"""

from __future__ import annotations

import time

import torch

PHASES = ("forward", "backward", "comm", "optimizer")
_INSIDE_BACKWARD = "comm inside backward"  # a collective that blocked backward: its time is comm, not backward


class _HostClock:
    def mark(self):
        return time.perf_counter()

    def seconds(self, begin, end) -> float:
        return max(0.0, end - begin)

    def settle(self, mark) -> None:
        return None


class _DeviceClock:
    """CUDA events on the current stream: what the device did between two marks."""

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, begin, end) -> float:
        return max(0.0, begin.elapsed_time(end) / 1000.0)

    def settle(self, mark) -> None:
        mark.synchronize()  # once per window: its last event, long done by then on a busy GPU


class StepSplit:
    """One rank's forward, backward and optimizer time, summed over the steps of a window (owned by its StepMeter)."""

    def __init__(self, on_gpu: bool) -> None:
        self._clock = _DeviceClock() if on_gpu else _HostClock()
        self._marks: list[tuple[str, object, object]] = []  # (phase, begin, end) of the open window's steps
        self._forward_at = None  # a training forward under way: its begin mark
        self._backward_at = None  # the step's backward began (its output's gradient arrived): its mark
        self._optimizer_at = None
        self._computed_at = None  # the step's backward computed its last gradient (DDP: .commwait): its mark
        self._collective_at = None  # a collective under way inside backward: its begin mark

    def forward_began(self) -> None:
        now = self._clock.mark()
        self._close_backward(now)  # accumulation: the micro-step before ends where this forward begins
        self._forward_at = now

    def backward_ended(self) -> None:
        """``nbtrain.backward()`` returned, or the next batch is asked for: backward is over by then."""
        if self._backward_at is not None:
            self._close_backward(self._clock.mark())

    def _close_backward(self, now) -> None:
        self._computed_at = None
        if self._backward_at is not None:
            self._marks.append(("backward", self._backward_at, now))
            self._backward_at = None

    def forward_ended(self, output) -> None:
        """Close the forward; the first output that carries a gradient marks the start of its backward."""
        if self._forward_at is None:
            return
        self._marks.append(("forward", self._forward_at, self._clock.mark()))
        self._forward_at = None
        tensor = first_tensor(output, lambda t: t.requires_grad)
        if tensor is not None:
            tensor.register_hook(self._backward_began)

    def _backward_began(self, grad):
        if self._backward_at is None:  # a model with several outputs that carry gradients: the first one's
            self._backward_at = self._clock.mark()
        return None  # the gradient unchanged

    def gradients_computed(self) -> None:
        """Backward computed its last gradient; what follows until :meth:`gradients_reduced` is the all-reduce."""
        if self._backward_at is not None:
            self._computed_at = self._clock.mark()

    def gradients_reduced(self) -> None:
        """DDP's all-reduce is done: the backward so far, then *comm*; backward goes on to its usual end."""
        computed, self._computed_at = self._computed_at, None
        if computed is None or self._backward_at is None:
            return
        now = self._clock.mark()
        self._marks.append(("backward", self._backward_at, computed))
        self._marks.append(("comm", computed, now))
        self._backward_at = now

    def collective_began(self) -> None:
        """A collective that blocks backward (FSDP2's reduce-scatter on the CPU) begins: until
        :meth:`collective_ended`, *comm* (not when the span from :meth:`gradients_computed` holds it already)."""
        if self._backward_at is not None and self._computed_at is None:
            self._collective_at = self._clock.mark()

    def collective_ended(self) -> None:
        begin, self._collective_at = self._collective_at, None
        if begin is not None:
            end = self._clock.mark()
            self._marks += [("comm", begin, end), (_INSIDE_BACKWARD, begin, end)]

    def optimizer_began(self) -> None:
        now = self._clock.mark()
        self._close_backward(now)
        self._optimizer_at = now

    def optimizer_ended(self) -> None:
        if self._optimizer_at is not None:
            self._marks.append(("optimizer", self._optimizer_at, self._clock.mark()))
            self._optimizer_at = None

    def forget(self) -> None:
        """The marks so far belong to a step that is not timed (the first): drop them."""
        self._marks = []

    def take(self) -> dict[str, float]:
        """Seconds per phase since the last take (waiting, on a GPU, for the window's last event)."""
        marks, self._marks = self._marks, []
        if marks:
            self._clock.settle(marks[-1][2])
        seconds = dict.fromkeys((*PHASES, _INSIDE_BACKWARD), 0.0)
        for phase, begin, end in marks:
            seconds[phase] += self._clock.seconds(begin, end)
        seconds["backward"] = max(0.0, seconds["backward"] - seconds.pop(_INSIDE_BACKWARD))
        return seconds


def first_tensor(value, accept=lambda tensor: True):
    """The first tensor ``accept`` takes in a nested value — a tensor, a tuple/list, a dict, a ModelOutput (a
    model's output, a loader's batch) — or None."""
    if isinstance(value, torch.Tensor):
        return value if accept(value) else None
    values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in values:
        found = first_tensor(item, accept)
        if found is not None:
            return found
    return None
