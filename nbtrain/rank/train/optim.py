"""Prepared optimizers and LR schedulers: one real step per accumulation window, GradScaler under fp16.

:class:`PreparedOptimizer` is a ``torch.optim.Optimizer`` around the user's optimizer (at
``.optimizer``); ``param_groups``, ``state``, ``state_dict()`` and ``load_state_dict()`` are the wrapped
optimizer's, so LR schedulers, checkpoints and code that edits learning rates work unchanged.

* ``step()``: on micro-steps inside an accumulation window it does nothing; at the end of the window it
  steps — through ``GradScaler.step()`` under fp16, which skips the step when a gradient is inf or NaN
  (counted in ``steps_skipped``). ``GradScaler.update()`` runs once per window, after every prepared
  optimizer has stepped (before the next ``nbtrain.backward()`` or checkpoint).
* ``zero_grad()``: acts only at the end of a window, so gradients add up across micro-steps.

:class:`PreparedScheduler` steps its scheduler only after a real optimizer step, so warm-up and decay
schedules count optimizer steps, not micro-steps, and do not advance over a skipped fp16 step.

A scheduler made in the notebook reaches the ranks pickled together with its optimizer. PyTorch's
``LRScheduler`` notes optimizer steps through a wrapper it puts on the optimizer *instance*
(``optimizer.step``), and ``Optimizer.__getstate__`` does not keep it, so on the ranks the scheduler
would warn that "``optimizer.step()`` has been overridden" at its first step. Preparing the scheduler
puts the step-tracking wrapper back (:func:`_restore_step_tracking`), as the scheduler's own
constructor would have.
"""

from __future__ import annotations

import functools
import weakref

import torch

from . import ft_cell, preempt_checkpoint
from .checkpoint import restore_scheduler
from .state import PreparedError, TrainContext, unwrapped


class PreparedOptimizer(torch.optim.Optimizer):
    def __init__(self, optimizer: torch.optim.Optimizer, context: TrainContext) -> None:
        # No Optimizer.__init__: the parameters, state and hooks stay the wrapped optimizer's.
        self.optimizer = optimizer
        self._context = context
        self.unscaled = False  # GradScaler.unscale_ done for this window (by nbtrain.clip_grad_norm_)
        self.step_was_skipped = False

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups):
        self.optimizer.param_groups = groups

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, state):
        self.optimizer.state = state

    @property
    def defaults(self):
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults):
        self.optimizer.defaults = defaults

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._context.accum.zeroes_now():
            if (ft := ft_cell.active()) is not None:
                ft.boundary()  # --ft without a prepared loader: the step's quorum starts here
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def unscale_once(self, scaler) -> None:
        """GradScaler.unscale_ this window's gradients, once (before clipping them)."""
        if not self.unscaled:
            scaler.unscale_(self.optimizer)
            self.unscaled = True

    def step(self, closure=None):
        context = self._context
        if not context.accum.at_boundary():
            return None
        context.meter.optimizer_began()
        if (ft := ft_cell.active()) is not None and not ft.commit():
            return None  # --ft: a group of the quorum did not finish this step; no group takes it
        scaler = context.scaler
        if scaler is not None:
            if not context.accum.backward_used:
                raise RuntimeError("under fp16 (--amp fp16) call nbtrain.backward(loss) in place of loss.backward(): "
                                   "the loss must be scaled by the GradScaler before backward.")
            result = scaler.step(self.optimizer, *([closure] if closure is not None else []))
            self.step_was_skipped = _scaler_found_inf(scaler, self.optimizer)
            context.scaler_stepped()
        else:
            result = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
            self.step_was_skipped = False
        self.unscaled = False
        if not context.accum.closing or not context.accum.backward_used:  # the first optimizer to step closes the
            # window; without nbtrain.backward() (no --grad-accum) every step is one
            context.count_step(self.step_was_skipped)
            context.meter.optimizer_stepped(context.step)
            context.accum.on_step()
            if not context.accum.active_loaders:  # no prepared loader to save before its next batch
                preempt_checkpoint.at_boundary(context)
        return result

    def __reduce__(self):  # pickled (brought back to the notebook): the plain optimizer travels
        return (unwrapped, (self.optimizer,))

    def __repr__(self) -> str:
        return f"PreparedOptimizer({self.optimizer!r})"


def _scaler_found_inf(scaler, optimizer) -> bool:
    """Did GradScaler.step() skip ``optimizer``'s step? (Its found-inf flags are already on the host.)"""
    states = getattr(scaler, "_per_optimizer_states", None)
    if not states or id(optimizer) not in states:
        return False
    return bool(sum(v.item() for v in states[id(optimizer)].get("found_inf_per_device", {}).values()))


class PreparedScheduler:
    """An LR scheduler that steps once per real optimizer step; everything else is the scheduler's own."""

    def __init__(self, scheduler, context: TrainContext) -> None:
        self.scheduler = scheduler
        self._context = context
        self._stepped_at = context.step

    def step(self, *args, **kwargs):
        context = self._context
        if context.accum.backward_used and context.step == self._stepped_at:
            return None  # inside an accumulation window: no optimizer step yet
        self._stepped_at = context.step
        own = getattr(self.scheduler, "optimizer", None)
        if any(o.step_was_skipped for o in context.optimizers if own is o or own is o.optimizer):
            return None  # fp16 skipped the step: keep the learning rate where it was
        return self.scheduler.step(*args, **kwargs)

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name):
        return getattr(self.__dict__["scheduler"], name)

    def __reduce__(self):
        return (unwrapped, (self.scheduler,))

    def __repr__(self) -> str:
        return f"PreparedScheduler({self.scheduler!r})"


def prepare_optimizer(context: TrainContext, optimizer) -> PreparedOptimizer:
    """The optimizer wrapped and kept; a resumed state is given by ``prepare()``, with its models' (one DCP load)."""
    if ft_cell.active() is not None and context.optimizers:
        raise PreparedError("under --ft the replica groups agree on each step of one optimizer; this cell prepares a "
                            "second. Put every parameter in one optimizer (parameter groups can keep their own "
                            "settings), or run without --ft.")
    prepared = PreparedOptimizer(optimizer, context)
    context.optimizers.append(prepared)
    return prepared


def _restore_step_tracking(scheduler) -> None:
    """Wrap the scheduler's optimizer's ``step`` as ``LRScheduler.__init__`` does, if pickling lost it.

    The wrapper only records that the optimizer stepped (``_opt_called``), which the scheduler checks at
    its first step; the flag names are PyTorch's own, so its check sees a correctly ordered loop.
    """
    optimizer = getattr(scheduler, "optimizer", None)
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) or optimizer is None:
        return  # ReduceLROnPlateau does not track optimizer steps
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched") or not hasattr(step, "__func__"):
        return
    func, optimizer_ref = step.__func__, weakref.ref(optimizer)  # no reference cycle through the instance

    @functools.wraps(func)
    def step_noting_the_call(*args, **kwargs):
        opt = optimizer_ref()
        assert opt is not None  # called through the optimizer, so it is alive
        opt._opt_called = True
        return func.__get__(opt, type(opt))(*args, **kwargs)

    # torch's LRScheduler checks this marker on optimizer.step (a function attribute, untyped)
    step_noting_the_call._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = step_noting_the_call


def prepare_scheduler(context: TrainContext, scheduler) -> PreparedScheduler:
    _restore_step_tracking(scheduler)
    prepared = PreparedScheduler(scheduler, context)
    if context.resume is not None:
        restore_scheduler(context, prepared, len(context.schedulers))
    context.schedulers.append(prepared)
    return prepared
