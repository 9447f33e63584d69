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

The hooks ask for the running cell's context when they run, as :func:`.shard._gradient_sync` does: a model kept in
a session is trained by later cells, each with its own meter.
"""

from __future__ import annotations

import torch
from torch import nn

from .state import TrainContext, current

RECOMPUTED = ("activation checkpointing runs each block's forward again in backward, and a FLOP count cannot tell "
              "those FLOPs from the model's")


def watch(context: TrainContext, model: nn.Module) -> None:
    """Measure ``model`` (sharded by FSDP2 just now) in this cell and the later cells that train it."""
    if context.settings.activation_checkpointing:
        context.meter.not_countable(RECOMPUTED)
    model.register_forward_pre_hook(_forward_began, prepend=True)
    model.register_forward_hook(_forward_ended)


def _forward_began(module: nn.Module, _args) -> None:
    if torch.is_grad_enabled():  # evaluation is no training step: neither counted nor timed
        context = current()
        if context.meter.flops.open and context.optimizers:  # the first step's FLOPs, as in prepare's _forward
            context.meter.training_forward(module, None)  # None: no copy of a sharded model runs (compiled: uncounted)
        context.meter.split.forward_began()


def _forward_ended(_module: nn.Module, _args, output) -> None:
    if torch.is_grad_enabled():
        current().meter.split.forward_ended(output)
