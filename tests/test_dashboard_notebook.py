"""A real notebook run by nbclient on a real kernel: the dashboard's final picture stays in the file."""

from __future__ import annotations

import json
import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL = "nbtrain-test-python"

TRAIN = """%%distributed 2 --cpu --keep-alive 0
import time
import nbtrain
nbtrain.log(total_steps=20)
for step in range(20):
    nbtrain.log(loss=1.0 / (step + 1), step=step)
    if step % 5 == 4:
        nbtrain.log(val_loss=1.5 / (step + 1), step=step)
    time.sleep(0.05)
"""


@pytest.fixture
def kernel_name(tmp_path, monkeypatch):
    """A kernelspec for this interpreter, with this checkout importable (found through JUPYTER_PATH)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join([ROOT] + os.environ.get("PYTHONPATH", "").split(os.pathsep)).rstrip(os.pathsep)}
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "nbtrain test", "language": "python", "env": env,
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.delenv("NBTRAIN_DASHBOARD", raising=False)
    return KERNEL


def test_final_png_and_summary_are_saved_in_the_notebook(kernel_name, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext nbtrain"), nbformat.v4.new_code_cell(TRAIN),
                nbformat.v4.new_code_cell("%gpus --once")]
    client = nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=240,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    path = tmp_path / "run.ipynb"
    nbformat.write(nb, str(path))
    saved = nbformat.read(str(path), as_version=4)

    outputs = saved.cells[1].outputs
    data = [o.get("data", {}) for o in outputs if o.output_type in ("display_data", "execute_result")]
    pngs = [d["image/png"] for d in data if "image/png" in d]
    assert len(pngs) == 1, f"one final figure expected, outputs: {[list(d) for d in data]}"
    import base64

    assert base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    summaries = [d["text/markdown"] for d in data if "text/markdown" in d]
    assert len(summaries) == 1 and "2 ranks on gloo on cpu finished" in summaries[0]
    assert "step 20 of 20" in summaries[0] and "loss" in summaries[0]
    assert not any("application/vnd.jupyter.widget-view+json" in d for d in data), "the live widget was replaced"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "nbtrain: 2 ranks" in text
    gpus = "".join(o.get("text", "") for o in saved.cells[2].outputs if o.output_type == "stream")
    assert "machine: CPU" in gpus or "GPU" in gpus
