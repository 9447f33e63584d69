"""Mixed precision (``--amp``): which dtype, the autocast context, the GradScaler, fp32 outputs.

Modes: ``bf16`` and ``fp16`` run the forward of prepared models under :func:`torch.autocast`; ``off``
runs in fp32. Left out (``auto``): bf16 on GPUs that support it (Ampere and newer), fp16 on older GPUs,
off on CPU — ``--amp bf16`` on CPU is honoured, and so is ``--amp fp16``.

fp16 has a narrow range, so its gradients are scaled by a :class:`torch.amp.GradScaler`: the loss is
multiplied before backward, the gradients divided before the step, and a step whose gradients hold inf
or NaN is skipped (the scale then shrinks). bf16 has fp32's range and needs no scaler.

Outputs of a prepared model are cast back to fp32 (as 🤗 Accelerate does), so a loss computed outside the
model is computed in full precision.

These are plain functions of a dtype and a device; ``with nbtrain.autocast():`` — the cell's own
precision — is in :mod:`nbtrain.rank.train.steps`.
"""

from __future__ import annotations

import contextlib


def resolve_dtype(mode: str, device):
    """The autocast dtype for ``mode`` on ``device``, or None for fp32."""
    import torch

    if mode == "off":
        return None
    if mode == "bf16":
        return torch.bfloat16
    if mode == "fp16":
        return torch.float16
    if device.type == "cuda":  # auto
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None


def make_scaler(dtype, device):
    """A GradScaler for fp16, None otherwise."""
    import torch

    if dtype is not torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


def autocast_context(dtype, device):
    import torch

    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def outputs_to_fp32(value):
    """Cast half-precision floating tensors in (nested tuples, lists, dicts of) outputs to fp32."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(outputs_to_fp32(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(outputs_to_fp32(v) for v in value)
    if isinstance(value, dict):
        try:
            return type(value)((k, outputs_to_fp32(v)) for k, v in value.items())
        except TypeError:  # a dict subclass whose constructor takes other arguments
            return {k: outputs_to_fp32(v) for k, v in value.items()}
    return value

