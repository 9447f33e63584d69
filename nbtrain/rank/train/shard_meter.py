"""A sharded model's training steps measured as a DDP model's are: its first step's FLOPs and its forward time.

A DDP model goes through ``prepare()``'s own forward (:mod:`.prepare`), which starts the FLOP count
(:mod:`.flops`) at the first training forward and marks the forward for the step split (:mod:`.stepsplit`). A
model sharded by ``--shard`` is FSDP2's module, whose forward nbtrain does not wrap: two module hooks do the same.
The one before forward is put first, before FSDP2's own (which all-gathers the parameters), and the one after runs
after FSDP2's (which frees them again), so the forward phase holds FSDP2's communication as DDP's holds its
broadcast; the backward that follows is marked from the forward's output, as for DDP.

FlopCounterMode counts the matrix products FSDP2's forward and backward run on the gathered parameters: the
FLOPs of the rank's own batch through the whole model, as for DDP. Under activation checkpointing backward runs
each block's forward again; a count cannot tell those FLOPs from the model's, so there is none, and the summary
says why (MFU counts the model's FLOPs only).

**Communication in backward** (*comm* in the step split, as for DDP: :mod:`.commwait`). Each block's backward
ends with its gradients' reduce-scatter. On a GPU it runs on a stream of its own, beside the next block's backward,
and FSDP2 waits for the last ones in a callback the autograd engine runs when backward ends, queued by the first
of its hooks on a module's output that backward reaches. Callbacks run in the order they were queued, so nbtrain
hooks each FSDP2 module's output before FSDP2 does (a forward hook put before FSDP2's own: the model's output is
often its last block's); the first of these hooks backward reaches queues a callback ahead of FSDP2's, which marks
the end of the computation and queues one more after FSDP2's, which marks the end of the wait. On the CPU gloo's
reduce-scatter blocks backward where it is called: each one is timed, through FSDP2's public
``set_custom_reduce_scatter``, and taken out of *backward* too. (HSDP's all-reduce after it stays in *backward*.)

The hooks ask for the running cell's context when they run, as :func:`.shard._gradient_sync` does: a model kept in
a session is trained by later cells, each with its own meter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .commwait import queue_at_backward_end
from .state import TrainContext, current
from .stepsplit import first_tensor

RECOMPUTED = ("activation checkpointing runs each block's forward again in backward, and a FLOP count cannot tell "
              "those FLOPs from the model's")


def watch(context: TrainContext, model: nn.Module) -> None:
    """Measure ``model`` (sharded by FSDP2 just now) in this cell and the later cells that train it."""
    if context.settings.activation_checkpointing:
        context.meter.not_countable(RECOMPUTED)
    model.register_forward_pre_hook(_forward_began, prepend=True)
    model.register_forward_hook(_forward_ended)
    _BackwardEnd(model)
    if context.device.type == "cpu":
        _time_reduce_scatters(model)


def _forward_began(module: nn.Module, _args) -> None:
    if torch.is_grad_enabled():  # evaluation is no training step: neither counted nor timed
        context = current()
        if context.meter.flops.open and context.optimizers:  # the first step's FLOPs, as in prepare's _forward
            context.meter.training_forward(module, None)  # None: no copy of a sharded model runs (compiled: uncounted)
        context.meter.split.forward_began()


def _forward_ended(_module: nn.Module, _args, output) -> None:
    if torch.is_grad_enabled():
        current().meter.split.forward_ended(output)


class _BackwardEnd:
    """Marks where one sharded model's backward computed its last gradient and where FSDP2's wait for its
    reduce-scatters ended (see the module docstring), once per backward."""

    def __init__(self, model: nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule

        self._root = model
        self._queued = False  # this backward's marks are queued
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.register_forward_hook(self._output_ready, prepend=True)

    def _output_ready(self, module: nn.Module, _args, output) -> None:
        if module is self._root:
            self._queued = False  # a backward that failed never ran its callbacks
        if torch.is_grad_enabled() and (tensor := first_tensor(output, lambda t: t.requires_grad)) is not None:
            tensor.register_hook(self._backward_reached)

    def _backward_reached(self, _grad) -> None:
        if not self._queued:
            self._queued = True
            split = current().meter.split
            queue_at_backward_end(lambda: self._computed(split))

    def _computed(self, split) -> None:
        self._queued = False
        split.gradients_computed()
        queue_at_backward_end(split.gradients_reduced)  # after FSDP2's final callback, queued after this one


def _time_reduce_scatters(model: nn.Module) -> None:
    """Every FSDP2 module of ``model`` reduce-scatters through :class:`_TimedReduceScatter` (a module whose
    parameters FSDP2 split into several groups refuses a custom one: its reduce-scatters stay in *backward*)."""
    from torch.distributed.fsdp import FSDPModule

    timed = _timed_reduce_scatter()
    if timed is None:
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            try:
                module.set_custom_reduce_scatter(timed)
            except ValueError:
                continue


def _timed_reduce_scatter():
    """A reduce-scatter for FSDP2 that tells the running cell's step split when it blocked backward (None with a
    torch whose FSDP2 has no ``ReduceScatter`` interface)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError:
        return None

    # reduce_scatter_single is the name FSDP2's own uses; older torch has only reduce_scatter_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    class _TimedReduceScatter(ReduceScatter):
        def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op=False):
            split = current().meter.split
            split.collective_began()
            try:
                return reduce_scatter(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
            finally:
                split.collective_ended()

    return _TimedReduceScatter()
