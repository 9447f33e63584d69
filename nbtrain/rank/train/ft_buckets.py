"""Summing many tensors across ``--ft`` replica groups in a few all-reduces: the tensors laid end to end in flat
buckets of one dtype and device, as DDP's buckets are, instead of one all-reduce (and one round trip over the
network) per parameter. Every group lays out the same tensors in the same order, so the buckets match."""

from __future__ import annotations

from collections import deque
from typing import Any

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb
IN_FLIGHT = 4  # buckets summed at once: communication overlaps, and the extra memory stays 100 MiB at most


def buckets(tensors: list, cap_bytes: int = BUCKET_BYTES) -> list[list]:
    """``tensors`` in order, cut into runs of one dtype and device of at most ``cap_bytes`` each (a bigger tensor
    is a bucket of its own)."""
    out: list[list] = []
    size = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        last = out[-1][-1] if out else None
        if last is None or (last.dtype, last.device) != (tensor.dtype, tensor.device) or size + nbytes > cap_bytes:
            out.append([])
            size = 0
        out[-1].append(tensor)
        size += nbytes
    return out


def sum_across_groups(manager: Any, tensors: list, scale: float = 1.0, cap_bytes: int = BUCKET_BYTES,
                      in_flight: int = IN_FLIGHT) -> None:
    """Each of ``tensors`` replaced in place by its sum over the quorum's groups (torchft's ``Manager.allreduce``),
    times ``scale``: up to ``in_flight`` buckets' all-reduces under way at once, so the copies they need stay a
    few buckets' worth, not a second copy of every gradient. A lost peer makes torchft report the error at
    ``should_commit``; the tensors then hold whatever the all-reduce left."""
    import torch
    from torch.distributed import ReduceOp

    pending: deque = deque()
    with torch.no_grad():  # parameters among the tensors (step 0's weights): no graph for the flat copies
        for group in buckets(tensors, cap_bytes):
            buffer = torch.cat([t.reshape(-1) for t in group])
            pending.append((group, buffer, manager.allreduce(buffer, reduce_op=ReduceOp.SUM)))
            if len(pending) >= in_flight:
                _copy_back(pending.popleft(), scale)
        while pending:
            _copy_back(pending.popleft(), scale)


def _copy_back(summing: tuple, scale: float) -> None:
    """Wait for one bucket's sum, and put it (scaled) back into its tensors (under ``no_grad``: the caller's)."""
    group, buffer, work = summing
    work.wait()
    if scale != 1.0:
        buffer.mul_(scale)
    offset = 0
    for tensor in group:
        tensor.copy_(buffer[offset:offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()
