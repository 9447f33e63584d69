"""Results that hold DTensors — a sharded model's ``state_dict()``, one of its parameters — come back whole.

A DTensor pickled on rank 0 and rebuilt in the notebook holds rank 0's shard alone, and its mesh names process
groups the kernel does not have: ``w.sum()`` there silently gives rank 0's part, and ``w.full_tensor()`` fails.
So each DTensor among the names a cell assigns (at the top, or inside dicts, lists and tuples) is gathered whole
on every rank (``full_tensor()``, a collective), detached, and sent in its place. The ranks first agree on how
many each holds: where they differ (a DTensor assigned on some ranks only), none is gathered — the collectives
would not match — and the name is reported skipped with how to gather it in the cell.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...wire.payload import StaysOnTheRanks

VISIT_LIMIT = 100_000  # items looked at per name: a long list of numbers is not searched to its end


def whole(namespace: dict, names, device, limit: int | None) -> dict:
    """``names``' values with every DTensor in them gathered whole (a collective: every rank calls this with the
    same names); only the names that held one. A name whose DTensors are larger whole than ``limit`` (--out-limit)
    stays on the ranks, said why, and so does one that holds DTensors on some ranks only."""
    names = list(names)
    counts = _agreed_counts([_count(namespace.get(name)) for name in names], device)
    sent: dict = {}
    for name, count in zip(names, counts, strict=True):
        if count is None:
            sent[name] = StaysOnTheRanks("it holds DTensors on some ranks only, so they cannot be gathered here; "
                                         "gather them in the cell on every rank (x.full_tensor())")
        elif count:
            size = _whole_bytes(namespace[name])  # of the whole tensors: the same on every rank, as the decision
            if limit is not None and size > limit:
                sent[name] = StaysOnTheRanks(f"its DTensors are {size / 2**20:.1f} MiB whole, over --out-limit "
                                             f"({limit / 2**20:.1f} MiB); raise the limit, or save them with "
                                             "nbtrain.save_checkpoint()")
            else:
                sent[name] = _gathered(namespace[name])
    return sent


def _agreed_counts(counts: list[int], device) -> list[int | None]:
    """Each name's count of DTensors where every rank holds as many; None where the ranks differ."""
    if not counts or not dist.is_initialized() or dist.get_world_size() == 1:
        return list(counts)
    both = torch.tensor(counts + [-c for c in counts], dtype=torch.int64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)  # the largest count and, negated, the smallest, in one collective
    most, least = both[:len(counts)].tolist(), (-both[len(counts):]).tolist()
    return [high if high == low else None for high, low in zip(most, least, strict=True)]


def _is_dtensor(value) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _children(value) -> list:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, (list, tuple)):
        return list(value)
    return []


def _dtensors(value) -> list:
    found, pending, visited = [], [value], 0
    while pending and visited < VISIT_LIMIT:
        item = pending.pop()
        visited += 1
        if _is_dtensor(item):
            found.append(item)
        elif not isinstance(item, torch.Tensor):
            pending.extend(reversed(_children(item)))
    return found


def _count(value) -> int:
    return len(_dtensors(value))


def _whole_bytes(value) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in _dtensors(value))  # a DTensor counts whole


def _gathered(value):
    """``value`` with each DTensor replaced by its whole tensor, visited in the same order on every rank."""
    if _is_dtensor(value):
        return value.full_tensor().detach()
    if isinstance(value, dict):
        pairs = [(key, _gathered(item)) for key, item in value.items()]
        try:
            return type(value)(pairs)  # an OrderedDict stays one
        except TypeError:  # a dict type made otherwise (defaultdict)
            return dict(pairs)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_gathered(item) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_gathered(item) for item in value)
    return value
