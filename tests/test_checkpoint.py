"""Checkpoints in real ranks (2 ranks, gloo, CPU): atomic writes under a kill, and resuming where a run stopped."""

from __future__ import annotations

import os

import pytest
import torch
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError

pytestmark = pytest.mark.timeout(240)


TRAIN = """
import torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 3))
opt = torch.optim.Adam(net.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
model, opt, loader, sched = nbtrain.prepare(net, opt, DataLoader(data, batch_size=4, shuffle=True), sched)
for epoch in nbtrain.epochs(EPOCHS):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        nbtrain.backward(loss)
        opt.step(); opt.zero_grad(); sched.step()
        nbtrain.log(loss=loss)
    nbtrain.log(epoch=epoch)
    nbtrain.save_checkpoint()
state = nbtrain.training_state()
final = ([p.detach().clone() for p in net.parameters()], state.step, sched.get_last_lr())
"""


def test_resumed_run_continues_the_uninterrupted_one(pools, tmp_path):
    options = dict(grad_accum=2, amp="fp16", out="final")  # fp16 on CPU: the GradScaler's state is saved too
    whole, whole_run = run_cell(pools, TRAIN.replace("EPOCHS", "4"), checkpoint=str(tmp_path / "a"), **options)
    _, first_run = run_cell(pools, TRAIN.replace("EPOCHS", "2"), checkpoint=str(tmp_path / "b"), **options)
    output = Captured()
    resumed, resumed_run = run_cell(pools, TRAIN.replace("EPOCHS", "4"), write=output, checkpoint=str(tmp_path / "b"), **options)

    # in the steps history and the dashboard count (2 batches an optimizer step), with the optimizer's own
    assert f"resuming from {tmp_path / 'b' / 'checkpoint.pt'} (epoch 2, step 12; optimizer step 6)" in output.text()
    assert resumed_run.history.series("loss", rank=0).steps[len(first_run.history.series("loss", rank=0))] == 12
    for rank in (0, 1):
        reference = whole_run.history.series("loss", rank=rank)
        continued = resumed_run.history.series("loss", rank=rank)
        # the whole curve: the first run's points (from the checkpoint), then the resumed run's, which continue them
        assert continued.steps == list(range(24)), "metric steps must continue where the first run stopped"
        assert continued.values == pytest.approx(reference.values, rel=1e-6, abs=1e-7)
        assert continued.times[:12] == first_run.history.series("loss", rank=rank).times
        assert resumed_run.history.series("epoch", rank=rank).values == [0.0, 1.0, 2.0, 3.0]
    (weights, steps, lr), (reference_weights, reference_steps, reference_lr) = resumed["final"], whole["final"]
    assert steps == reference_steps == 12 and lr == reference_lr
    for a, b in zip(weights, reference_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_no_resume_starts_over(pools, tmp_path):
    run_cell(pools, TRAIN.replace("EPOCHS", "1"), checkpoint=str(tmp_path))
    output = Captured()
    _, result = run_cell(pools, TRAIN.replace("EPOCHS", "1"), write=output, checkpoint=str(tmp_path), resume=False)
    assert "resuming" not in output.text()
    assert result.history.series("loss").steps[0] == 0


KILLED_WHILE_SAVING = """
import os, signal, threading, time
import torch, nbtrain
net = torch.nn.Linear(4, 4)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
nbtrain.save_checkpoint(marker="old")
if rank == 0:
    directory = os.path.dirname(nbtrain.training_state().settings.checkpoint_path)
    def kill_while_the_new_file_is_written():
        while True:
            partial = [n for n in os.listdir(directory) if ".tmp-" in n]
            if partial and os.path.getsize(os.path.join(directory, partial[0])) > 0:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.0005)
    threading.Thread(target=kill_while_the_new_file_is_written, daemon=True).start()
nbtrain.save_checkpoint(marker="new", ballast=torch.ones(40_000_000))
"""


def test_a_rank_killed_while_saving_leaves_the_old_checkpoint(pools, tmp_path):
    with pytest.raises(RankFailedError, match="rank 0 was killed by SIGKILL"):
        run_cell(pools, KILLED_WHILE_SAVING, checkpoint=str(tmp_path))
    leftovers = [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    assert leftovers, "the kill should have hit the write of the temporary file"
    assert os.path.getsize(tmp_path / leftovers[0]) < 160_000_000
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert saved["extra"] == {"marker": "old"} and saved["step"] == 0

    run_cell(pools, "import nbtrain, torch\nnbtrain.prepare(torch.nn.Linear(2, 2))\nnbtrain.save_checkpoint(marker='later')\n",
             checkpoint=str(tmp_path), resume=False)
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == [], "the dead save's temporary file is cleared"
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["extra"] == {"marker": "later"}


def test_load_checkpoint_by_hand_returns_epoch_step_and_extra(pools, tmp_path):
    path = tmp_path / "manual.pt"
    run_cell(pools, f"""
import torch, nbtrain
net = torch.nn.Linear(2, 2)
with torch.no_grad():
    net.weight.fill_(3.0)
nbtrain.prepare(net)
nbtrain.save_checkpoint({str(path)!r}, note="hello")
""")
    ns, _ = run_cell(pools, f"""
import torch, nbtrain
net = torch.nn.Linear(2, 2)
model = nbtrain.prepare(net)
info = nbtrain.load_checkpoint({str(path)!r})
result = (info.epoch, info.step, info.extra, float(net.weight[0, 0]))
missing = None
try:
    nbtrain.save_checkpoint()
except Exception as exc:
    missing = str(exc)
""", out="result,missing")
    assert ns["result"] == (0, 0, {"note": "hello"}, 3.0)
    assert "--checkpoint DIR" in ns["missing"]


MID_EPOCH = """
import torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 3))
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(data, batch_size=4, shuffle=True))
def train(stop_at):
    for epoch in nbtrain.epochs(2):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            nbtrain.backward(loss)
            opt.step(); opt.zero_grad()
            nbtrain.log(loss=loss)
            if nbtrain.training_state().step == stop_at:
                nbtrain.save_checkpoint()
                return
train(STOP)
"""


def test_a_checkpoint_saved_mid_epoch_resumes_at_the_next_batch(pools, tmp_path):
    _, whole = run_cell(pools, MID_EPOCH.replace("STOP", "-1"), checkpoint=str(tmp_path / "a"))
    run_cell(pools, MID_EPOCH.replace("STOP", "4"), checkpoint=str(tmp_path / "b"))  # 6 batches an epoch: stop in epoch 0
    saved = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert (saved["epoch"], saved["loaders"], saved["step"]) == (0, [{"epoch": 0, "batches": 4}], 4)
    _, resumed = run_cell(pools, MID_EPOCH.replace("STOP", "-1"), checkpoint=str(tmp_path / "b"))
    for rank in (0, 1):
        continued = resumed.history.series("loss", rank=rank)
        assert continued.steps == list(range(12))  # the 4 saved points, then the resumed run's 8
        assert continued.values == pytest.approx(whole.history.series("loss", rank=rank).values, rel=1e-6)


DISK_FULL = """
import resource, signal
import torch, nbtrain
from nbtrain.rank.train.checkpoint import CheckpointError
limit = resource.getrlimit(resource.RLIMIT_FSIZE)
net = torch.nn.Linear(4, 4)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
nbtrain.save_checkpoint(marker="old")
if rank == 0:  # a full disk, simulated: writes past 64 KiB fail (EFBIG) instead of filling the machine
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, limit[1]))
try:
    nbtrain.save_checkpoint(marker="new", ballast=torch.ones(1_000_000))
    outcome = "saved"
except CheckpointError as exc:
    outcome = str(exc)
finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, limit)  # the rank stays warm for the next cell
"""


def test_a_full_disk_is_explained_on_every_rank_and_the_old_checkpoint_survives(pools, tmp_path):
    ns, _ = run_cell(pools, DISK_FULL, checkpoint=str(tmp_path), resume=False, out="outcome")
    assert "could not write the checkpoint" in ns["outcome"]
    assert "previous checkpoint there is unchanged; free disk space" in ns["outcome"]
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert saved["extra"] == {"marker": "old"}
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []


def test_the_python_random_state_is_saved_as_a_tensor_and_older_checkpoints_tuples_still_load(tmp_path):
    """Each rank's ``random`` state goes into the checkpoint as one tensor (read back with ``weights_only``, a tuple of
    625 ints took a millisecond a rank); a checkpoint of an earlier version holds the tuple, and it loads too."""
    import io
    import random

    from nbtrain.rank.train.rng_state import rng_state as _rng_state, set_rng_state as _set_rng_state

    random.seed(7)
    saved = _rng_state(torch.device("cpu"))
    expected = [random.random() for _ in range(3)]
    assert isinstance(saved["python"][1], torch.Tensor)
    buffer = io.BytesIO()
    torch.save({"rng": saved}, buffer)
    buffer.seek(0)
    _set_rng_state(torch.load(buffer, weights_only=True)["rng"], torch.device("cpu"))
    assert [random.random() for _ in range(3)] == expected
    random.seed(7)
    older = {**saved, "python": random.getstate()}
    random.seed(8)
    _set_rng_state(older, torch.device("cpu"))
    assert [random.random() for _ in range(3)] == expected


def test_a_model_state_dcp_loaded_into_in_place_is_not_set_again_and_one_with_a_replaced_entry_is():
    from nbtrain.rank.train.dcp_resume import _loaded_in_place

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    template = model.state_dict()
    before = dict(template)
    template["0.weight"].copy_(torch.ones(2, 2))  # as DCP loads a tensor: into it
    assert _loaded_in_place(model, before, template)
    template["1.num_batches_tracked"] = torch.tensor(3)  # as DCP loads anything else: a new object
    assert not _loaded_in_place(model, before, template)
    copied = {**before, "0.bias": before["0.bias"].clone()}  # a tensor that is not the model's own
    assert not _loaded_in_place(model, copied, copied)


def _allocated_like(reference: torch.optim.Optimizer, model: torch.nn.Module, **options) -> torch.optim.Optimizer:
    """A fresh AdamW over ``model`` holding uninitialised state of ``reference``'s shapes, as a resume allocates it."""
    fresh = torch.optim.AdamW(model.parameters(), lr=0.5, **options)
    for param, tensors in zip(model.parameters(), reference.state.values(), strict=True):
        fresh.state[param] = {what: torch.empty_like(tensor) for what, tensor in tensors.items()}
    return fresh


def _as_dcp_loads(template: dict, reference: torch.optim.Optimizer) -> None:
    """What DCP's load does to an optimizer template: each tensor copied into, each plain value replaced."""
    for tensors, saved in zip(template["state"].values(), reference.state.values(), strict=True):
        for what, tensor in tensors.items():
            tensor.copy_(saved[what])
    for group, saved in zip(template["param_groups"], reference.param_groups, strict=True):
        group.update((key, value) for key, value in saved.items() if key != "params")


def _trained_adamw() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.95))
    for _ in range(3):
        model(torch.randn(5, 3)).square().sum().backward()
        opt.step()
    return model, opt


def test_an_optimizer_state_allocated_by_the_resume_is_loaded_in_place_and_only_its_groups_values_are_set(monkeypatch):
    import torch.distributed.checkpoint.state_dict as torch_state_dict

    from nbtrain.rank.train.dcp_resume import _allocated_template

    def refused(*args, **kwargs):
        raise AssertionError("set_optimizer_state_dict ran: the state was loaded in place")

    monkeypatch.setattr(torch_state_dict, "set_optimizer_state_dict", refused)
    model, trained = _trained_adamw()
    fresh = _allocated_like(trained, model)
    held = [dict(tensors) for tensors in fresh.state.values()]
    state: dict = {}
    apply = _allocated_template(model, fresh, {"key": "optim0"}, state)
    assert set(state["optim0"]["state"]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    _as_dcp_loads(state["optim0"], trained)
    apply()
    assert fresh.param_groups[0]["lr"] == 0.01 and fresh.param_groups[0]["betas"] == (0.8, 0.95)
    for mine, kept, theirs in zip(fresh.state.values(), held, trained.state.values(), strict=True):
        assert all(mine[what] is kept[what] and torch.equal(mine[what], theirs[what]) for what in theirs)
    assert list(fresh.param_groups[0]["params"]) == list(model.parameters())


@pytest.mark.parametrize("case", ["replaced", "capturable"])
def test_an_allocated_optimizer_state_goes_through_torchs_set_when_the_load_left_more_than_values(case):
    """A tensor DCP replaced instead of filling, or an optimizer that keeps its step counts on its device: torch's
    ``set_optimizer_state_dict`` does the rest, and the state is the checkpoint's all the same."""
    from nbtrain.rank.train.dcp_resume import _allocated_template

    model, trained = _trained_adamw()
    fresh = _allocated_like(trained, model, **({"capturable": True} if case == "capturable" else {}))
    state: dict = {}
    apply = _allocated_template(model, fresh, {"key": "optim0"}, state)
    _as_dcp_loads(state["optim0"], trained)
    if case == "replaced":
        state["optim0"]["state"]["1.bias"]["exp_avg"] = trained.state[model[1].bias]["exp_avg"].clone()
    apply()
    assert fresh.param_groups[0]["lr"] == 0.01
    for mine, theirs in zip(fresh.state.values(), trained.state.values(), strict=True):
        assert all(torch.equal(mine[what].cpu(), theirs[what]) for what in theirs)
