"""%%distributed through a real IPython shell: options, help, user mistakes, results in the namespace."""

from __future__ import annotations

import psutil
import pytest
from helpers.workers import nbtrain_workers
from IPython.core.error import UsageError


def test_help_shows_options_and_examples(shell):
    doc = shell.find_cell_magic("distributed").__doc__
    for text in ("--cpu", "--gpus", "--backend", "--timeout", "--out", "--output", "--keep-alive", "Examples"):
        assert text in doc
    usage = doc.split("::", 1)[1].split()[0]
    assert usage == "%%distributed", f"the usage line names the cell magic: {usage}"
    assert shell.find_line_magic("gpus").__doc__.split("::", 1)[1].split()[0] == "%gpus"


@pytest.mark.parametrize("line, message", [
    ("0 --cpu", "at least 1"),
    ("2 --backend nccl", "nccl backend needs GPUs"),
    ("2 --cpu --gpus 0", "contradict"),
    ("2 --gpus 7", "GPU 7 not found"),
    ("2 --gpus x", "GPU numbers separated by commas"),
    ("2 --timeout -1", "positive number of seconds"),
    ("2 --out 1bad", "is not one"),
    ("2 --cpu --bogus", r"unknown option --bogus; `%%distributed\?` lists the options"),
])
def test_bad_options_are_usage_errors_before_any_process(shell, line, message):
    before = {p.pid for p in nbtrain_workers()}
    with pytest.raises(UsageError, match=message):
        shell.run_cell_magic("distributed", line, "x = 1\n")
    assert {p.pid for p in nbtrain_workers()} == before


def test_syntax_error_is_a_usage_error_with_the_cell_line(shell):
    before = {p.pid for p in nbtrain_workers()}
    with pytest.raises(UsageError, match="line 3"):
        shell.run_cell_magic("distributed", "2 --cpu", "a = 1\nb = (\n")
    assert {p.pid for p in nbtrain_workers()} == before


def test_cell_results_and_history_land_in_the_notebook(shell, capsys):
    shell.run_cell("import torch\nfrom torch import nn\nclass Tiny(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(3, 1)\n"
                   "    def forward(self, x):\n        return self.l(x)\n"
                   "data = torch.randn(32, 3)\n")
    result = shell.run_cell(
        "%%distributed 2 --cpu\n"
        "import nbtrain\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "net = DDP(Tiny())\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.05)\n"
        "for step in range(10):\n"
        "    loss = net(data[rank::2]).pow(2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    nbtrain.log(loss=loss)\n"
        "final = loss.item()\n")
    result.raise_error()
    ns = shell.user_ns
    assert isinstance(ns["net"], ns["Tiny"])  # the notebook's own class, unwrapped from DDP
    assert isinstance(ns["final"], float)
    assert len(ns["history"]["loss"]) == 10
    printed = capsys.readouterr().out
    assert "nbtrain: 2 ranks · gloo · cpu" in printed and "back in the notebook" in printed


def test_failure_is_shown_and_the_next_cell_works(shell, capsys):
    result = shell.run_cell("%%distributed 2 --cpu\nimport nbtrain\nnbtrain.log(seen=rank)\nvalue = 1 / (rank - 1)\n")
    assert result.error_in_exec is not None and type(result.error_in_exec).__name__ == "RankFailedError"
    logged = shell.user_ns["history"]  # what was logged before the failure is the notebook's (the run's outcome)
    assert logged.series("seen", rank=1).values == [1.0]
    assert not hasattr(result.error_in_exec, "history"), "the outcome carries the history, not the exception"
    shown = capsys.readouterr()
    assert "ZeroDivisionError" in shown.out + shown.err and "Cell line 4" in shown.out + shown.err
    result = shell.run_cell("%%distributed 2 --cpu --out value\nvalue = rank + 10\n")
    result.raise_error()
    assert shell.user_ns["value"] == 10


def test_shutdown_magic_stops_warm_ranks(shell, capsys):
    shell.run_cell("%%distributed 2 --cpu\nz = 1\n").raise_error()
    assert nbtrain_workers()
    shell.run_line_magic("distributed_shutdown", "")
    assert "stopped the warm ranks" in capsys.readouterr().out
    assert not nbtrain_workers()


@pytest.mark.parametrize("line, message", [
    ("--rdzv-host 10.0.0.5 --emulate 2", "cannot reach --rdzv-host 10.0.0.5: use --rdzv-host 127.0.0.1"),
    ("--emulate 2", "--emulate needs --rdzv-host 127.0.0.1"),
    ("--rdzv-host 127.0.0.1 --emulate -1", "1 or more"),
])
def test_emulated_nodes_need_a_loopback_rdzv_host_and_start_nothing_otherwise(shell, line, message):
    before = {p.pid for p in psutil.process_iter() if "nbtrain.node" in " ".join(_cmdline(p))}
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("distributed_nodes", line)
    assert {p.pid for p in psutil.process_iter() if "nbtrain.node" in " ".join(_cmdline(p))} <= before


def _cmdline(process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
