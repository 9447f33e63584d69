"""nbtrain.prepare(), AMP, gradient accumulation and metrics inside real ranks (2 ranks, gloo, CPU).

The tests of this module share one warm pool (the same PoolSpec), so only the first pays for starting
the ranks; the module's teardown stops it and checks that no rank is left.
"""

from __future__ import annotations

import pytest
from helpers.runhelp import DTYPE_PROBE, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError

pytestmark = pytest.mark.timeout(240)


SETUP = """
import torch, nbtrain
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
"""


def test_prepare_shards_the_loader_and_advances_the_epoch(pools):
    ns, _ = run_cell(pools, SETUP + """
dataset = TensorDataset(torch.arange(20))
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(dataset, batch_size=5, shuffle=True)
model, opt, loader = nbtrain.prepare(model, opt, loader, find_unused_parameters=True)
seen = []
for epoch in range(2):
    seen.append([int(i) for (batch,) in loader for i in batch])
everyone = [None, None]
dist.all_gather_object(everyone, seen)
kinds = (isinstance(model, torch.nn.parallel.DistributedDataParallel), isinstance(opt, torch.optim.Optimizer),
         isinstance(loader, DataLoader), model.find_unused_parameters, loader.pin_memory, loader.batch_size,
         loader.epoch, type(loader.sampler).__mro__[1].__name__)
""", out="everyone,kinds")
    everyone = ns["everyone"]
    for epoch in range(2):
        rank0, rank1 = everyone[0][epoch], everyone[1][epoch]
        assert len(rank0) == len(rank1) == 10
        assert sorted(rank0 + rank1) == list(range(20)), "the two shards must cover the dataset exactly once"
    assert everyone[0][0] != everyone[0][1], "set_epoch was not advanced: both epochs have the same order"
    assert ns["kinds"] == (True, True, True, True, False, 5, 2, "DistributedSampler")


def test_prepare_refuses_twice_and_wrapped_models(pools):
    ns, _ = run_cell(pools, SETUP + """
from nbtrain.rank.train.prepare import PreparedError
model = torch.nn.Linear(2, 2)
prepared = nbtrain.prepare(model)
messages = []
for bad in (lambda: nbtrain.prepare(model), lambda: nbtrain.prepare(prepared),
            lambda: nbtrain.prepare(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))),
            lambda: nbtrain.prepare(DataLoader(torch.utils.data.TensorDataset(torch.arange(4)), batch_size=None)),
            lambda: nbtrain.prepare("model")):
    try:
        bad()
    except PreparedError as exc:
        messages.append(str(exc))
""", out="messages")
    messages = ns["messages"]
    assert len(messages) == 5
    assert "already prepared in this cell" in messages[0]
    assert "already returned by nbtrain.prepare()" in messages[1]
    assert "already wrapped in DistributedDataParallel" in messages[2] and "model.module" in messages[2]
    assert "batch_sampler" in messages[3]
    assert "not str" in messages[4]


def test_bf16_autocast_on_cpu_inside_forward_only(pools):
    cell = SETUP + DTYPE_PROBE + """
model = nbtrain.prepare(probe)
out = model(torch.randn(3, 8))
with nbtrain.autocast():
    manual = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(4, 4)).dtype
outside = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(4, 4)).dtype
dtypes = (str(probe.seen), str(out.dtype), str(manual), str(outside))
"""
    ns, _ = run_cell(pools, cell, amp="bf16", out="dtypes")
    assert ns["dtypes"] == ("torch.bfloat16", "torch.float32", "torch.bfloat16", "torch.float32")
    ns, _ = run_cell(pools, cell, out="dtypes")  # the default on CPU is fp32
    assert ns["dtypes"] == ("torch.float32",) * 4


ACCUMULATION = SETUP + """
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 6), torch.randint(0, 3, (64,)))
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
model, opt, loader = nbtrain.prepare(net, opt, DataLoader(data, batch_size=BATCH))
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
syncs = []
def counting_hook(state, bucket):
    syncs.append(1)
    return allreduce_hook(dist.group.WORLD, bucket)
model.register_comm_hook(None, counting_hook)
for epoch in range(2):
    for x, y in loader:
        nbtrain.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
weights = [p.detach().clone() for p in net.parameters()]
result = (weights, len(syncs), nbtrain.training_state().step)
"""


def test_accumulation_equals_the_large_batch_and_skips_all_reduces(pools):
    small, _ = run_cell(pools, ACCUMULATION.replace("BATCH", "4"), grad_accum=4, out="result")
    large, _ = run_cell(pools, ACCUMULATION.replace("BATCH", "16"), grad_accum=1, out="result")
    import torch

    accumulated, syncs, steps = small["result"]
    reference, reference_syncs, reference_steps = large["result"]
    # 64 samples / 2 ranks / 4 per micro-batch = 8 micro-steps an epoch → 2 optimizer steps, 2 all-reduces
    assert steps == reference_steps == 4
    assert syncs == reference_syncs == 4, "micro-steps inside a window must not all-reduce"
    for a, b in zip(accumulated, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_accumulation_needs_nbtrain_backward(pools):
    with pytest.raises(RankFailedError, match="needs nbtrain.backward"):
        run_cell(pools, SETUP + """
net = torch.nn.Linear(2, 1)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
model(torch.ones(1, 2)).sum().backward()
opt.step()
""", grad_accum=2)


def test_fp16_scaler_on_cpu_skips_an_inf_step(pools):
    """The GradScaler path (the GPU's fp16 path) on CPU: a step with an inf gradient changes nothing."""
    ns, _ = run_cell(pools, SETUP + """
net = torch.nn.Linear(4, 1)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
state = nbtrain.training_state()
x = torch.randn(8, 4)
before = [p.detach().clone() for p in net.parameters()]
nbtrain.backward(model(x).sum() * float("inf"))
opt.step(); opt.zero_grad()
after_inf = [p.detach().clone() for p in net.parameters()]
# Small inputs: with the scale at 2**15, larger gradients would overflow fp16 and (rightly) skip this step too.
nbtrain.backward(model(x * 1e-3).pow(2).mean())
opt.step(); opt.zero_grad()
after_good = [p.detach().clone() for p in net.parameters()]
result = (all(torch.equal(a, b) for a, b in zip(before, after_inf)),
          any(not torch.equal(a, b) for a, b in zip(after_inf, after_good)),
          state.steps_skipped, state.step, state.scaler is not None, str(state.amp_dtype))
""", amp="fp16", out="result")
    assert ns["result"] == (True, True, 1, 2, True, "torch.float16")


def test_ten_thousand_metrics_arrive_complete_and_in_order(pools):
    _, result = run_cell(pools, SETUP + """
for i in range(10_000):
    nbtrain.log(loss=torch.tensor(float(i)), lr=0.5)
for i in range(3):
    nbtrain.log(rank_mean=float(rank), reduce="mean")
    nbtrain.log(rank_max=torch.tensor(float(rank * 10 + i)), reduce="max")
""")
    history = result.history
    for rank in (0, 1):
        series = history.series("loss", rank=rank)
        assert series.steps == list(range(10_000))
        assert series.values == [float(i) for i in range(10_000)]
        assert len(history.series("lr", rank=rank)) == 10_000
        assert history.series("rank_mean", rank=rank).values == [0.5, 0.5, 0.5]
        assert history.series("rank_max", rank=rank).values == [10.0, 11.0, 12.0]


def test_logged_tensors_keep_their_value_whatever_their_dtype(pools):
    """CPU tensors are read one by one, not stacked as float32: a float64 value is not rounded, an integer
    count or a flag becomes a float, a vector its mean."""
    _, result = run_cell(pools, SETUP + """
nbtrain.log(precise=torch.tensor(0.1, dtype=torch.float64), count=torch.tensor(3), flag=torch.tensor(True),
            vector=torch.tensor([1.0, 4.0]), plain=0.25)
""")
    logged = {name: result.history.series(name, rank=0).values for name in ("precise", "count", "flag", "vector", "plain")}
    assert logged == {"precise": [0.1], "count": [3.0], "flag": [1.0], "vector": [2.5], "plain": [0.25]}
    assert all(type(values[0]) is float for values in logged.values())


def test_a_scheduler_made_in_the_notebook_steps_without_pytorchs_order_warning(pools):
    import torch

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    namespace = {"model": model, "opt": opt, "sched": torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)}
    run_cell(pools, SETUP + """
import warnings
model, opt, sched = nbtrain.prepare(model, opt, sched)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(4):
        model(torch.randn(4, 3)).sum().backward()
        opt.step(); opt.zero_grad(); sched.step()
warned = [str(w.message) for w in caught]
everyone = [None, None]
dist.all_gather_object(everyone, warned)
lr = sched.get_last_lr()
""", namespace, out="everyone,lr")
    assert namespace["everyone"] == [[], []], namespace["everyone"]
    assert namespace["lr"] == [0.1 * 0.5 ** 2]
