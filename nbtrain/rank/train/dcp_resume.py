"""Resuming prepared models and optimizers from a checkpoint: its DCP entries read in one load.

A ``--shard`` checkpoint names, for each model and optimizer, a key in one DCP folder (:func:`.shard.save_states`).
:func:`restore` reads every DCP entry of the objects one ``prepare()`` call holds with a single ``dcp.load`` —
one plan, one read of the folder's layout, one round of DCP's collectives — then hands each object its part. An
entry that is a whole state dict (a DDP checkpoint) is loaded as it is: by name into a sharded model.

DCP loads in place, into state of the right shapes, and an optimizer made afresh holds none: torch's
``get_optimizer_state_dict`` makes it by running the optimizer once with zero gradients, which costs as much as a
training step's update. :func:`_allocate_optimizer_state` allocates that state from the checkpoint's layout
instead, where the layout says all of it: the same hyperparameter names as the optimizer's own groups (the same
kind of optimizer), and each saved tensor either of its parameter's shape (then sharded as the parameter is) or
a scalar (a step count). Anything else keeps torch's way. State nbtrain allocated is also its own template: DCP
fills those tensors in place, so only the groups' plain values are set back (:func:`_allocated_template`), not
the whole state again through ``get_``/``set_optimizer_state_dict``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from . import dcp_reading
from .shard import is_sharded, owner_of, plain
from .state import TrainContext


def is_dcp_entry(saved) -> bool:
    return isinstance(saved, dict) and "dcp" in saved


def is_shards_entry(saved) -> bool:
    """A ``--shard hybrid --ft`` peer's entry (:func:`local_shards`): its own slices, for the rank that holds the
    same slices in another replica group."""
    return isinstance(saved, dict) and set(saved) == {"shards"}


def restore(context: TrainContext, folder: str, models: list[tuple[Any, Any]], optimizers: list[tuple[Any, Any]]) -> None:
    """Each ``(model, saved)`` and ``(optimizer, saved)`` pair's saved state into its object; ``folder`` holds the
    checkpoint file. The DCP entries of one DCP folder are read together."""
    reads: dict[str, dict] = {}  # DCP folder: the state to read there, by its checkpoint key
    layouts: dict[str, Any] = {}  # DCP folder: its layout, where an optimizer's state was allocated from it
    applies = []
    for model, saved in models:
        if is_dcp_entry(saved):
            applies.append(_model_template(plain(model), saved, reads.setdefault(saved["dcp"], {})))
        elif is_shards_entry(saved):
            _load_shards(model, None, saved["shards"])
        else:
            load_whole_model(model, saved)
    for optimizer, saved in optimizers:
        owner = owner_of(context, optimizer)
        inner = getattr(optimizer, "optimizer", optimizer)
        if is_dcp_entry(saved) and owner is not None:
            allocated = not inner.state and _allocate_optimizer_state(plain(owner), inner, saved["key"],
                                                                       _layout(layouts, folder, saved["dcp"]))
            template = _allocated_template if allocated else _optimizer_template
            applies.append(template(plain(owner), inner, saved, reads.setdefault(saved["dcp"], {})))
        elif is_shards_entry(saved) and owner is not None:
            _load_shards(owner, inner, saved["shards"])
        else:
            load_whole_optimizer(owner, inner, saved)
    for name, state in reads.items():
        dcp_reading.load(state, os.path.join(folder, name), layouts.get(name))
    for apply in applies:
        apply()


def _layout(layouts: dict, folder: str, name: str):
    """The layout of the DCP folder ``name``, read once (the load reuses it)."""
    if name not in layouts:
        layouts[name] = dcp_reading.read_checked_layout(os.path.join(folder, name))
    return layouts[name]


def _model_template(model, saved: dict, state: dict):
    """The model's own state dict under its key in ``state`` (DCP reads into it); returns what applies it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    template = state[saved["key"]] = get_model_state_dict(model)
    before = dict(template)

    def apply() -> None:
        if not _loaded_in_place(model, before, template):
            set_model_state_dict(model, template)

    return apply


def _loaded_in_place(model, before: dict, loaded: dict) -> bool:
    """Whether DCP's load left the model holding the checkpoint already: every entry of its state dict still the
    tensor it was (DCP copies into tensors and replaces anything else) and a view of the model's own parameter or
    buffer. Then ``set_model_state_dict`` would copy each tensor onto itself: milliseconds, for nothing."""
    from torch.distributed.tensor import DTensor

    def storage(tensor) -> int:
        return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).untyped_storage().data_ptr()

    live = {storage(tensor) for tensor in (*model.parameters(), *model.buffers())}
    return loaded.keys() == before.keys() and all(
        loaded[name] is tensor and isinstance(tensor, torch.Tensor) and storage(tensor) in live and
        storage(tensor) != 0 for name, tensor in before.items())


def _optimizer_template(model, optimizer, saved: dict, state: dict):
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state[saved["key"]] = get_optimizer_state_dict(model, optimizer)
    return lambda: set_optimizer_state_dict(model, optimizer, state[saved["key"]])


def _allocated_template(model, optimizer, saved: dict, state: dict):
    """Where nbtrain allocated the optimizer's state itself: its template made from that state directly (what
    ``get_optimizer_state_dict`` returns, without its generic walk). DCP loads the tensors in place, so only the
    groups' plain values (``lr``, ``betas``) are set back; anything else goes through ``set_optimizer_state_dict``."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = {param: name for name, param in model.named_parameters()}
    if any(param not in names for group in optimizer.param_groups for param in group["params"]):
        return _optimizer_template(model, optimizer, saved, state)  # it also steps another model's parameters
    own = {names[param]: dict(tensors) for param, tensors in optimizer.state.items()}
    groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": [names[p] for p in group["params"]]}
              for group in optimizer.param_groups]
    template = state[saved["key"]] = {"state": {name: dict(tensors) for name, tensors in own.items()},
                                      "param_groups": [dict(group) for group in groups]}

    def apply() -> None:
        if _only_values_to_set(optimizer, own, groups, template):
            for group, loaded in zip(optimizer.param_groups, template["param_groups"], strict=True):
                group.update((key, value) for key, value in loaded.items() if key != "params")
        else:
            set_optimizer_state_dict(model, optimizer, template)

    return apply


def _only_values_to_set(optimizer, own: dict, groups: list[dict], loaded: dict) -> bool:
    """Whether DCP's load left nothing for ``Optimizer.load_state_dict`` to do but the groups' plain values: every
    state tensor loaded in place, the groups holding the same parameters, and no optimizer that keeps its step
    counts on the device (``capturable``, ``fused``: load_state_dict moves them) or hooks its loading."""
    if getattr(optimizer, "_optimizer_load_state_dict_pre_hooks", None) or \
            getattr(optimizer, "_optimizer_load_state_dict_post_hooks", None):
        return False
    if any(group.get("capturable") or group.get("fused") for group in optimizer.param_groups):
        return False
    same_groups = len(loaded["param_groups"]) == len(groups) and all(
        mine["params"] == theirs.get("params") for mine, theirs in zip(groups, loaded["param_groups"], strict=True))
    in_place = loaded["state"].keys() == own.keys() and all(
        loaded["state"][name].keys() == tensors.keys() and all(loaded["state"][name][what] is tensor
                                                                for what, tensor in tensors.items())
        for name, tensors in own.items())
    return same_groups and in_place


def load_whole_model(model, saved: dict) -> None:
    """A whole state dict (a DDP checkpoint's) into ``model``, sharded or not."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model = plain(model)
    if is_sharded(model):
        set_model_state_dict(model, saved, options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(saved)


def load_whole_optimizer(owner, optimizer, saved: dict) -> None:
    """An optimizer's own state dict (a DDP checkpoint's) into ``optimizer``: into a sharded model's by name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if owner is not None and is_sharded(owner):
        set_optimizer_state_dict(owner, optimizer, by_name(owner, optimizer, saved),
                                 options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(saved)


def by_name(model, optimizer, saved: dict) -> dict:
    """An optimizer state dict keyed by parameter index (``Optimizer.state_dict()``) keyed by name instead."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = []
    start = 0
    for group in saved["param_groups"]:
        count = len(group["params"])
        groups.append({**group, "params": order[start:start + count]})
        start += count
    return {"state": {order[int(i)]: value for i, value in saved["state"].items()}, "param_groups": groups}


# ------------------------------------------------------------------------------------------ a peer's slices
def local_shards(model, optimizer=None) -> dict:
    """A sharded model's state dict (or, with ``optimizer``, that optimizer's, keyed by parameter name), each
    DTensor as this rank's slice: plain tensors, which a peer holding the same slices loads (:func:`_load_shards`)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map

    state = get_model_state_dict(model) if optimizer is None else get_optimizer_state_dict(model, optimizer)
    return {"shards": tree_map(lambda v: v.to_local().clone() if isinstance(v, DTensor) else v, state)}


def _load_shards(model, optimizer, state: dict) -> None:
    """A peer's :func:`local_shards` into ``model`` (or ``optimizer``): each slice made a DTensor as this rank's
    parameter of that name is laid out (an optimizer's per-parameter tensors: those of the parameter's shape)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    from torch.distributed.tensor import DTensor

    model = plain(model)
    params = dict(model.named_parameters())

    def laid_out(name: str, value):
        param = params.get(name)
        if not isinstance(param, DTensor) or not isinstance(value, torch.Tensor) or \
                tuple(value.shape) != tuple(param.to_local().shape) or param.dim() == 0:
            return value
        return DTensor.from_local(value.to(param.device), param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())

    if optimizer is None:
        set_model_state_dict(model, {name: laid_out(name, value) for name, value in state.items()})
        return
    per_param = {name: {what: laid_out(name, value) for what, value in tensors.items()}
                 for name, tensors in state["state"].items()}
    laid: Any = {**state, "state": per_param}  # torch types the optimizer's state dict loosely
    set_optimizer_state_dict(model, optimizer, laid)


# ------------------------------------------------------------------------------------------ optimizer state
def _allocate_optimizer_state(model, optimizer, key: str, layout) -> bool:
    """Give a stateless ``optimizer`` the (uninitialised) state its DCP entry ``key`` holds, as the module docstring
    says, and say whether it did; where the layout does not say all of it, leave the optimizer as it is."""
    saved_state, saved_groups = _entry_layout(layout, key)
    if not saved_state or saved_groups != [set(group) - {"params"} for group in optimizer.param_groups]:
        return False  # another kind of optimizer (or other groups): torch's own template, and its error if it is one
    parameters = dict(model.named_parameters())
    allocated: dict = {}
    for name, tensors in saved_state.items():
        param = parameters.get(name)
        if param is None:
            return False
        allocated[param] = {}
        for what, metadata in tensors.items():
            tensor = _empty_like_saved(param, metadata)
            if tensor is None:
                return False
            allocated[param][what] = tensor
    optimizer.state.update(allocated)
    return True


def _entry_layout(layout, key: str) -> tuple[dict[str, dict[str, Any]], list[set[str]] | None]:
    """From the layout, an optimizer entry's state (parameter name: {state name: its metadata}) and the names in
    each of its parameter groups (None where the layout holds what an optimizer's state dict does not)."""
    state: dict[str, dict[str, Any]] = {}
    groups: dict[int, set[str]] = {}
    paths = layout.planner_data if isinstance(layout.planner_data, dict) else {}
    for flat, metadata in layout.state_dict_metadata.items():
        path = paths.get(flat)
        if not path or path[0] != key:
            continue
        if len(path) == 4 and path[1] == "state":
            state.setdefault(path[2], {})[path[3]] = metadata
        elif len(path) == 4 and path[1] == "param_groups" and isinstance(path[2], int):
            groups.setdefault(path[2], set()).add(path[3])
        else:
            return state, None
    names = [groups[index] - {"params"} for index in sorted(groups)]
    return state, names if sorted(groups) == list(range(len(groups))) else None


def _empty_like_saved(param, metadata):
    """An empty tensor for a saved one: of the parameter's shape, its layout (a DTensor's sharding) and the saved
    dtype; a scalar as the optimizers keep their step counts (on the CPU; ``load_state_dict`` moves it where its
    optimizer keeps it); None for anything else."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not isinstance(metadata, TensorStorageMetadata):
        return None
    dtype = metadata.properties.dtype
    if tuple(metadata.size) == tuple(param.shape) and param.dim() > 0:
        return _empty_like_param(param, dtype)
    if len(metadata.size) == 0:
        return torch.empty((), dtype=dtype)
    return None


def _empty_like_param(param, dtype):
    """An empty tensor laid out as ``param``. A DTensor's is made from its local shard: ``torch.empty_like`` on the
    DTensor itself goes through DTensor's sharding propagation, whose first use in a rank took 4 ms here."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return torch.empty_like(param, dtype=dtype, requires_grad=False)
    local = torch.empty_like(param.to_local(), dtype=dtype, requires_grad=False)
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride())
