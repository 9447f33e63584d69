"""Collectives of plain values for nbtrain's own use, with nothing unpickled that a peer could make run code.

torch's object collectives (``all_gather_object``, ``gather_object``, ``broadcast_object_list``) unpickle what
the other ranks send, and the ranks' process group is set up through a store anyone on the machine (or the
nodes' network) can write to: whoever poses as a peer would run code in the rank. Here each value travels as the
bytes of ``torch.save`` in a uint8 tensor and is read back with ``torch.load(weights_only=True)``, which rebuilds
tensors and plain values (numbers, strings, lists, dicts, tuples) and refuses anything else — the same rule a
checkpoint file is read by. Text travels as UTF-8 bytes.
"""

from __future__ import annotations

import io
import pickle

import torch
import torch.distributed as dist

MAX_BYTES = 512 * 1024 * 1024  # one rank's part: far above RNG states and logged series, below a memory attack


class PeerValueError(RuntimeError):
    """A peer sent bytes that are not plain values (or claimed an absurd size); nothing of it was run."""


def all_gather_plain(value, device, group=None) -> list:
    """Every rank's ``value`` (tensors and plain values), in rank order, on every rank."""
    mine = _encoded(value, device)
    sizes = _sizes(len(mine), device, group)
    padded = _padded(mine, max(sizes))
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return [_decoded(part, size, rank) for rank, (part, size) in enumerate(zip(parts, sizes, strict=True))]


def gather_plain(value, device, group=None) -> list | None:
    """Every rank's ``value`` on the group's first rank, in rank order; None on the others."""
    mine = _encoded(value, device)
    first = dist.get_global_rank(group, 0) if group is not None else 0
    sizes = _sizes(len(mine), device, group)
    padded = _padded(mine, max(sizes))
    receiving = dist.get_rank() == first
    parts = [torch.empty_like(padded) for _ in sizes] if receiving else None
    dist.gather(padded, parts, dst=first, group=group)
    if parts is None:
        return None
    return [_decoded(part, size, rank) for rank, (part, size) in enumerate(zip(parts, sizes, strict=True))]


def broadcast_text(text: str | None, device, src: int = 0) -> str:
    """``src``'s text on every rank (the others pass None)."""
    data = (text or "").encode("utf-8")
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    length = _checked_size(int(size.item()), src)
    if not length:
        return ""
    buffer = _as_tensor(data, device) if dist.get_rank() == src else torch.empty(length, dtype=torch.uint8,
                                                                                  device=device)
    dist.broadcast(buffer, src=src)
    return buffer.cpu().numpy().tobytes().decode("utf-8", errors="replace")


def plain_bytes(value) -> bytes:
    """``value`` (tensors and plain values) as the bytes of ``torch.save``, which :func:`from_plain_bytes` reads."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def from_plain_bytes(data: bytes, rank: int):
    """What rank ``rank`` sent as :func:`plain_bytes`, read with ``weights_only=True``: a PeerValueError, and nothing
    run, for bytes that are not tensors and plain values, or over :data:`MAX_BYTES`."""
    _checked_size(len(data), rank)
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        raise PeerValueError(f"rank {rank} of the group sent nbtrain's checkpoint state that is not tensors and "
                             f"plain values ({type(exc).__name__}): refused, nothing of it was run. Something "
                             "other than the run's ranks may have joined its process group; run on a machine "
                             "whose other users you trust.") from exc


def _encoded(value, device) -> torch.Tensor:
    return _as_tensor(plain_bytes(value), device)


def _as_tensor(data: bytes, device) -> torch.Tensor:
    """Non-empty ``data`` as a uint8 tensor on ``device`` (torch.frombuffer refuses an empty buffer)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def _sizes(size: int, device, group) -> list[int]:
    mine = torch.tensor([size], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, mine, group=group)
    return [_checked_size(int(s.item()), rank) for rank, s in enumerate(sizes)]


def _checked_size(size: int, rank: int) -> int:
    if not 0 <= size <= MAX_BYTES:
        raise PeerValueError(f"rank {rank} of the group announced {size} bytes for nbtrain's checkpoint state "
                             f"(at most {MAX_BYTES} are accepted): refused. Something other than the run's ranks "
                             "may have joined its process group; run on a machine whose other users you trust.")
    return size


def _padded(data: torch.Tensor, length: int) -> torch.Tensor:
    padded = torch.zeros(max(length, 1), dtype=torch.uint8, device=data.device)
    padded[:len(data)] = data
    return padded


def _decoded(part: torch.Tensor, size: int, rank: int):
    return from_plain_bytes(part[:size].cpu().numpy().tobytes(), rank)
