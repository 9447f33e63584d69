"""The notebooks in notebooks/ run top to bottom through a real kernel, and their key results hold."""

from __future__ import annotations

import os
import sys

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from run_notebook import apply_parameters  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


def execute(name: str, **params) -> list[str]:
    nb = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
    apply_parameters(nb, {k: str(v) for k, v in params.items()})
    nb.cells.append(nbformat.v4.new_code_cell("%distributed_shutdown"))
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}).execute()
    return ["".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") or "\n".join(o.get("traceback", []))
                    for o in c.get("outputs", []))
            for c in nb.cells]


def test_quickstart_trains_and_brings_the_model_back():
    outputs = "\n".join(execute("quickstart.ipynb", RANKS=2, EPOCHS=10))
    assert "nbtrain: 2 ranks · gloo · cpu" in outputs
    line = next(l for l in outputs.splitlines() if l.startswith("model: Net"))
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
