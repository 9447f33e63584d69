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


def _saved_outputs(nb, tmp_path, cell: int) -> list[dict]:
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, str(path))
    outputs = nbformat.read(str(path), as_version=4).cells[cell].outputs
    return [o.get("data", {}) for o in outputs if o.output_type in ("display_data", "execute_result")]


def test_gpus_stopped_by_gpus_stop_leaves_a_static_table(kernel_name, tmp_path):
    """%gpus, then %gpus --stop in a later cell: the saved notebook holds a table, not a widget."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext nbtrain"), nbformat.v4.new_code_cell("%gpus --interval 0.25"),
                nbformat.v4.new_code_cell("import time\ntime.sleep(0.8)\nget_ipython().run_line_magic('gpus', '--stop')")]
    nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=60,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    data = _saved_outputs(nb, tmp_path, 1)
    assert len(data) == 1 and "application/vnd.jupyter.widget-view+json" not in data[0], data
    plain = data[0]["text/plain"]
    assert plain.startswith("%gpus: stopped at ") and ("machine: CPU" in plain or "GPU" in plain)
    assert "nbt-row" in data[0]["text/html"]


@pytest.mark.slow
def test_gpus_ending_after_its_duration_replaces_its_widget_by_a_table():
    """--for: the monitor stops on its own thread and still replaces its display in place."""
    from helpers.kernelhelp import Kernel

    kernel = Kernel()
    try:
        kernel.execute("%load_ext nbtrain")
        kernel.kc.execute("%gpus --interval 0.25 --for 0.6")
        shown = updated = None
        try:
            for msg in kernel.messages(timeout=20):
                if msg["msg_type"] == "display_data":
                    shown = msg["content"]
                elif msg["msg_type"] == "update_display_data":
                    updated = msg["content"]
                    break
        except TimeoutError:
            pass  # said below: what was shown and whether it was replaced
    finally:
        kernel.shutdown()
    assert shown is not None and "application/vnd.jupyter.widget-view+json" in shown["data"]
    assert updated is not None, "the widget's display was not replaced"
    assert updated["transient"]["display_id"] == shown["transient"]["display_id"]
    assert "application/vnd.jupyter.widget-view+json" not in updated["data"]
    assert updated["data"]["text/plain"].startswith("%gpus: stopped at ")


ATTACK = """%%distributed 2 --cpu --keep-alive 0
import nbtrain
for step in range(3):
    nbtrain.log(**{"<img src=x onerror=alert(1)>": 1.0, "[click](javascript:alert(4))": 2.0,
                    "_cost $\\\\frac{1$": 3.0}, step=step)
raise ValueError("<img src=y onerror=alert(2)><script>alert(3)</script>")
"""


def test_metric_names_and_failure_text_are_text_in_the_summary_never_markup(kernel_name, tmp_path):
    """A metric named like an HTML tag and a failure whose message holds HTML: the saved summary renders them
    as the characters they are; no tag, script or link comes alive. A name that matplotlib would read as
    (broken) math still leaves the final picture."""
    mistune = pytest.importorskip("mistune")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext nbtrain"), nbformat.v4.new_code_cell(ATTACK)]
    nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=240, allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    data = _saved_outputs(nb, tmp_path, 1)
    markups = [d[kind] for d in data for kind in ("text/markdown", "text/html") if kind in d]
    summaries = [d["text/markdown"] for d in data if "text/markdown" in d]
    assert len(summaries) == 1 and "failed" in summaries[0], data
    for markup in markups:
        rendered = mistune.html(markup)  # as a front end renders trusted markdown: raw HTML passes through
        for live in ("<img", "<script", "<a "):
            assert live not in rendered, f"{live} came alive in {rendered!r}"
    assert sum("image/png" in d for d in data) == 1, f"no final picture: {[list(d) for d in data]}"
    shown = mistune.html(summaries[0])
    assert "&lt;img src=x onerror=alert(1)&gt;" in shown, "the metric's name is shown as text"
    assert "[click](javascript:alert(4))" in shown
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in shown, "the failure's text is shown as text"
