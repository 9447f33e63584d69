"""``nbtrain.prepare(model, optimizer, loader, ...)``: make ordinary PyTorch objects ready for the cell's ranks.

Give it any mix of these and get the same number back, in the same order (one object in, one out)::

    model, opt, loader = nbtrain.prepare(model, opt, loader)

* an ``nn.Module`` is moved to the rank's device and wrapped in :class:`PreparedDDP`, a
  ``DistributedDataParallel`` whose forward runs under the cell's autocast (``--amp``), returns fp32
  outputs, and skips the all-reduce on accumulation micro-steps (``--grad-accum``). Keyword arguments
  of prepare() go to DDP: ``nbtrain.prepare(model, find_unused_parameters=True)``. The plain module
  stays at ``model.module`` (save that, or bring it back to the notebook);
* an optimizer becomes a :class:`~nbtrain.rank.train.optim.PreparedOptimizer` (still a
  ``torch.optim.Optimizer``): ``step()`` and ``zero_grad()`` act once per accumulation window and use
  the GradScaler under fp16;
* a ``DataLoader`` is rebuilt with a ``DistributedSampler`` (see :mod:`nbtrain.rank.train.data`);
* an LR scheduler steps only when its optimizer did (see :class:`~nbtrain.rank.train.optim.PreparedScheduler`).

Under ``--shard`` a model is sharded with FSDP2 instead of wrapped in DDP, and the optimizers made from it
are pointed at its sharded parameters (:mod:`nbtrain.rank.train.shard`); everything else is the same.

Preparing the same object twice in a cell, or a model already wrapped in DDP/FSDP, is an error that says
what to pass instead; so is an optimizer given with models but holding none of their parameters
(``prepare(Net(), SGD(Net().parameters()))`` builds the optimizer from another instance, which would
never be updated). When the cell resumes from a checkpoint, each object gets its saved state as it is
prepared. Without a process group (plain Python), models are only moved and autocast, not wrapped in DDP.

Models with convolutions go to channels_last under AMP on GPUs, and ``--compile`` compiles them; both are
:mod:`nbtrain.rank.train.speed`'s, which this module only calls: once when the model is prepared, and around
its first forward.
"""

from __future__ import annotations

import os

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torch.utils.data import DataLoader

from . import data, ft_cell, optim, shard_meter, speed
from . import shard as sharding
from .amp import outputs_to_fp32
from .checkpoint import auto_resume, restore_model, restore_prepared
from .data import PreparedLoader
from .optim import PreparedOptimizer, PreparedScheduler
from .state import PreparedError, TrainContext, current


def prepare(*objects, shard=None, weights=None, **ddp_kwargs):
    """Prepare models, optimizers, DataLoaders and LR schedulers for this rank; returns them in order.

    Under ``--shard``, ``shard=[BlockClass, …]`` names the blocks FSDP2 shards one by one (by default the
    children of the model's largest list of identical modules; see :mod:`nbtrain.rank.train.shard`).
    ``weights=FOLDER`` loads the model's tensors from a folder of ``.safetensors`` files, by name, once the
    model is on its device (a model built on the meta device then never exists whole)."""
    if not objects:
        raise PreparedError("nbtrain.prepare() needs objects to prepare, such as prepare(model, optimizer, loader).")
    context = current()
    auto_resume(context)
    if (ft := ft_cell.active()) is not None:
        ft.join()  # --ft: the first quorum; a group that joins late copies a peer's state here
    for obj in objects:
        _check_not_prepared(context, obj)
    kinds = {id(o): _kind(o) for o in objects}
    if ddp_kwargs and not any(k == "model" for k in kinds.values()):
        raise PreparedError(f"prepare() passes {', '.join(ddp_kwargs)} to DistributedDataParallel, but got no model.")
    _check_optimizers_hold_the_models(objects, kinds)
    prepared = {}
    first_model, first_optimizer = len(context.models), len(context.optimizers)
    if weights is not None and sum(1 for k in kinds.values() if k == "model") != 1:
        raise PreparedError("prepare(..., weights=FOLDER) loads one model's weights: give exactly one model with it.")
    if shard is not None and not context.settings.shard:
        raise PreparedError("prepare(..., shard=[...]) names the blocks to shard, but this cell does not shard: run "
                            "it with --shard (or leave shard= out).")
    for obj in objects:  # models first: optimizers hold their parameters, which move with them
        if kinds[id(obj)] == "model":
            sharded = context.settings.shard and context.distributed
            prepared[id(obj)] = (_prepare_sharded(context, obj, shard, ddp_kwargs) if sharded
                                 else _prepare_model(context, obj, ddp_kwargs))
            if weights is not None and context.resume is None:  # a checkpoint being resumed has the newer weights
                sharding.load_weights(prepared[id(obj)], os.path.abspath(os.path.expanduser(str(weights))))
    for obj in objects:
        kind = kinds[id(obj)]
        if kind == "optimizer":
            sharding.rebind_optimizer(context, obj)  # its parameters were replaced by sharded ones
            prepared[id(obj)] = optim.prepare_optimizer(context, obj)
        elif kind == "loader":
            prepared[id(obj)] = data.prepare_loader(context, obj)
    _restore_sharded_and_optimizers(context, first_model, first_optimizer)
    for obj in objects:
        if kinds[id(obj)] == "scheduler":
            prepared[id(obj)] = optim.prepare_scheduler(context, obj)
    for obj in objects:
        context.prepared.add(obj)
    out = tuple(prepared[id(o)] for o in objects)
    return out[0] if len(out) == 1 else out


def _kind(obj) -> str:
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, DataLoader):
        return "loader"
    if isinstance(obj, (LRScheduler, ReduceLROnPlateau)):
        return "scheduler"
    raise PreparedError(f"nbtrain.prepare() takes models, optimizers, DataLoaders and LR schedulers, "
                        f"not {type(obj).__name__}.")


def _check_not_prepared(context: TrainContext, obj) -> None:
    if isinstance(obj, (PreparedDDP, PreparedModule, PreparedOptimizer, PreparedScheduler, PreparedLoader)):
        raise PreparedError(f"this {type(obj).__name__} was already returned by nbtrain.prepare(); "
                            "prepare each object once and keep using what prepare() returned.")
    try:
        seen = obj in context.prepared
    except TypeError:  # not weak-referenceable
        seen = False
    if seen:
        raise PreparedError(f"this {type(obj).__name__} was already prepared in this cell; prepare each object "
                            "once and use what prepare() returned.")
    wrapped = isinstance(obj, DistributedDataParallel) or type(obj).__name__ in ("FullyShardedDataParallel", "FSDPModule")
    if wrapped:
        raise PreparedError(f"prepare() got a model already wrapped in {type(obj).__name__}; pass the plain "
                            "module (model.module) — prepare() moves and wraps it itself.")


def _check_optimizers_hold_the_models(objects, kinds: dict) -> None:
    """An optimizer given with models must hold some of their parameters, or it never updates them.

    Only objects of the same call are compared: an optimizer of tensors outside any model (a learnable
    temperature, say) can still be prepared in a call of its own.
    """
    models = [o for o in objects if kinds[id(o)] == "model"]
    if not models:
        return
    owned = {id(p) for m in models for p in m.parameters()}
    for position, obj in enumerate(objects, 1):
        if kinds[id(obj)] != "optimizer":
            continue
        params = [p for group in obj.param_groups for p in group["params"]]
        if params and not any(id(p) in owned for p in params):
            model_names = " or ".join(sorted({type(m).__name__ for m in models}))
            raise PreparedError(
                f"the {type(obj).__name__} given to nbtrain.prepare() (argument {position}) holds none of the "
                f"parameters of the {model_names} given with it, so training would never update that model. "
                f"This happens when the optimizer is built from another instance, as in "
                f"prepare(Net(), SGD(Net().parameters())). Make the model once and build the optimizer from it: "
                f"model = Net(); opt = SGD(model.parameters()); model, opt = nbtrain.prepare(model, opt).")


def _prepare_model(context: TrainContext, model, ddp_kwargs: dict):
    if sharding.on_meta(model):  # built on torch.device("meta"): real storage here, each module initialised
        sharding.materialize(context, model)
    model = model.to(context.device)
    if context.resume is not None:
        restore_model(context, model, len(context.models))
    model_speed = _speed_up(context, model)
    wrapped: PreparedDDP | PreparedModule
    if context.distributed:
        device_ids = [context.device.index] if context.device.type == "cuda" else None
        if model_speed.channels_last or model_speed.compile:  # gradients as bucket views: no stride warning, no copy
            ddp_kwargs = {"gradient_as_bucket_view": True, **ddp_kwargs}
        try:
            wrapped = (PreparedDDP(model, device_ids=device_ids, **ddp_kwargs) if (ft := ft_cell.active()) is None
                       else ft.wrap_model(model, PreparedDDP, device_ids=device_ids, **ddp_kwargs))
        except TypeError as exc:
            raise PreparedError(f"DistributedDataParallel rejected prepare()'s keyword arguments: {exc}") from None
        context.meter.all_reduced(model)
    else:
        if ddp_kwargs:
            raise PreparedError(f"{', '.join(ddp_kwargs)} are DistributedDataParallel options, but no process group "
                                "is initialised here, so the model is not wrapped in DDP.")
        wrapped = PreparedModule(model)
    # nn.Module's __setattr__ is typed for tensors and modules; anything else is stored as a plain attribute
    wrapped._nbtrain_context = context  # type: ignore[assignment]
    wrapped._nbtrain_speed = model_speed  # type: ignore[assignment]
    context.models.append(wrapped)
    return wrapped


def _prepare_sharded(context: TrainContext, model, blocks, ddp_kwargs: dict):
    """--shard: FSDP2 in place of DDP (see nbtrain.rank.train.shard)."""
    if ddp_kwargs:
        raise PreparedError(f"{', '.join(ddp_kwargs)} are DistributedDataParallel options; with --shard the model is "
                            "sharded by FSDP2 instead. Leave them out.")
    model = sharding.shard_model(context, model if sharding.on_meta(model) else model.to(context.device), blocks)
    shard_meter.watch(context, model)  # its FLOPs and forward time, as prepare()'s own forward measures DDP's
    if (ft := ft_cell.active()) is not None:
        ft.replicate_shards(model)  # --shard hybrid --ft: each rank's shards averaged with its peers in the other groups
    context.models.append(model)  # a resumed state comes with its optimizers' (_restore_sharded_and_optimizers)
    return model


def _restore_sharded_and_optimizers(context: TrainContext, first_model: int, first_optimizer: int) -> None:
    """A resumed checkpoint's state into the sharded models and the optimizers this call prepared, all at once: a
    --shard checkpoint's are read in one DCP load. (A DDP model got its own before DDP wrapped it.)"""
    models = [(index, model) for index, model in enumerate(context.models)
              if index >= first_model and sharding.is_sharded(model)]
    restore_prepared(context, models, list(enumerate(context.optimizers))[first_optimizer:])


def _speed_up(context: TrainContext, model) -> speed.ModelSpeed:
    """channels_last and torch.compile for this model, as the cell's settings ask (see nbtrain.rank.train.speed)."""
    settings = context.settings
    channels_last = speed.channels_last_wanted(settings.channels_last, context.device, context.amp_dtype, model)
    if channels_last:
        speed.to_memory_format(model, channels_last=True)
    if settings.compile is not None:
        speed.compile_in_place(model, settings.compile)
    facts = {"device": str(context.device), "amp": _amp_name(context.amp_dtype),
             "bf16_supported": _bf16_supported(context.device)}
    return speed.ModelSpeed(len(context.models), channels_last, settings.channels_last is None, settings.compile,
                            settings.compile_fallback, facts, loud=context.rank == 0)


def _amp_name(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "off")


def _bf16_supported(device) -> bool | None:
    """Whether the rank's GPU computes bf16 natively (None on the CPU: not a question there)."""
    return bool(torch.cuda.is_bf16_supported()) if device.type == "cuda" else None


def _forward(self, super_forward, args, kwargs):
    context = self._nbtrain_context  # the cell's TrainContext, set by _prepare_model
    if not torch.is_grad_enabled():  # evaluation: not a training step's forward, not timed
        return _forward_under_autocast(self, super_forward, args, kwargs)
    meter = context.meter
    if meter.flops.open and context.optimizers:  # the first step's FLOPs (no prepared optimizer: no step is timed,
        meter.training_forward(self.module, (args, kwargs))  # and a count no step closes would slow every op)
    if hasattr(self, "require_backward_grad_sync"):
        self.require_backward_grad_sync = context.accum.sync_next()  # what no_sync() does, decided per forward
    meter.split.forward_began()
    out = _forward_under_autocast(self, super_forward, args, kwargs)
    meter.split.forward_ended(out)
    return out


def _forward_under_autocast(self, super_forward, args, kwargs):
    context, model_speed = self._nbtrain_context, self._nbtrain_speed
    if model_speed.first_call:
        with context.autocast():
            out = model_speed.first_forward(self.module, super_forward, args, kwargs)
    elif context.amp_dtype is None and not model_speed.channels_last:
        return super_forward(*args, **kwargs)  # fp32, default layout: nothing to add, every step
    else:
        args, kwargs = model_speed.prepare_args(args, kwargs)
        with context.autocast():
            out = super_forward(*args, **kwargs)
    out = model_speed.finish_outputs(out)
    return out if context.amp_dtype is None else outputs_to_fp32(out)


class PreparedDDP(DistributedDataParallel):
    """DistributedDataParallel with the cell's autocast and accumulation-aware gradient sync."""

    def forward(self, *args, **kwargs):
        return _forward(self, super().forward, args, kwargs)


class PreparedModule(torch.nn.Module):
    """Without a process group: the model under the cell's autocast; the plain module is ``.module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return _forward(self, self.module, args, kwargs)
