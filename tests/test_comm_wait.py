"""*comm* in the step split: the part of a DDP backward that waits for the gradient all-reduce after the last
gradient is computed (nbtrain.rank.train.commwait), and the advisor's reading of it."""

from __future__ import annotations

import pytest
import torch
from helpers.runhelp import run_cell

from nbtrain.kernel.diagnostics.advisor import Evidence, advise
from nbtrain.kernel.lifecycle.entry import format_summary
from nbtrain.rank.train.commwait import LastGradient


class Said:
    """Stands in for the step split: the order in which the marks and the parameters' gradients came."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def gradients_computed(self) -> None:
        self.said.append("computed")

    def gradients_reduced(self) -> None:
        self.said.append("reduced")


def test_the_last_gradient_is_learned_on_the_first_backward_then_marked_once_a_backward_after_every_gradient():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    split = Said()
    watch = LastGradient(model, split)
    model(torch.randn(2, 4)).sum().backward()
    assert split.said == []  # the first backward only learns which gradient comes last
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(lambda _p: split.said.append("gradient"))
    for _ in range(2):
        split.said.clear()
        model(torch.randn(2, 4)).sum().backward()
        # the watched parameter's own gradient follows its mark; the three others came before it
        assert split.said == ["gradient"] * 3 + ["computed", "gradient", "reduced"], split.said
    watch.close()
    split.said.clear()
    model(torch.randn(2, 4)).sum().backward()
    assert split.said == ["gradient"] * 4  # closed: no mark any more


def _evidence(splits: dict[int, dict[str, float]], on_cpu: bool = True) -> Evidence:
    evidence = Evidence()
    for rank, split in splits.items():
        evidence.add_setup(rank, {"precision": "fp32", "on_cpu": on_cpu, "steps_timed": 40, "split": split})
    return evidence


def test_the_advisor_says_when_steps_wait_for_the_all_reduce_and_names_the_rank_the_others_wait_for():
    even = {"data": 0.0, "forward": 20.0, "backward": 30.0, "comm": 40.0, "optimizer": 5.0, "other": 5.0}
    hint = next(h for h in advise(_evidence({0: even, 1: {**even, "comm": 38.0}})) if h.rule == "comm-wait")
    assert hint.text.startswith("40 % of each step on rank 0 waited for the gradient all-reduce after backward")
    assert "--grad-accum N" in hint.text and "bf16_compress_hook" in hint.text
    assert "fewer ranks than the machine has free cores" in hint.text and "NVLink" not in hint.text  # on the CPU
    on_gpus = _evidence({0: even, 1: {**even, "comm": 38.0}}, on_cpu=False)
    hint = next(h for h in advise(on_gpus) if h.rule == "comm-wait")
    assert "a faster link between the GPUs (NVLink, InfiniBand)" in hint.text and "free cores" not in hint.text
    slow_one = {**even, "backward": 65.0, "comm": 5.0}
    hint = next(h for h in advise(_evidence({0: even, 1: slow_one, 2: even})) if h.rule == "comm-wait")
    assert "against 5 % on rank 1: the other ranks wait for rank 1 at every all-reduce, so rank 1 is the straggler" \
        in hint.text, hint.text
    assert not [h for h in advise(_evidence({0: {**even, "comm": 10.0}})) if h.rule == "comm-wait"]
    for on_cpu in (True, False):
        sharded = _evidence({0: even, 1: {**even, "comm": 38.0}}, on_cpu=on_cpu)
        sharded.add_setup(0, {"shard": "FSDP2", "shard_ranks": 2, "blocks": 4})
        hint = next(h for h in advise(sharded) if h.rule == "comm-wait")
        assert hint.text.startswith("40 % of each step on rank 0 waited for FSDP2's gradient reduce-scatter (")
        assert "FSDP2 could not hide" in hint.text and "bf16_compress" not in hint.text
        assert ("--shard hybrid" in hint.text) is not on_cpu  # nodes of GPUs; a CPU run's ranks share one machine


STRAGGLER_CELL = """
import time, torch, nbtrain
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

def slower_here(grad):
    if rank == 1:
        time.sleep(0.02)  # rank 1's backward takes longer (a slower GPU, more work there)
    return grad

def hook_its_gradient(module, inputs, output):
    output.register_hook(slower_here)

net[0].register_forward_hook(hook_its_gradient)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
for step in range(40):
    nbtrain.backward(model(torch.randn(8, 64)).pow(2).mean())
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
def test_a_slower_ranks_backward_is_the_others_comm_and_the_advisor_names_it_the_straggler(pools):
    _, result = run_cell(pools, STRAGGLER_CELL)
    splits = {rank: next(f for f in facts if "split" in f)["split"] for rank, facts in result.setup.items()}
    for split in splits.values():
        assert list(split) == ["data", "forward", "backward", "comm", "optimizer", "other"]
        assert sum(split.values()) == pytest.approx(100.0, abs=0.01)
    # rank 0 computes its gradients at once, then waits ~20 ms a step for rank 1's share of the all-reduce
    assert splits[0]["comm"] > 50 and splits[0]["backward"] < 25, splits
    assert splits[1]["backward"] > 50 and splits[1]["comm"] < 15, splits
    lines = format_summary(result)
    assert f"{splits[0]['comm']:.0f} % comm" in lines[0], lines
    assert any("so rank 1 is the straggler" in line for line in lines), lines


SHARDED_CELL = """
import torch, nbtrain
torch.manual_seed(0)
net = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.001), shard=[torch.nn.Linear])
for step in range(40):
    nbtrain.backward(model(torch.randn(8, 256)).pow(2).mean())
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
def test_a_sharded_models_reduce_scatters_are_its_comm_and_the_advisor_speaks_of_them(pools):
    _, result = run_cell(pools, SHARDED_CELL, shard="full")
    splits = {rank: next(f for f in facts if "split" in f)["split"] for rank, facts in result.setup.items()}
    for split in splits.values():
        assert sum(split.values()) == pytest.approx(100.0, abs=0.01)
        # gloo's reduce-scatters block backward on the CPU: a large share of each step, out of backward
        assert split["comm"] > 5, splits
    lines = format_summary(result)
    assert f"{splits[0]['comm']:.0f} % comm" in lines[0], lines
    if max(split["comm"] for split in splits.values()) >= 25:  # the advisor's threshold
        assert any("waited for FSDP2's gradient reduce-scatter" in line for line in lines), lines


MARKS_AROUND_FSDP2 = """
import json, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from nbtrain.rank.train import shard_meter, state

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
for index in json.loads(sys.argv[1]):
    fully_shard(net[index])
model = fully_shard(net)
said = []
with state.scope(state.TrainSettings(), torch.device("cpu"), rank=0, world_size=1) as context:
    shard_meter.watch(context, model)
    waiting = model._get_fsdp_state()._state_ctx  # while its final callback is queued, it has not waited yet
    split = context.meter.split
    computed, reduced = split.gradients_computed, split.gradients_reduced
    split.gradients_computed = lambda: (said.append(["computed", waiting.post_backward_final_callback_queued]),
                                        computed())
    split.gradients_reduced = lambda: (said.append(["reduced", waiting.post_backward_final_callback_queued]),
                                       reduced())
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
    split.optimizer_began()
    split.optimizer_ended()
    phases = split.take()
print(json.dumps({"said": said, "phases": phases}))
"""


@pytest.mark.slow  # an interpreter of its own that imports torch and FSDP2: seconds, more under load
@pytest.mark.parametrize("blocks", [(0, 1), (0,), ()], ids=["output-is-a-blocks", "output-is-the-roots", "root-only"])
def test_a_sharded_models_marks_come_before_and_after_fsdp2s_wait_at_backwards_end(blocks):
    """On a GPU FSDP2 waits for its reduce-scatters in a callback queued when backward begins: the end of the
    computation is marked before it, the end of the communication after it — also when the model's output is its
    last block's, whose FSDP2 hook comes before the model's own. (In an interpreter of its own: gloo's group keeps
    a listening socket after it is destroyed.)"""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", MARKS_AROUND_FSDP2, json.dumps(list(blocks))], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["said"] == [["computed", True], ["reduced", False]] * 2
    phases = seen["phases"]
    assert phases["comm"] > 0 and phases["backward"] > 0 and phases["forward"] > 0, phases
