"""Sharded training (``--shard``): FSDP2 through ``prepare()``, whole models back, DCP checkpoints.

PyTorch's own engines do the work — ``torch.distributed.fsdp.fully_shard`` (FSDP2, parameters as DTensors),
``torch.distributed.checkpoint`` (DCP) and its ``state_dict`` helpers; this module decides what to shard and
wires it into the cell:

* **what is sharded** (:func:`find_blocks`): each *block* — the children of the model's largest
  ``nn.ModuleList``/``nn.Sequential`` whose children are all of one class (a transformer's layers), or the
  classes the cell names with ``prepare(model, shard=[Block])`` — then the root, as FSDP2's examples do. One
  device mesh over every rank, or with ``--shard hybrid`` a 2-D mesh (nodes × ranks per node: replicated
  across nodes, sharded within one — HSDP); under ``--ft`` a mesh over the replica group's ranks, replicated
  across the groups by torchft (:mod:`.ft_cell`);
* **precision**: ``--amp`` becomes a ``MixedPrecisionPolicy`` (parameters in the AMP dtype, gradients reduced
  in float32, outputs in float32 as under DDP); ``--shard-offload`` a ``CPUOffloadPolicy``;
  ``--activation-checkpointing`` checkpoints each block;
* **the optimizer** made from the plain model holds parameters FSDP2 has replaced: :func:`rebind_optimizer`
  points it at the sharded ones (its state is still empty then), so a cell written for DDP runs sharded by
  adding the option;
* **gradient accumulation**: a micro-step's forward turns FSDP2's reduce-scatter off
  (``set_requires_gradient_sync``), as ``no_sync()`` does for DDP;
* **results** (:func:`bring_back`): a sharded model the cell assigns comes back to the notebook as the plain
  module — every rank takes part in gathering the full state dict to rank 0's CPU (one tensor at a time),
  and rank 0 fills a parameter-less copy of the model made before sharding (:func:`meta_copy`), tying again
  what the model tied (:func:`tied_parameters`); the ranks' own namespace keeps the sharded model (a session);
* **checkpoints** (:func:`save_states`; resuming is :mod:`.dcp_resume`'s): DCP, each rank writing its own
  shards; DCP re-shards on load, so a run resumes at another world size, and a DDP checkpoint loads into a
  sharded run and the other way round.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import sys
import threading
import warnings
from concurrent.futures import Future
from typing import Any

import torch
from torch import nn

from ...common.words import count
from ...wire.payload import StaysOnTheRanks
from . import dtensor_results, metrics, speed
from .save_planner import save_planner
from .state import PreparedError, TrainContext, current

META_COPY = "_nbtrain_meta_copy"  # rank 0: the plain model's structure, parameters on the meta device

def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def find_blocks(model: nn.Module, named=None) -> list[nn.Module]:
    """The modules to shard one by one before the root (see the module docstring)."""
    if named:
        classes = tuple(named)
        found = [m for m in model.modules() if m is not model and isinstance(m, classes)]
        if not found:
            names = ", ".join(c.__name__ for c in classes)
            raise PreparedError(f"prepare(..., shard=[{names}]): {type(model).__name__} has no such submodule; name "
                                "the class of its repeated blocks (a transformer's layer class).")
        return [m for m in found if not any(m is not o and _inside(m, o) for o in found)]  # outermost only
    lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2
             and len({type(child) for child in m}) == 1 and any(True for _ in m.parameters())]
    if not lists:
        return []
    return list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters())))


def _inside(module: nn.Module, outer: nn.Module) -> bool:
    return any(module is m for m in outer.modules())


def meta_copy(model: nn.Module) -> nn.Module:
    """The model's structure with parameters on the meta device (no memory); buffers are copied as they are."""
    memo: dict = {}
    for param in model.parameters():
        memo[id(param)] = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
    return copy.deepcopy(model, memo)


def device_mesh(context: TrainContext, hybrid: bool):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()  # the run's ranks; under --ft this rank's replica group's
    if not hybrid:
        return init_device_mesh(context.device.type, (world,), mesh_dim_names=("shard",))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return init_device_mesh(context.device.type, (world // per_node, per_node), mesh_dim_names=("replicate", "shard"))


def shard_model(context: TrainContext, model: nn.Module, blocks=None) -> nn.Module:
    """Apply FSDP2 to ``model`` in place (blocks, then root) as the cell's settings ask; returns it."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    settings = context.settings
    policy = root_policy = MixedPrecisionPolicy()
    if context.amp_dtype is not None:  # blocks hand the AMP dtype on; the root returns float32, as DDP's AMP does
        policy = MixedPrecisionPolicy(param_dtype=context.amp_dtype, reduce_dtype=torch.float32)
        root_policy = MixedPrecisionPolicy(param_dtype=context.amp_dtype, reduce_dtype=torch.float32,
                                           output_dtype=torch.float32)
    offload = CPUOffloadPolicy() if settings.shard_offload else OffloadPolicy()
    # --ft: the default process group is this rank's replica group, so one dimension (the groups replicate through
    # torchft: nbtrain.rank.train.ft_cell)
    mesh = device_mesh(context, settings.shard == "hybrid" and not settings.ft)
    names = {id(p): name for name, p in model.named_parameters()}
    if context.rank == 0:  # the way back to the notebook: a parameter-less copy of the plain model, kept with it
        object.__setattr__(model, META_COPY, meta_copy(model))  # (outside the module tree: no parameters of its own)
    units = find_blocks(model, blocks)
    current = model
    try:
        for current in units:
            if settings.activation_checkpointing:
                checkpoint(current)
            if settings.compile is not None:  # each block compiled, then sharded (FSDP2's hooks stay outside)
                speed.compile_in_place(current, settings.compile)
            fully_shard(current, mesh=mesh, mp_policy=policy, offload_policy=offload)
        current = model
        fully_shard(model, mesh=mesh, mp_policy=root_policy, offload_policy=offload)
    except Exception as exc:
        where = "" if current is model else f" (its block {type(current).__name__})"
        raise PreparedError(f"FSDP2 could not shard {type(model).__name__}{where}: {type(exc).__name__}: {exc}. "
                            "Run it without --shard, or name the blocks to shard with prepare(model, "
                            "shard=[BlockClass]).") from None
    _trust_the_roots_view(model)
    materialize(context, model)
    after = dict(model.named_parameters())
    context.sharded_params.update({old: after[name] for old, name in names.items() if name in after})
    model.register_forward_pre_hook(_gradient_sync)
    if context.rank == 0:
        print(describe(context, model, len(units)), flush=True)
    metrics.send_setup({"model": len(context.models), "amp": _amp_word(context.amp_dtype),
                        "shard": "HSDP" if context.settings.shard == "hybrid" else "FSDP2", "blocks": len(units),
                        "shard_ranks": mesh.size(-1) if mesh.ndim > 1 else mesh.size()})
    return model


def _trust_the_roots_view(model: nn.Module) -> None:
    """Silence FSDP2's warning that the sharded root returned a view, which every language model's head on a 3-D
    input does (``Linear`` folds the batch): "an in-place op on this view … can produce wrong gradients".

    Read in torch's ``_fsdp_state.py``: the warning is true for a module whose parameters are freed after forward
    — an in-place op drops its pre-backward hook, so nothing gathers them again for backward. The root's are not
    freed (torch keeps the root unsharded after forward unless ``reshard_after_forward`` is given, and nbtrain
    gives none), and its post-backward runs from the final callback when its hook did not; so its gradients are
    the same (``out *= 2`` on such an output trains to DDP's losses, tests/test_sharded.py). A block's view is
    still reported: its parameters are freed."""
    warnings.filterwarnings("ignore", category=UserWarning,
                            message=re.escape(f"FSDP2-wrapped module ({type(model).__name__}) returned a view tensor"))


def _amp_word(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "off")


def report_state(context: TrainContext) -> None:
    """At the cell's end, measured on each rank: the training state it holds for its sharded models — the local
    shards of their parameters and gradients and of their optimizers' state — and its peak memory."""
    models = [m for m in context.models if is_sharded(m)]
    if not models:
        return
    held = sum(_local_bytes(p) + (_local_bytes(p.grad) if p.grad is not None else 0)
               for model in models for p in model.parameters())
    for optimizer in context.optimizers:
        if owner_of(context, optimizer) in models:
            held += sum(_local_bytes(v) for state in optimizer.state.values() for v in state.values()
                        if torch.is_tensor(v) and v.dim() > 0)
    metrics.send_setup({"shard_state": held, "peak": _peak_memory(context.device)})


def report_nothing_sharded(context: TrainContext, namespace: dict) -> None:
    """At the cell's end under --shard with no model sharded (the cell never called ``prepare()`` on one): each rank
    trained — or holds — its own unsynchronised copy, which the cell's output and the summary say, on rank 0."""
    if context.settings.shard is None or any(is_sharded(m) for m in context.models) or context.rank != 0:
        return
    models = {name: value for name, value in namespace.items()
              if isinstance(value, nn.Module) and not name.startswith("_") and any(True for _ in value.parameters())}
    if not models:
        return
    trained = [name for name, model in models.items() if any(p.grad is not None for p in model.parameters())]
    named = ", ".join(f"{name} ({type(model).__name__})" for name, model in models.items())
    what = (f"each rank trained its own copy of {', '.join(trained)}, unsynchronised" if trained
            else "each rank holds its own copy")
    print(f"nbtrain: --shard, but nothing was sharded: {named} never went through nbtrain.prepare(), so {what}. "
          "Pass the model (and its optimizer) to nbtrain.prepare() to shard it.", file=sys.stderr, flush=True)
    metrics.send_setup({"shard_unused": sorted(models), "trained": bool(trained)})


def _local_bytes(tensor) -> int:
    tensor = _local(tensor)
    return tensor.numel() * tensor.element_size()


def _peak_memory(device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers()))


def materialize(context: TrainContext, model: nn.Module) -> None:
    """A model built on ``torch.device("meta")`` gets real storage on this rank's device — after sharding, only
    its shards — and each module's ``reset_parameters()`` fills it (a checkpoint's weights come after)."""
    if not on_meta(model):
        return
    model.to_empty(device=context.device)
    left = []
    with torch.no_grad():
        for name, module in model.named_modules():
            reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
            if callable(reset):
                _reset_on_cpu_mesh(module, reset) if _on_cpu_mesh(module) else reset()
            elif any(True for _ in module.parameters(recurse=False)):
                left.append(name or type(module).__name__)
    if left and context.resume is None and context.rank == 0:
        one = len(left) == 1
        print(f"nbtrain: the meta-device model's {', '.join(left)} {'has' if one else 'have'} no reset_parameters(), "
              f"so {'its' if one else 'their'} parameters are uninitialised: give the module a reset_parameters() or "
              "resume from a checkpoint.", file=sys.stderr, flush=True)


def _on_cpu_mesh(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) and p.device_mesh.device_type == "cpu" for p in module.parameters(recurse=False))


def _reset_on_cpu_mesh(module: nn.Module, reset) -> None:
    """``reset()`` of a module whose parameters are sharded over CPU ranks, as if it were whole.

    DTensor draws random numbers shard by shard from each rank's own generator on a CPU mesh (on GPUs it keeps
    one stream over the shards): after the cell's ``torch.manual_seed(0)`` every shard of a weight got the same
    values, its halves equal. So the module's parameters are filled whole, in the module's own
    ``reset_parameters()``, and rank 0's are scattered as the shards: the model starts as its unsharded twin
    built after the same seed does."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    sharded = {name: p for name, p in module.named_parameters(recurse=False) if isinstance(p, DTensor)}
    for name, param in sharded.items():
        setattr(module, name, nn.Parameter(torch.empty(param.shape, dtype=param.dtype), param.requires_grad))
    try:
        reset()
        whole = {name: getattr(module, name).detach() for name in sharded}
    finally:
        for name, param in sharded.items():
            setattr(module, name, param)
    for name, param in sharded.items():
        param.to_local().copy_(distribute_tensor(whole[name], param.device_mesh, param.placements).to_local())


def _gradient_sync(module, _args) -> None:
    """Before each forward: a micro-step keeps its gradients unreduced, as DDP's no_sync() — by the running
    cell's --grad-accum (a model kept in a session may be trained by later cells)."""
    if torch.is_grad_enabled():
        module.set_requires_gradient_sync(current().accum.sync_next())


def describe(context: TrainContext, model: nn.Module, blocks: int) -> str:
    """What sharding did, measured: this rank's parameter bytes against the whole model's."""
    local = sum(_local_bytes(p) for p in model.parameters())
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    kind = "HSDP" if context.settings.shard == "hybrid" else "FSDP2"
    if context.settings.ft:  # sharded within this rank's replica group, replicated across the groups by torchft
        import torch.distributed as dist

        kind = f"HSDP (--ft: sharded within replica groups of {count('rank', dist.get_world_size())})"
    precision = (f"{_dtype_name(context.amp_dtype)} params, fp32 reduce" if context.amp_dtype is not None
                 else "fp32")
    extra = "".join(f" · {flag}" for flag, on in (("CPU offload", context.settings.shard_offload),
                                                   ("activation checkpointing",
                                                    context.settings.activation_checkpointing)) if on)
    return (f"nbtrain: {kind} · {count('rank', context.world_size)} · {count('block', blocks)} + root · {precision}{extra} · "
            f"parameters per rank {_size(local)} of {_size(whole)} (DDP would hold all of it on every rank, "
            f"with its gradients and optimizer state)")


def _local(param):
    return param.to_local() if hasattr(param, "to_local") else param


def _dtype_name(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return ""


def rebind_optimizer(context: TrainContext, optimizer) -> None:
    """Point an optimizer made from the plain model at the sharded parameters that replaced them."""
    if not context.sharded_params:
        return
    for group in optimizer.param_groups:
        group["params"] = [context.sharded_params.get(id(p), p) for p in group["params"]]


# ------------------------------------------------------------------------------------------ results
def bring_back(context: TrainContext, namespace: dict, names, result_rank: bool) -> dict:
    """What rank 0 sends back in place of ``names``' sharded values (a collective: every rank calls this): each
    sharded model whole — those of this cell and those a session kept from earlier ones — and a note in place of
    a sharded optimizer, which stays on the ranks. ``namespace`` itself is left as it is: a session's next cell
    and ``%distributed_pull`` find the sharded model still sharded on every rank."""
    limit = context.settings.out_limit
    sent: dict = {}
    for name in names:
        value = namespace.get(name)
        if isinstance(value, nn.Module) and is_sharded(value):
            size = sum(p.numel() * p.element_size() for p in value.parameters())  # a DTensor counts whole
            if limit is not None and size > limit:
                sent[name] = StaysOnTheRanks(_too_large(context, size, limit))
                continue
            state = _whole_state(value)
            if result_rank:
                sent[name] = _whole(value, state)
        elif isinstance(value, torch.optim.Optimizer) and _holds_sharded(value):
            sent[name] = StaysOnTheRanks(
                f"a sharded {type(getattr(value, 'optimizer', value)).__name__}'s state is spread over the ranks; "
                "save it with nbtrain.save_checkpoint()")
    if context.settings.shard and context.distributed:  # a collective: only where every rank knows it shards
        # every name on every rank (the models above are in ``sent`` on rank 0 alone): the same collective
        for name, value in dtensor_results.whole(namespace, names, context.device, limit).items():
            sent.setdefault(name, value)
    return sent if result_rank else {}


def _whole_state(model: nn.Module) -> dict:
    """A sharded model's whole state on the CPU (a collective). DCP is imported here, not at every cell's end:
    importing it takes about 50 ms, which a cell with nothing sharded would pay."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _whole(model: nn.Module, state: dict):
    plain = model.__dict__.get(META_COPY)
    if plain is None:
        return StaysOnTheRanks(f"{type(model).__name__} was sharded by the cell itself, not by nbtrain.prepare(), "
                                "so there is no plain module to fill; save its state with nbtrain.save_checkpoint()")
    plain = copy.deepcopy(plain)  # the kept copy stays empty: the model may come back again after more training
    ties = tied_parameters(plain)
    plain.load_state_dict(state, assign=True)  # one new parameter per name: a tie (head.weight = emb.weight) splits
    for first, *others in ties:  # so each tie is made again, as the model had it
        shared = plain.get_parameter(first)
        for name in others:
            owner, _, attribute = name.rpartition(".")
            setattr(plain.get_submodule(owner), attribute, shared)
    return plain


def tied_parameters(model: nn.Module) -> list[list[str]]:
    """The names under which one parameter appears more than once (tied weights), a list per parameter."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _too_large(context: TrainContext, size: int, limit: int) -> str:
    saved = context.settings.checkpoint_path
    where = (f"its sharded checkpoint is {saved}" if saved and os.path.exists(saved)
             else "save it with nbtrain.save_checkpoint() to keep it")
    return (f"the sharded model is {_size(size)}, over --out-limit {_size(limit)}, so it stays on the ranks "
            f"({where}; a larger --out-limit brings it back)")


def _holds_sharded(optimizer) -> bool:
    return any(hasattr(p, "to_local") for group in optimizer.param_groups for p in group["params"])


# ------------------------------------------------------------------------------------------ checkpoints
def owner_of(context: TrainContext, optimizer):
    """The prepared model whose parameters ``optimizer`` holds (the state_dict helpers need the pair)."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in context.models:
        if any(id(p) in held for p in model.parameters()):
            return model
    return None


_async_group: list = []  # (the default process group it was made beside, a gloo group for background saves)


def checkpoint_entries(context: TrainContext, directory: str) -> tuple[list, list]:
    """What the checkpoint file keeps in place of each prepared model and optimizer: the key of its state in the DCP
    folder ``directory`` — or, for an optimizer of no prepared model's parameters, its own state dict."""
    name = os.path.basename(directory)
    models = [{"dcp": name, "key": f"model{index}"} for index in range(len(context.models))]
    optimizers = [{"dcp": name, "key": f"optim{index}"} if owner_of(context, optimizer) is not None
                  else optimizer.state_dict() for index, optimizer in enumerate(context.optimizers)]
    return models, optimizers


def save_states(context: TrainContext, directory: str, done=None, planned=None, part: bytes | None = None) -> None:
    """Write every prepared model and optimizer to ``directory`` with DCP (each rank its own shards; the checkpoint
    file keeps :func:`checkpoint_entries` in their place). ``planned(parts)``, if given, runs
    once the ranks have agreed on DCP's plan, before the write, with every rank's ``part`` on rank 0
    (:mod:`.save_planner`). With ``done``
    (--checkpoint-async) the state is copied and written in the background: ``done(error or None)`` runs when
    this rank's part is over, and ``context.pending_save`` waits for it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state: dict[str, Any] = {}
    for index, model in enumerate(context.models):
        state[f"model{index}"] = get_model_state_dict(plain(model))
    for index, optimizer in enumerate(context.optimizers):
        owner = owner_of(context, optimizer)
        if owner is not None:
            state[f"optim{index}"] = get_optimizer_state_dict(plain(owner), optimizer.optimizer)
    planner = save_planner(planned, part)
    if done is None:
        dcp.save(state, checkpoint_id=directory, planner=planner)
        return
    future = dcp.async_save(state, checkpoint_id=directory, process_group=background_group(), planner=planner)
    assert isinstance(future, Future)  # the thread checkpointer's answer (a response object is the process one's)

    def finished(f) -> None:  # on DCP's thread, or right here if the write had finished already: done() waits for
        error = f.exception()  # what this thread does after it, and gathers, so it runs on a thread of its own
        said = f"{type(error).__name__}: {error}" if error is not None else None
        threading.Thread(target=done, args=(said,), name="nbtrain-save-done", daemon=True).start()

    future.add_done_callback(finished)
    context.save_in_background(future.result)


def background_group():
    """A gloo group of its own for background saves: their collectives must not interleave with training's."""
    import torch.distributed as dist

    world = dist.group.WORLD
    if not _async_group or _async_group[0] is not world:
        _async_group[:] = [world, dist.new_group(backend="gloo")]
    return _async_group[1]


def plain(model):
    """DDP's wrapper off (its state dict has no ``module.`` prefix then); a sharded model is itself."""
    return model if is_sharded(model) else getattr(model, "module", model)


def load_weights(model: nn.Module, folder: str) -> None:
    """``prepare(model, weights=FOLDER)``: the tensors of a folder of ``.safetensors`` files (a Hugging Face
    model's folder) into ``model`` by name, read with DCP — a sharded model's ranks each read their own slices."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    try:
        import safetensors  # noqa: F401  (the reader imports it only when it reads)
        from torch.distributed.checkpoint import HuggingFaceStorageReader
    except ImportError:
        raise PreparedError("prepare(..., weights=...) reads .safetensors files, which needs the safetensors "
                            "package on the ranks: pip install safetensors (or nbtrain[safetensors]).") from None
    if not os.path.isdir(folder) or not any(name.endswith(".safetensors") for name in os.listdir(folder)):
        raise PreparedError(f"prepare(..., weights={folder!r}): give a folder holding .safetensors files (a model's "
                            "folder as Hugging Face saves it).")
    model = plain(model)
    state = get_model_state_dict(model)
    try:
        dcp.load(state, storage_reader=HuggingFaceStorageReader(folder))
    except Exception as exc:
        raise PreparedError(f"the weights in {folder} do not fit {type(model).__name__}: {type(exc).__name__}: "
                            f"{exc}") from None
    set_model_state_dict(model, state)
