"""Resuming a --shard checkpoint (2 ranks, gloo, CPU): the models and optimizers of one prepare() call read in one DCP
load, an optimizer's state allocated from the checkpoint's layout — no optimizer step to make it — and torch's own
way kept where the layout does not say all of it.
"""

from __future__ import annotations

import pytest
from helpers.runhelp import run_cell
from helpers.sharding import CURVE, MODEL

pytestmark = pytest.mark.timeout(300)

# CURVE, counting during prepare() the DCP loads (the keys each reads) and the optimizer's steps
COUNTED = CURVE.replace("model, opt = nbtrain.prepare(model, opt)", """
from nbtrain.rank.train import dcp_reading
reading, loads, steps = dcp_reading.load, [], []
def counted_load(state, *args):
    loads.append(sorted(state))
    return reading(state, *args)
stepping = opt.step
def counted_step(*args, **kwargs):
    steps.append(1)
    return stepping(*args, **kwargs)
import torch.distributed.checkpoint.state_dict as torch_state_dict
setting, sets = torch_state_dict.set_optimizer_state_dict, []
def counted_set(*args, **kwargs):
    sets.append(1)
    return setting(*args, **kwargs)
dcp_reading.load, opt.step, torch_state_dict.set_optimizer_state_dict = counted_load, counted_step, counted_set
model, opt = nbtrain.prepare(model, opt)
dcp_reading.load, torch_state_dict.set_optimizer_state_dict = reading, setting
at_prepare = (loads, len(steps), len(sets))
""")

# Plain SGD keeping a state of a shape no parameter has: the layout does not say how to lay it out over the ranks
TALLIED = MODEL + """
class TalliedSGD(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["tally"] = torch.zeros(2)
                state["tally"] += torch.tensor([1.0, group["lr"]])  # steps taken, learning rate summed
                p.add_(p.grad, alpha=-group["lr"])
torch.manual_seed(1)
model = Net()
opt = TalliedSGD(model.parameters(), lr=0.05)
model, opt = nbtrain.prepare(model, opt)
curve = []
for epoch in nbtrain.epochs(EPOCHS):
    loss = F.cross_entropy(model(X), Y)
    nbtrain.backward(loss)
    opt.step(); opt.zero_grad()
    curve.append(round(loss.item(), 6))
    nbtrain.save_checkpoint()
tallies = sorted({tuple(round(v, 6) for v in state["tally"].tolist()) for state in opt.optimizer.state.values()})
"""


def test_a_resume_reads_model_and_optimizer_in_one_load_without_stepping_the_optimizer(pools, tmp_path):
    straight, _ = run_cell(pools, COUNTED.replace("EPOCHS", "4"), out="curve,at_prepare", shard="full",
                           checkpoint=str(tmp_path / "straight"))
    assert straight["at_prepare"] == ([], 0, 0)
    first, _ = run_cell(pools, COUNTED.replace("EPOCHS", "2"), out="curve", shard="full", checkpoint=str(tmp_path / "b"))
    then, _ = run_cell(pools, COUNTED.replace("EPOCHS", "4"), out="curve,at_prepare", shard="full",
                       checkpoint=str(tmp_path / "b"))
    # one load, no optimizer step, and the state DCP loaded in place not set again (only the groups' values)
    assert then["at_prepare"] == ([["model0", "optim0"]], 0, 0)
    assert first["curve"] + then["curve"] == pytest.approx(straight["curve"], rel=1e-4)


def test_an_optimizer_state_the_layout_cannot_place_is_made_as_torch_makes_it_and_resumes(pools, tmp_path):
    straight, _ = run_cell(pools, TALLIED.replace("EPOCHS", "4"), out="curve,tallies", shard="full",
                           checkpoint=str(tmp_path / "straight"))
    first, _ = run_cell(pools, TALLIED.replace("EPOCHS", "2"), out="curve", shard="full", checkpoint=str(tmp_path / "b"))
    then, _ = run_cell(pools, TALLIED.replace("EPOCHS", "4"), out="curve,tallies", shard="full",
                       checkpoint=str(tmp_path / "b"))
    assert straight["tallies"] == then["tallies"] == [(4.0, 0.2)]
    assert first["curve"] + then["curve"] == pytest.approx(straight["curve"], rel=1e-4)
