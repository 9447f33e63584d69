"""Summing across --ft replica groups in buckets (nbtrain/rank/train/ft_buckets.py): the layout, and the sum through a
stand-in Manager that sums two groups' buffers as torchft's all-reduce would (the real one: the HSDP --ft tests)."""

from __future__ import annotations

import torch

from nbtrain.rank.train.ft_buckets import buckets, sum_across_groups


class _Done:
    def wait(self) -> None:
        pass


class _TwoGroups:
    """A Manager whose all-reduce adds what the other group holds: the same buffer, plus one."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []

    def allreduce(self, tensor: torch.Tensor, reduce_op=None) -> _Done:
        self.calls.append(tensor)
        tensor.mul_(2).add_(1)
        return _Done()


def test_buckets_keep_order_and_cut_at_the_cap_and_at_a_new_dtype():
    a, b, c = torch.zeros(4), torch.zeros(4), torch.zeros(8)  # 16, 16, 32 bytes
    half = torch.zeros(2, dtype=torch.float16)
    assert [[id(t) for t in bucket] for bucket in buckets([a, b, c, half], cap_bytes=32)] == \
        [[id(a), id(b)], [id(c)], [id(half)]]
    big = torch.zeros(100)
    assert [len(bucket) for bucket in buckets([a, big, b], cap_bytes=32)] == [1, 1, 1]


def test_many_gradients_are_summed_in_a_few_all_reduces_and_scaled():
    grads = [torch.full((3, 2), float(i)) for i in range(50)] + [torch.ones(5, dtype=torch.float64)]
    manager = _TwoGroups()
    sum_across_groups(manager, grads, scale=0.5)
    assert len(manager.calls) == 2  # one bucket of float32, one of float64: not 51 round trips
    for i, grad in enumerate(grads[:50]):
        assert torch.equal(grad, torch.full((3, 2), (2 * i + 1) * 0.5))
    assert torch.equal(grads[50], torch.full((5,), 1.5, dtype=torch.float64))


class _Pending:
    def __init__(self, log: list, tensor: torch.Tensor) -> None:
        self.log, self.tensor = log, tensor

    def wait(self) -> None:
        self.tensor.mul_(2)
        self.log.append("wait")


class _Counting:
    """A Manager whose all-reduces finish when waited for (two groups holding the same values)."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def allreduce(self, tensor: torch.Tensor, reduce_op=None) -> _Pending:
        self.log.append("send")
        return _Pending(self.log, tensor)


def test_no_more_than_a_few_buckets_are_under_way_at_once():
    """The flat copies are a few buckets' worth, not a second copy of every gradient."""
    grads = [torch.full((4,), float(i)) for i in range(10)]  # 16 bytes each: a bucket each at a cap of 16
    manager = _Counting()
    sum_across_groups(manager, grads, cap_bytes=16, in_flight=3)
    under_way = peak = 0
    for what in manager.log:
        under_way += 1 if what == "send" else -1
        peak = max(peak, under_way)
    assert manager.log.count("send") == 10 and peak == 3
    assert all(torch.equal(grad, torch.full((4,), 2.0 * i)) for i, grad in enumerate(grads))


def test_parameters_are_summed_in_place_without_a_graph():
    """Step 0's weights are parameters (they require grad): summed in place, and no flat copy keeps a graph."""
    weight = torch.nn.Parameter(torch.ones(3))
    manager = _TwoGroups()
    sum_across_groups(manager, [weight])
    assert torch.equal(weight.detach(), torch.full((3,), 3.0)) and weight.grad_fn is None
    assert not manager.calls[0].requires_grad
