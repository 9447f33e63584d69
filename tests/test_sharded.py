"""--shard: FSDP2 through prepare() in real ranks (2 ranks, gloo, CPU) — the same losses as DDP, the model back
whole, DCP checkpoints that resume at another world size and across DDP and sharded runs, usage errors first.
"""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
from helpers.runhelp import Captured, run_cell
from helpers.sharding import CURVE, MODEL, TIED_LM, train

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.lifecycle import entry
from nbtrain.kernel.lifecycle.entry import format_summary
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve
from nbtrain.rank.train.history_file import read_rank

pytestmark = pytest.mark.timeout(300)

@pytest.mark.parametrize("k", [1, 2])
def test_sharded_training_gives_the_losses_of_ddp_and_the_model_comes_back_whole(pools, k):
    ddp, _ = train(pools, k=k)
    sharded, result = train(pools, k=k, shard="full")
    summary = format_summary(result)[0]  # what sharding did, measured on the ranks: in the summary and the dashboard
    assert "FSDP2 over 2 ranks (3 blocks)" in summary and "training state per rank" in summary, summary
    assert "peak memory per rank" in summary
    assert ddp["kind"] == "PreparedDDP" and sharded["kind"] == "FSDPNet"
    assert sharded["losses"] == pytest.approx(ddp["losses"], rel=1e-4, abs=1e-5)
    assert sharded["losses"][-1] < sharded["losses"][0]
    back = sharded["model"]  # the plain Net, whole, on the CPU
    assert type(back).__name__ == "Net" and all(type(p) is torch.nn.Parameter for p in back.parameters())
    assert sum(float(p.detach().double().sum()) for p in back.parameters()) == pytest.approx(sharded["checksum"], rel=1e-9)
    assert back(torch.randn(3, 8)).shape == (3, 4)


def test_a_session_keeps_a_sharded_model_across_cells_and_pulls_it_whole(pools):
    ns: dict = {}
    run_cell(pools, MODEL + """
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
model, opt = nbtrain.prepare(model, opt)
""", ns, out="-", shard="full", session="big")
    step = """
for _ in range(2):
    loss = F.cross_entropy(model(X), Y)
    nbtrain.backward(loss)
    opt.step(); opt.zero_grad()
losses.append(loss.item())   # kept by the session from the cell before
"""
    run_cell(pools, "losses = []\n" + step, ns, out="-", session="big", grad_accum=2)
    later, _ = run_cell(pools, step + "trained = sum(float(p.full_tensor().double().sum()) for p in model.parameters())",
                        ns, out="losses,trained", session="big")
    assert len(later["losses"]) == 2 and later["losses"][1] < later["losses"][0]
    pulled: dict = {}
    result = entry.pull(pools, "big", ["model", "opt"], pulled)
    assert type(pulled["model"]).__name__ == "Net"
    assert result.skipped["opt"].startswith("a sharded AdamW's state is spread over the ranks"), result.skipped
    assert sum(float(p.detach().double().sum()) for p in pulled["model"].parameters()) == pytest.approx(later["trained"])
    entry.close(pools, "big")


def test_a_sharded_model_over_the_out_limit_stays_on_the_ranks_and_says_so(pools, tmp_path):
    ns, result = run_cell(pools, MODEL + """
model = nbtrain.prepare(Net())
nbtrain.save_checkpoint()
size = sum(p.numel() * 4 for p in model.parameters())
""", out="model,size", shard="full", out_limit="50K", checkpoint=str(tmp_path))
    assert "model" not in ns and ns["size"] > 50 * 1024
    why = result.skipped["model"]
    assert "over --out-limit 50.0 KiB" in why and f"its sharded checkpoint is {tmp_path}/checkpoint.pt" in why, why
    with pytest.raises(ConfigError, match="--out-limit takes a size such as 500M"):
        resolve(LaunchRequest(nprocs=2, cpu=True, shard="full", out_limit="lots"))


def test_dtensors_among_the_results_come_back_whole_or_are_skipped_saying_why(pools):
    """A sharded model's state_dict() or one of its parameters, pickled as it is, would hold rank 0's shard alone
    in the notebook (its sum silently wrong, its full_tensor() failing): they come back whole."""
    ns, result = run_cell(pools, MODEL + """
model = nbtrain.prepare(Net())
state = model.state_dict()
weight = next(model.parameters())
nested = [weight, {"again": weight}, 3]
whole = {name: value.full_tensor().detach().clone() for name, value in state.items()}
one_rank = weight if rank == 0 else None
""", shard="full", out="state,weight,nested,whole,one_rank", out_limit="1M")
    assert type(ns["weight"]) is torch.Tensor and not ns["weight"].requires_grad, result.skipped
    assert set(ns["state"]) == set(ns["whole"])
    assert all(type(ns["state"][k]) is torch.Tensor and torch.equal(ns["state"][k], ns["whole"][k]) for k in ns["whole"])
    assert torch.equal(ns["weight"], next(iter(ns["whole"].values())))
    assert torch.equal(ns["nested"][0], ns["weight"]) and torch.equal(ns["nested"][1]["again"], ns["weight"])
    assert ns["nested"][2] == 3
    assert "one_rank" not in ns
    assert result.skipped["one_rank"].startswith("it holds DTensors on some ranks only") and \
        "full_tensor()" in result.skipped["one_rank"]  # the rank's words, not a pickling error's
    ns, result = run_cell(pools, MODEL + """
model = nbtrain.prepare(Net())
state = model.state_dict()
""", shard="full", out="state", out_limit="1K")
    assert "state" not in ns and "over --out-limit" in result.skipped["state"], result.skipped


def test_tied_weights_stay_tied_back_in_the_notebook_after_a_resume_and_a_pull(pools, tmp_path):
    checkpoint = str(tmp_path / "ckpt")
    first, _ = run_cell(pools, TIED_LM.replace("EPOCHS", "2"), out="lm,weights,tied_on_the_ranks", shard="full",
                        checkpoint=checkpoint)
    printed = []
    resumed, _ = run_cell(pools, TIED_LM.replace("EPOCHS", "3"), out="lm,weights", shard="full", checkpoint=checkpoint,
                          session="tied", write=lambda stream, text: printed.append(text))
    pulled: dict = {}
    entry.pull(pools, "tied", ["lm"], pulled)
    entry.close(pools, "tied")
    assert first["tied_on_the_ranks"] and "resuming from" in "".join(printed)
    for lm, weights in ((first["lm"], first["weights"]), (resumed["lm"], resumed["weights"]),
                        (pulled["lm"], resumed["weights"])):
        assert lm.head.weight is lm.emb.weight  # one parameter, as the model was built: not two copies
        assert len(list(lm.parameters())) == 1 + 2 * 2
        torch.testing.assert_close(lm.emb.weight.detach(), weights)


def test_shard_without_prepare_says_nothing_was_sharded_in_the_cell_and_the_summary(pools):
    printed = Captured()
    _, result = run_cell(pools, MODEL + """
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(2):
    F.cross_entropy(model(X), Y).backward(); opt.step(); opt.zero_grad(set_to_none=False)
""", out="-", shard="full", write=printed)
    said = printed.text()
    assert "nbtrain: --shard, but nothing was sharded: model (Net) never went through nbtrain.prepare(), so each " \
           "rank trained its own copy of model, unsynchronised" in said, said
    assert said.count("nothing was sharded") == 1  # rank 0 says it for the run
    summary = format_summary(result)[0]
    assert "--shard: nothing sharded (no model went through nbtrain.prepare(); each rank trained its own copy)" in \
           summary, summary


VIEW_OUT = MODEL + """
torch.manual_seed(1)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = nbtrain.prepare(model, opt)
x, y = X[rank::world_size].unsqueeze(1), Y[rank::world_size]   # 3-D: the head's output is a view
losses = []
for step in range(4):
    out = model(x)
    out *= 2.0                      # in place, on the sharded root's output
    loss = F.cross_entropy(out[:, 0], y)
    nbtrain.backward(loss)
    opt.step(); opt.zero_grad()
    total = loss.detach().clone()
    torch.distributed.all_reduce(total)
    losses.append(total.item() / world_size)
"""


def test_a_root_that_returns_a_view_trains_as_ddp_without_torchs_warning(pools):
    """FSDP2 warns that an in-place op on the root's view output can give wrong gradients; for the root it does not
    (its parameters stay gathered after forward), so nbtrain silences that one warning."""
    ddp, _ = run_cell(pools, VIEW_OUT, out="losses")
    printed = Captured()
    sharded, _ = run_cell(pools, VIEW_OUT, out="losses", shard="full", write=printed)
    assert sharded["losses"] == pytest.approx(ddp["losses"], rel=1e-5)
    assert "returned a view tensor" not in printed.text() and "Warning" not in printed.text(), printed.text()


def test_bf16_mixed_precision_shards_and_says_what_it_did(pools):
    printed = []
    ns, _ = run_cell(pools, MODEL + """
model, = [nbtrain.prepare(Net())]
dtypes = sorted({str(p.dtype) for p in model.parameters()})
out_dtype = str(model(X[:4]).dtype)
""", out="dtypes,out_dtype", shard="full", amp="bf16", write=lambda stream, text: printed.append(text))
    said = "".join(printed)
    assert ns["dtypes"] == ["torch.float32"] and ns["out_dtype"] == "torch.float32"  # fp32 kept, bf16 computed
    assert "FSDP2 · 2 ranks · 3 blocks + root · bf16 params, fp32 reduce" in said, said
    assert "parameters per rank" in said


def test_a_sharded_checkpoint_resumes_4_to_2_to_4_ranks_and_then_unsharded(pools, tmp_path):
    cell = CURVE
    checkpoint = str(tmp_path / "ckpt")
    straight, _ = run_cell(pools, cell.replace("EPOCHS", "8"), out="curve", shard="full",
                           checkpoint=str(tmp_path / "straight"))
    four, _ = run_cell(pools, cell.replace("EPOCHS", "2"), out="curve", shard="full", checkpoint=checkpoint, nprocs=4)
    saved = sorted(n for n in os.listdir(checkpoint) if n != ".nbtrain-lock")  # the lock a running cell holds
    assert len(saved) == 2 and saved[0] == "checkpoint.pt" and ".shards-" in saved[1], saved  # nothing logged: no history
    two, _ = run_cell(pools, cell.replace("EPOCHS", "4"), out="curve", shard="full", checkpoint=checkpoint)
    four_again, _ = run_cell(pools, cell.replace("EPOCHS", "6"), out="curve", shard="full", checkpoint=checkpoint,
                             nprocs=4)
    ddp, _ = run_cell(pools, cell.replace("EPOCHS", "8"), out="curve", checkpoint=checkpoint, nprocs=1)  # no shards
    assert not [n for n in os.listdir(checkpoint) if ".shards-" in n]  # its save no longer names them: removed
    resumed = four["curve"] + two["curve"] + four_again["curve"] + ddp["curve"]
    assert resumed == pytest.approx(straight["curve"], rel=1e-4)


def test_a_background_save_is_written_by_the_cells_end_and_resumes_as_a_plain_one(pools, tmp_path):
    cell = CURVE
    straight, _ = run_cell(pools, cell.replace("EPOCHS", "4"), out="curve", shard="full",
                           checkpoint=str(tmp_path / "sync"))
    first, _ = run_cell(pools, cell.replace("EPOCHS", "2"), out="curve", shard="full", checkpoint_async=True,
                        checkpoint=str(tmp_path / "async"))
    assert os.path.exists(tmp_path / "async" / "checkpoint.pt")  # the cell's end waited for the last save
    assert len([n for n in os.listdir(tmp_path / "async") if ".shards-" in n]) == 1
    then, _ = run_cell(pools, cell.replace("EPOCHS", "4"), out="curve", shard="full", checkpoint_async=True,
                       checkpoint=str(tmp_path / "async"))
    assert first["curve"] + then["curve"] == pytest.approx(straight["curve"], rel=1e-4)


# a DCP that did not call its planner's finish_plan, which hands rank 0 the parts the plans carried: gathered after
_NO_PLAN_HOOK = """
from torch.distributed.checkpoint import DefaultSavePlanner
from nbtrain.rank.train import shard
planner_before = shard.save_planner
shard.save_planner = lambda planned, part: DefaultSavePlanner(enable_plan_caching=True)
try:
{body}
finally:
    shard.save_planner = planner_before  # the ranks stay warm for the next cell
"""


@pytest.mark.parametrize("background, hook", [(True, ""), (False, ""), (False, _NO_PLAN_HOOK)],
                         ids=["async", "sync", "sync-without-the-plan-hook"])
def test_a_sharded_saves_file_holds_every_ranks_own_state(pools, tmp_path, background, hook):
    cell = CURVE.replace("curve = []", "curve = []\ntorch.manual_seed(rank)\nnbtrain.log(rank_was=float(rank))")
    cell = hook.format(body=textwrap.indent(cell, "    ")) if hook else cell
    run_cell(pools, cell.replace("EPOCHS", "1"), shard="full", checkpoint_async=background, checkpoint=str(tmp_path))
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert [entry["rank"] for entry in saved["ranks"]] == [0, 1], "every rank's entry, in rank order"
    states = [entry["rng"]["torch"] for entry in saved["ranks"]]
    assert not torch.equal(states[0], states[1]), "each rank's own generator"
    history = str(tmp_path / saved["history"]["file"])
    assert [read_rank(history, saved["history"]["length"], rank)["rank_was"][2].tolist() for rank in (0, 1)] == [
        [0.0], [1.0]], "each rank's logged series, in the checkpoint's history file"


def test_a_rank_killed_during_a_sharded_save_leaves_the_previous_checkpoint(pools, tmp_path):
    cell = MODEL + """
import os
from nbtrain.rank.train import shard
written = shard.save_states
def dying_while_the_others_write(context, directory, *args, **kwargs):   # the second save: rank 1 dies, rank 0 writes
    if rank == 1 and context.step == 2 and KILL:
        os._exit(9)
    return written(context, directory, *args, **kwargs)
shard.save_states = dying_while_the_others_write
model = nbtrain.prepare(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt = nbtrain.prepare(opt)
for epoch in nbtrain.epochs(3):
    nbtrain.backward(F.cross_entropy(model(X), Y)); opt.step(); opt.zero_grad()
    nbtrain.save_checkpoint()
"""
    checkpoint = str(tmp_path / "ckpt")
    with pytest.raises(RankFailedError):
        run_cell(pools, cell.replace("KILL", "True"), shard="full", checkpoint=checkpoint)
    printed = []
    ns, _ = run_cell(pools, cell.replace("KILL", "False"), out="opt", shard="full", checkpoint=checkpoint,
                     write=lambda stream, text: printed.append(text))
    assert "resuming from" in "".join(printed) and "(epoch 1, step 1)" in "".join(printed), printed
    assert "the save at step 2 did not finish (the run was stopped, or a rank died, while it wrote checkpoint.pt." \
           "shards-2-" in "".join(printed) and "resumes from the save before it, at step 1" in "".join(printed), printed
    assert len([n for n in os.listdir(checkpoint) if ".shards-" in n]) == 1  # the partial folder went with the next save
    assert "opt" not in ns  # a sharded optimizer's state stays on the ranks


_FILE_FAILS = MODEL + """
from nbtrain.rank.train import checkpoint_write
from nbtrain.rank.train.checkpoint import CheckpointError
model = nbtrain.prepare(Net())
opt = nbtrain.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
nbtrain.backward(F.cross_entropy(model(X), Y)); opt.step(); opt.zero_grad()
nbtrain.save_checkpoint(marker="old")
def full_disk(state, path):
    raise OSError(28, "No space left on device")
written = checkpoint_write._write_temporary
if rank == 0:  # the shards are written; the file that would name them is not
    checkpoint_write._write_temporary = full_disk
try:
    nbtrain.save_checkpoint(marker="new")
    outcome = "saved"
except CheckpointError as exc:
    outcome = str(exc)
finally:
    checkpoint_write._write_temporary = written  # the rank stays warm for the next cell
said = [None, None]
torch.distributed.all_gather_object(said, outcome)  # the test's own ranks: what each said
"""


def test_rank_0s_failure_to_write_a_sharded_saves_file_is_said_on_every_rank_and_the_old_checkpoint_stays(
        pools, tmp_path):
    ns, _ = run_cell(pools, _FILE_FAILS, out="said", shard="full", checkpoint=str(tmp_path), resume=False)
    for outcome in ns["said"]:  # the same words on both ranks: rank 1 heard them in DCP's last broadcast
        assert outcome == ns["said"][0] and "rank 0 could not write the checkpoint" in outcome, ns["said"]
        assert "OSError: [Errno 28] No space left on device" in outcome and "previous checkpoint there is " \
            "unchanged" in outcome, outcome
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["extra"] == {"marker": "old"}
    assert os.path.isdir(tmp_path / saved["models"][0]["dcp"]), "the folder the old file names is still there"


def test_a_ddp_checkpoint_resumes_in_a_sharded_run(pools, tmp_path):
    cell = CURVE
    straight, _ = run_cell(pools, cell.replace("EPOCHS", "4"), out="curve", checkpoint=str(tmp_path / "a"))
    first, _ = run_cell(pools, cell.replace("EPOCHS", "2"), out="curve", checkpoint=str(tmp_path / "b"))
    then, _ = run_cell(pools, cell.replace("EPOCHS", "4"), out="curve", shard="full", checkpoint=str(tmp_path / "b"))
    assert first["curve"] + then["curve"] == pytest.approx(straight["curve"], rel=1e-4)


def test_compiled_blocks_shard_and_train_to_the_same_losses(pools, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --profile writes its traces under the notebook's current directory
    plain, _ = train(pools, steps=5, shard="full")
    compiled, result = train(pools, steps=5, shard="full", compile="aot_eager", profile="1,1,2")
    assert compiled["losses"] == pytest.approx(plain["losses"], rel=1e-4, abs=1e-5)
    assert result.profiles and "\n".join(format_summary(result)).count("rank") > 2  # --profile with --shard too


def test_activation_checkpointing_recomputes_to_the_same_losses(pools):
    plain, _ = train(pools, steps=8, shard="full")
    checkpointed, _ = train(pools, steps=8, shard="full", activation_checkpointing=True)
    assert checkpointed["losses"] == pytest.approx(plain["losses"], rel=1e-5)


def test_a_meta_device_model_sharded_over_cpu_ranks_starts_as_its_unsharded_twin(pools):
    """On a CPU mesh DTensor draws each shard's random numbers from its rank's own generator: after the cell's
    seed every shard of a weight got the same values (its halves equal). Filled whole and scattered, the model
    starts exactly as the same model built unsharded after the same seed."""
    printed: list[str] = []
    ns, _ = run_cell(pools, MODEL + """
torch.manual_seed(0)
with torch.device("meta"):
    net = Net()
model = nbtrain.prepare(net)
torch.manual_seed(0)
twin = Net()
""", shard="full", out="model,twin", write=lambda stream, text: printed.append(text))
    mine, theirs = ns["model"].state_dict(), ns["twin"].state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    first = mine["embed.weight"]
    assert not torch.equal(first[: len(first) // 2], first[len(first) // 2:])
    assert "DTensor random operators" not in "".join(printed)


def test_a_meta_device_model_is_materialised_shard_by_shard_and_comes_back(pools):
    """84M parameters (336 MB) built on the meta device in the notebook: it travels as a structure, each rank
    allocates only its half (DDP: the whole model, then as much again in gradients), and it comes back whole."""
    printed = []
    notebook = {}
    exec(MODEL + "with torch.device('meta'):\n    big = Net(width=1024, depth=10)\n", notebook)
    full = sum(p.numel() * 4 for p in notebook["big"].parameters())
    assert full > 300 * 2**20 and all(p.is_meta for p in notebook["big"].parameters())
    ns, _ = run_cell(pools, """
import psutil
rss = lambda: psutil.Process().memory_info().rss
nbtrain.prepare(Net(width=8, depth=2))   # FSDP2's own first-use cost (imports, the device mesh), not the model's
before = rss()
big = nbtrain.prepare(big)
prepared = rss() - before             # this rank's shards
loss = F.cross_entropy(big(X[:16]), Y[:16]); loss.backward()
trained = rss() - before              # and their gradients
grown = [None] * world_size
torch.distributed.all_gather_object(grown, (prepared, trained))
finite = bool(torch.isfinite(loss))
""", dict(notebook), out="big,grown,finite", shard="full", write=lambda stream, text: printed.append(text),
        env=("MALLOC_MMAP_THRESHOLD_=65536",))  # large blocks go back to the system when freed: RSS is what is held
    assert ns["finite"] and type(ns["big"]).__name__ == "Net" and not any(p.is_meta for p in ns["big"].parameters())
    for prepared, trained in ns["grown"]:
        assert prepared < 0.65 * full and trained < 1.3 * full, (ns["grown"], full)
    assert "uninitialised" not in "".join(printed)


@pytest.mark.parametrize("options", [{"shard": "full"}, {}], ids=["sharded", "ddp"])
def test_weights_from_a_folder_of_safetensors_load_into_a_meta_device_model(pools, tmp_path, options):
    from safetensors.torch import save_file

    notebook: dict = {}
    exec(MODEL + "saved = Net()\n", notebook)
    save_file(notebook["saved"].state_dict(), str(tmp_path / "model.safetensors"))
    expected = sum(float(p.detach().double().sum()) for p in notebook["saved"].parameters())
    ns, _ = run_cell(pools, MODEL + f"""
with torch.device("meta"):
    model = Net()
model = nbtrain.prepare(model, weights={str(tmp_path)!r})
loaded = sum(float((p.full_tensor() if hasattr(p, "full_tensor") else p).double().sum()) for p in model.parameters())
""", out="loaded", **options)
    assert ns["loaded"] == pytest.approx(expected, rel=1e-9)
    with pytest.raises(RankFailedError, match="give a folder holding .safetensors files"):
        run_cell(pools, MODEL + f"nbtrain.prepare(Net(), weights={str(tmp_path / 'nowhere')!r})\n", **options)


@pytest.mark.parametrize("options, message", [
    ({"shard": "full", "shard_offload": True}, "--shard-offload keeps the shards in CPU memory"),
    ({"shard_offload": True}, "--shard-offload acts on sharded models, so it needs --shard"),
    ({"activation_checkpointing": True}, "--activation-checkpointing acts on sharded models"),
    ({"shard": "hybrid"}, "--shard hybrid replicates the model across nodes"),
    ({"shard": "diagonal"}, "--shard is full"),
    ({"shard": "full", "compile": "default", "compile_fallback": True}, "--compile-fallback does not go with --shard"),
    ({"shard": "full", "checkpoint_async": True}, "--checkpoint-async writes sharded checkpoints in the background"),
])
def test_sharding_options_are_checked_before_anything_starts(options, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        resolve(LaunchRequest(nprocs=2, cpu=True, **options))


def test_a_model_fsdp2_cannot_shard_is_named_before_training(pools):
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, MODEL + "nbtrain.prepare(Net(), shard=[torch.nn.GRU])\n", shard="full")
    assert "Net has no such submodule" in str(failed.value)
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, MODEL + "nbtrain.prepare(Net(), shard=[Block])\n")
    assert "this cell does not shard: run it with --shard" in str(failed.value)
