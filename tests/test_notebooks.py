"""The notebooks in notebooks/ run top to bottom through a real kernel, and their key results hold."""

from __future__ import annotations

import base64
import os
import re

import nbformat
import psutil
import pytest
from helpers.outputs import cell_text
from nbclient import NotebookClient

from scripts.run_notebook import apply_parameters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


def run_notebook(name: str, **params):
    """Execute notebooks/NAME through a real kernel (parameters overridden) and return the executed notebook."""
    nb = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
    apply_parameters(nb, {k: str(v) for k, v in params.items()})
    nb.cells.append(nbformat.v4.new_code_cell("%distributed_shutdown"))
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}).execute()
    return nb


def execute(name: str, **params) -> list[str]:
    return [cell_text(c) for c in run_notebook(name, **params).cells]


def test_quickstart_trains_and_brings_the_model_back():
    outputs = "\n".join(execute("quickstart.ipynb", RANKS=2, EPOCHS=10))
    assert "nbtrain: 2 ranks · gloo · cpu" in outputs
    line = next(s for s in outputs.splitlines() if s.startswith("model: Net"))
    first, last = (float(v) for v in line.split("loss ")[1].split(",")[0].split(" -> "))
    assert last < first
    assert float(line.rsplit("accuracy ", 1)[1].rstrip("%")) > 80


def test_troubleshooting_shows_each_failure_and_the_kernel_survives():
    outputs = execute("troubleshooting.ipynb", HANG_TIMEOUT=3)
    text = "\n".join(outputs)
    assert "total = 6" in text
    assert "Where each rank was:" in text and "rank 0: at cell line 4: time.sleep(0.05)" in text


def test_a_torchrun_script_runs_unchanged_and_its_results_come_back():
    text = "\n".join(execute("from_script.ipynb", STEPS=100))
    assert "step 0: loss" in text and "final loss 0.0" in text and "\n100.0" in text


def pngs(cell) -> list[bytes]:
    """The PNG images a cell left in its saved outputs (the dashboard's final picture, a matplotlib figure)."""
    images = [base64.b64decode(o["data"]["image/png"]) for o in cell.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert all(image[:8] == b"\x89PNG\r\n\x1a\n" for image in images)
    return images


def has_widget(cell) -> bool:
    return any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in cell.get("outputs", []))


def numbers_after(text: str, label: str) -> tuple[float, float]:
    """``label a -> b`` in the outputs: (a, b), percentages as fractions."""
    line = next(s for s in text.splitlines() if s.startswith(label))
    before, after = line[len(label):].split(" -> ")
    return tuple(float(v.strip().rstrip("%")) / (100 if v.strip().endswith("%") else 1) for v in (before, after))


def test_image_classifier_trains_resumes_and_brings_the_model_back(tmp_path):
    nb = run_notebook("image_classifier.ipynb", RANKS=2, CHECKPOINT_DIR=repr(str(tmp_path)))
    text = "\n".join(cell_text(c) for c in nb.cells)
    # No network in CI: the fallback is taken, fast, and said so; with a network CIFAR-10 is used.
    assert "data set: FakeData" in text or "data set: CIFAR-10" in text
    training = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%distributed")]
    assert len(training) == 2
    first, resumed = (cell_text(c) for c in training)
    assert "2 ranks on cpu; mixed precision: off" in first and "epoch 2/2:" in first
    assert f"nbtrain: resuming from {tmp_path}/checkpoint.pt (epoch 2," in resumed and "epoch 3/3:" in resumed
    assert "epoch 1/" not in resumed, "the resumed run starts at the saved epoch"
    start, end = numbers_after(text, "training loss, mean of the first epoch -> the last epoch: ")
    assert end < start
    assert "back in the notebook: a ResNet on cpu" in text
    assert "accuracy of the returned model on 256 validation images" in text
    for cell in training:  # the dashboard's final picture stays in each training cell, the live widget is gone
        assert len(pngs(cell)) == 1 and not has_widget(cell)
    assert (tmp_path / "checkpoint.pt").is_file(), "a CHECKPOINT_DIR of the user's is kept"


def test_monitoring_shows_devices_curves_and_history():
    nb = run_notebook("monitoring.ipynb", RANKS=2, STEPS=200)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    by_source = {c.source.split("\n", 1)[0]: c for c in cells}
    assert "machine: CPU" in cell_text(by_source["%gpus --once"]) or "GPU" in cell_text(by_source["%gpus --once"])
    assert has_widget(next(c for c in cells if c.source.startswith("%gpus --for")))
    training = next(c for c in cells if c.source.startswith("%%distributed") and "--no-dashboard" not in c.source)
    assert len(pngs(training)) == 1 and not has_widget(training)
    summary = cell_text(training)
    assert all(name in summary for name in ("train_loss", "val_loss", "train_acc", "val_acc", "lr"))
    text = "\n".join(cell_text(c) for c in cells)
    loss_start, loss_end = numbers_after(text, "train_loss, mean over ranks: ")
    acc_start, acc_end = numbers_after(text, "val_acc: ")
    assert loss_end < loss_start and acc_end > acc_start and acc_end > 0.8
    assert "ranks that logged train_loss: [0, 1]" in text
    figure = next(c for c in cells if "plt.show()" in c.source)
    assert len(pngs(figure)) == 1
    slow = next(c for c in cells if "class SlowSpirals" in c.source)  # where the steps' time goes
    said = cell_text(slow)
    assert re.search(r"fp32 · [0-9.]+ [kMG]?FLOP/s per rank \(no MFU on the CPU\) · [0-9,]+ samples/s · each step: "
                     r"[5-9]\d % data", said), said
    assert "waited for data (a DataLoader with no workers)" in said, said
    data_wait = re.search(r"^waiting for data: (\d+) % of each step", text, re.M)
    assert data_wait and int(data_wait.group(1)) > 50, text
    assert re.search(r"achieved: [0-9.e-]+ GFLOP/s per rank", text) and "samples/s over every rank" in text
    quiet = next(c for c in cells if "--no-dashboard" in c.source)
    assert not pngs(quiet) and not has_widget(quiet) and "no dashboard under this cell" in cell_text(quiet)
    assert "History(countdown: 5 points" in text


def figures(cell) -> list[bytes]:
    """The matplotlib figures a cell shows (PNG outputs whose text is the figure's repr, not the dashboard's)."""
    return [base64.b64decode(o["data"]["image/png"]) for o in cell.get("outputs", [])
            if "image/png" in o.get("data", {}) and o["data"].get("text/plain", "").startswith("<Figure")]


def test_interactive_keeps_the_model_in_a_session_plots_pulls_and_profiles(tmp_path):
    nb = run_notebook("interactive.ipynb", RANKS=2, LOG_DIR=repr(str(tmp_path / "runs")))
    cells = [c for c in nb.cells if c.cell_type == "code"]
    session_cells = [c for c in cells if c.source.startswith("%%distributed") and "--session s1" in c.source]
    build, train, evaluate, profile = session_cells
    assert "built on 2 ranks: 64 batches of 32 per rank and epoch" in cell_text(build)
    assert "nbtrain: 2 ranks · gloo · cpu" in cell_text(build)
    assert cell_text(next(c for c in cells if c.source.startswith("print('model' in"))).strip() == "False"
    # Cell 2 trains the model cell 1 built (only the session had it: --out - sent nothing back).
    train_text = cell_text(train)
    assert "(warm)" in train_text and "back in the notebook: epoch_loss" in train_text
    first, last = (float(v) for v in train_text.split("(first batch ")[1].split(")")[0].split(", last "))
    assert last < first
    figure = figures(train)
    assert len(figure) == 1 and figure[0][:8] == b"\x89PNG\r\n\x1a\n" and len(figure[0]) > 5000
    text = "\n".join(cell_text(c) for c in cells)
    ranks_acc = float(text.split("test accuracy after 1 epoch(s): ")[1].split("%")[0])
    assert ranks_acc > 85
    listing = cell_text(next(c for c in cells if c.source == "%distributed_sessions"))
    assert listing.startswith("s1: 2 ranks · gloo · cpu · 3 cells · memory per rank ")
    assert all(f"{name} ({kind})" in listing for name, kind in
               (("model", "DistributedDataParallel"), ("opt", "Adam"), ("loader", "DataLoader"),
                ("epochs_done", "int"), ("test_acc", "float")))
    # The pulled model is an ordinary Net that scores exactly what the session's model scored on the ranks.
    assert f"pulled: Net; test accuracy in the notebook {ranks_acc:.1f}%, on the ranks {ranks_acc:.1f}%" in text
    table = cell_text(profile)
    assert "nbtrain: profile of the recorded steps" in table
    assert "operator (self time, ms)                rank 0    rank 1" in table
    # DDP's all-reduce is in the recorded steps on every rank (whether it makes the top 8 operators by self time
    # depends on the machine's load: tests/test_profiling.py checks the table's operators on a quiet cell).
    communication = re.findall(r"rank (\d): communication (\d+\.\d+) ms", table)
    assert [rank for rank, _ in communication] == ["0", "1"] and sum(float(ms) for _, ms in communication) > 0, table
    assert f"traces (Chrome/Perfetto, TensorBoard): {tmp_path / 'runs' / 'profile'}" in table
    assert list((tmp_path / "runs" / "profile").glob("rank1.*.pt.trace.json"))
    closing = cell_text(next(c for c in cells if c.source.startswith("%distributed_close")))
    assert "nbtrain: session 's1' ended." in closing and "nbtrain: no sessions" in closing


def test_multinode_runs_on_two_emulated_nodes_and_their_agents_leave():
    nb = run_notebook("multinode.ipynb", STEPS=100)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    text = "\n".join(cell_text(c) for c in cells)
    joining = next(c for c in cells if "--emulate" in c.source)
    assert "started 2 emulated node agents on 127.0.0.2, 127.0.0.3" in cell_text(joining)
    join = re.search(r"--join (\S+)", cell_text(joining)).group(1)
    training, evaluation = (c for c in cells if c.source.startswith("%%distributed"))
    first = cell_text(training)
    assert "python -m nbtrain.node --join" not in first, "the command was printed by %distributed_nodes already"
    assert re.search(r"\[node [ab] rank 1\] rank 1 of 2", first) and "rank 0 of 2" in first, first
    assert "back in the notebook: Net, final loss" in text
    assert "(warm)" in cell_text(evaluation) and "accuracy over every node:" in text
    listing = cell_text(next(c for c in cells if c.source == "%distributed_nodes"))
    assert "node a: " in listing and "node b: " in listing and "127.0.0.2" in listing and "127.0.0.3" in listing
    # The notebook's %distributed_shutdown released the nodes: no agent of this pool is left.
    assert not [p for p in psutil.process_iter(["cmdline"]) if f"--join {join}" in " ".join(p.info["cmdline"] or ())]


def test_sharded_finetune_trains_sharded_resumes_on_one_rank_and_comes_back(tmp_path):
    nb = run_notebook("sharded_finetune.ipynb", CHECKPOINT=repr(str(tmp_path / "ckpt")))
    text = "\n".join(cell_text(c) for c in nb.cells)
    assert "FSDP2 · 2 ranks · 4 blocks + root" in text and "FSDP2 · 1 rank ·" in text, text
    assert "(the plain module, whole)" in text and "epoch 1: loss" in text
    assert "resuming from" in text and "epoch 3: loss" in text and "epoch 0: loss" not in text.split("resuming from")[1]
    losses = [float(v) for v in re.findall(r"epoch \d: loss (\d+\.\d+)", text)]
    assert losses[-1] < losses[0], losses
    assert "the untrained big model: loss" in text and "uninitialised" not in text


RESTART_HERE = "## Restart the kernel now"


def test_detached_trains_through_a_kernel_restart_and_attaches_from_the_new_kernel(tmp_path, monkeypatch):
    """The notebook in two kernels, as its reader runs it: the part before the restart, then the rest."""
    from nbtrain.wire import runfolder

    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(tmp_path / "runs"))  # the kernels, and the run's agent, inherit it
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "detached.ipynb"), as_version=4)
    apply_parameters(nb, {"STEPS": "300"})
    cut = next(i for i, cell in enumerate(nb.cells) if cell.source.startswith(RESTART_HERE))
    parameters = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    before, after = nb.copy(), nb.copy()
    before.cells, after.cells = nb.cells[:cut], parameters + nb.cells[cut:]
    options = {"timeout": 300, "kernel_name": "python3",
               "resources": {"metadata": {"path": os.path.join(ROOT, "notebooks")}}}
    NotebookClient(before, **options).execute()  # its kernel shuts down at the end: the restart
    started = "\n".join(cell_text(c) for c in before.cells)
    run_id = re.search(r"detached run (\S+): it goes on", started).group(1)
    assert runfolder.read_manifest(run_id).state is runfolder.RecordedState.RUNNING  # the kernel is gone, not the run

    NotebookClient(after, **options).execute()
    text = "\n".join(cell_text(c) for c in after.cells)
    assert f"detached run {run_id} is running" in text
    assert f"attached to detached run {run_id}" in text and "step 0: loss" in text
    assert "back in the notebook: model, final_loss, checksum" in text
    assert "300 logged steps" in text and "the model that came back is the one the ranks held: True" in text
    assert runfolder.read_manifest(run_id).state is runfolder.RecordedState.FINISHED
    assert "Warning" not in started + text  # a teaching notebook shows no warning of its own code


def test_hf_finetune_trains_with_the_trainer_and_its_logs_are_the_runs_series():
    pytest.importorskip("transformers")
    text = "\n".join(execute("hf_finetune.ipynb"))
    found = re.search(r"trained on 2 ranks: eval loss (\d+\.\d+), accuracy (\d\.\d+)", text)
    assert found, text
    assert float(found.group(2)) >= 0.7, text  # it learned the made-up task
    logged = re.search(r"logged by the Trainer: (.*)", text).group(1).split(", ")
    assert {"loss", "learning_rate", "eval_loss", "eval_accuracy"} <= set(logged), logged
    assert "logged by Hugging Face Trainer" in text  # the summary says which integration logged
    assert "the model says:" in text
