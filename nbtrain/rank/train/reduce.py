"""Metrics averaged across ranks without waiting: ``nbtrain.log(loss=loss, reduce="mean")``.

The values of one ``log`` call are stacked into one small tensor on the rank's device and all-reduced
with ``async_op=True``: the call returns at once (on GPU the collective is queued behind the forward and
backward, no host synchronisation). The metrics thread waits for the collective when it sends the batch,
a fraction of a second later. Every rank must make the same ``log(..., reduce=...)`` calls in the same
order — they are collectives.
"""

from __future__ import annotations

OPERATIONS = ("mean", "sum", "max", "min")


class _SharedWork:
    __slots__ = ("work",)

    def __init__(self, work) -> None:
        self.work = work

    def wait(self) -> None:
        work, self.work = self.work, None
        if work is not None:
            work.wait()


class ReducedValue:
    """One all-reduced metric; :meth:`wait_value` gives the tensor once the collective is done."""

    __slots__ = ("_work", "_buffer", "_index", "_divisor")

    def __init__(self, work: _SharedWork, buffer, index: int, divisor: int) -> None:
        self._work, self._buffer, self._index, self._divisor = work, buffer, index, divisor

    def wait_value(self):
        self._work.wait()
        value = self._buffer[self._index]
        return value / self._divisor if self._divisor != 1 else value


def reduce_values(values: dict, how: str) -> dict:
    import torch
    import torch.distributed as dist

    if how not in OPERATIONS:
        raise ValueError(f"nbtrain.log(reduce=...) is one of {', '.join(OPERATIONS)} (got {how!r}).")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)), None)
    if device is None or (dist.get_backend() == "nccl" and device.type != "cuda"):
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    parts = []
    for value in values.values():
        if isinstance(value, torch.Tensor):
            value = value.detach()
            parts.append((value.float().mean() if value.numel() != 1 else value.reshape(())).float().to(device, non_blocking=True))
        else:  # a Python number: a pinned copy goes to the GPU without waiting for it
            number = torch.tensor(float(value))
            parts.append(number.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else number)
    buffer = torch.stack(parts)
    op = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[how]
    work = _SharedWork(dist.all_reduce(buffer, op=op, async_op=True))
    divisor = dist.get_world_size() if how == "mean" else 1
    return {name: ReducedValue(work, buffer, i, divisor) for i, name in enumerate(values)}
