"""--profile STEPS: a torch.profiler trace per rank and the operator table under the cell, through a real kernel."""

from __future__ import annotations

import json

import pytest
from helpers.outputs import cell_text
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from nbtrain.kernel.diagnostics.profiling import parse_profile
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

pytestmark = pytest.mark.usefixtures("no_leftover_workers")

TRAINING = """
import torch
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(STEPS):
    loss = model(torch.randn(16, 32)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_profile_writes_a_trace_per_rank_and_shows_the_operator_table(tmp_path):
    nb = new_notebook(cells=[new_code_cell(c) for c in [
        "%load_ext nbtrain",
        "%%distributed 2 --cpu --no-dashboard --profile 2 --out -" + TRAINING.replace("STEPS", "5"),
        "%%distributed 2 --cpu --no-dashboard --profile 2 --out -" + TRAINING.replace("STEPS", "1"),
        "%distributed_shutdown",
    ]])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    table = cell_text(nb.cells[1])
    header = next(line for line in table.splitlines() if line.startswith("operator (self time, ms)"))
    assert header.split()[-4:] == ["rank", "0", "rank", "1"], table
    assert "c10d::allreduce_" in table, table  # DDP's gradient all-reduce, in the recorded steps
    assert "USDT" not in table, table  # Kineto's start/stop lines stay out of the cell
    for rank in (0, 1):
        assert f"rank {rank}: communication " in table and " compute " in table
    traces = sorted(p.name for p in (tmp_path / "profiles").iterdir())
    assert [name.split(".")[0] for name in traces] == ["rank0", "rank1"], traces
    assert all(name.endswith(".pt.trace.json") for name in traces)  # Chrome/Perfetto JSON, as TensorBoard reads it
    events = json.loads((tmp_path / "profiles" / traces[0]).read_text())["traceEvents"]
    assert sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#")) == 2  # the 2 active steps
    assert "nothing was recorded: the cell made 1 optimizer step(s)" in cell_text(nb.cells[2])


def test_profile_option_is_checked_before_any_process():
    assert parse_profile("3") == (1, 1, 3) and parse_profile("2, 0, 4") == (2, 0, 4)
    for bad in ("0", "x", "1,2", "1,1,0", "-1,1,2"):
        with pytest.raises(ConfigError, match="--profile takes the number of steps to record"):
            resolve(LaunchRequest(nprocs=2, cpu=True, profile=bad))


def test_with_tensorboard_the_traces_go_where_tensorboards_profiler_plugin_looks(tmp_path):
    config = resolve(LaunchRequest(nprocs=2, cpu=True, profile="1,0,2", tensorboard=str(tmp_path / "tb")))
    assert config.train.profile == (1, 0, 2) and config.train.profile_dir == str(tmp_path / "tb" / "profile")
