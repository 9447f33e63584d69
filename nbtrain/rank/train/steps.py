"""The calls a cell makes inside a training step: ``nbtrain.backward``, ``nbtrain.clip_grad_norm_``,
``nbtrain.autocast``.

Each reads the running cell's context (:func:`nbtrain.rank.train.state.current`): its accumulation window
(:mod:`.accumulate`), its GradScaler and autocast dtype (:mod:`.amp`). They sit above the context rather
than in those modules because the context is built from them: :mod:`.state` imports :mod:`.amp` and
:mod:`.accumulate`, and this module imports :mod:`.state`, so the imports run one way.
"""

from __future__ import annotations

from . import ft_cell
from .state import current


def backward(loss, **kwargs) -> None:
    """``nbtrain.backward(loss)``: backward of one micro-step — scaled by 1/K, and by the GradScaler under fp16."""
    context = current()
    accum = context.accum
    if accum.closing:
        context.flush_scaler_update()
    accum.before_backward()
    if accum.k > 1:
        loss = loss / accum.k
    if context.scaler is not None:
        loss = context.scaler.scale(loss)
    loss.backward(**kwargs)
    context.meter.split.backward_ended()  # exact here: the step split's backward ends with the call


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0):
    """Clip gradients of a window (unscaled first under fp16); None on micro-steps that do not step."""
    import torch  # importing nbtrain must not import torch; a rank has it loaded already

    context = current()
    if not context.accum.at_boundary():
        return None
    if context.scaler is not None:
        for optimizer in context.optimizers:
            optimizer.unscale_once(context.scaler)
    if (ft := ft_cell.active()) is not None:
        ft.average_shards()  # --shard hybrid --ft: the groups' gradients averaged first, as DDP's are by now
    if isinstance(parameters, torch.nn.Module):  # a prepared model: DDP's or sharded (DTensor) parameters alike
        parameters = parameters.parameters()
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


def autocast():
    """``with nbtrain.autocast():`` — the cell's mixed precision for code that does not use prepare()."""
    return current().autocast()
