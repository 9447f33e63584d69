"""The FLOPs of one forward and backward of a compiled model, counted on a copy of it that holds no memory.

The FLOP count of :mod:`.flops` is a dispatch mode around the first real step; Dynamo runs nothing compiled under
one (the step would run eagerly, and a ``fullgraph=True`` model raises). A compiled model is counted apart, once,
before its first training forward: a copy of the uncompiled module with every parameter and buffer on the meta
device — shapes only, no memory, nothing computed — runs that forward's arguments (on the meta device too) forward
and backward under ``FlopCounterMode``. Matrix products count the same on any device and in any precision, so the
count is the real step's. A forward that needs real values (``.item()``, data-dependent shapes), a module that
cannot be copied or an input of a kind not known here raises: the caller says the model is not counted, and why.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .speed import uncompile
from .stepsplit import first_tensor


def count_on_meta(model: nn.Module, args: tuple, kwargs: dict) -> int:
    """FLOPs of ``model(*args, **kwargs)`` forward and backward (the first output that carries a gradient, summed),
    run uncompiled on a meta-device copy of ``model``."""
    original = getattr(model, "_orig_mod", model)  # torch.compile(model): the module it compiled
    memo: dict = {id(t): _meta_like(t) for t in itertools.chain(original.parameters(), original.buffers())}
    shadow = copy.deepcopy(original, memo)
    for module in shadow.modules():
        uncompile(module)  # module.compile(): the copy runs eagerly
        for hooks in _MODULE_HOOKS:  # the copy's own: the cell's hooks must not see its meta tensors
            getattr(module, hooks, {}).clear()
    with FlopCounterMode(display=False) as mode:
        out = shadow(*_to_meta(args), **_to_meta(kwargs))
        carrier = first_tensor(out, lambda t: t.requires_grad)
        if carrier is not None:
            carrier.sum().backward()
    return int(mode.get_total_flops())


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _meta_like(tensor: torch.Tensor) -> torch.Tensor:
    meta = torch.empty_like(tensor, device="meta")
    return nn.Parameter(meta, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta


def _to_meta(value):
    """``value`` with each tensor in it replaced by an empty one of its shape on the meta device."""
    if isinstance(value, torch.Tensor):
        meta = torch.empty_like(value, device="meta")
        return meta.requires_grad_() if value.requires_grad else meta
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_to_meta(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, Mapping):  # a dict, or a tokenizer's BatchEncoding: the model reads it by key
        return {k: _to_meta(v) for k, v in value.items()}
    return value
