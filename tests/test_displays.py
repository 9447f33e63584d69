"""Figures and display() on rank 0 reach the cell as rich output, at their place among the text."""

from __future__ import annotations

import base64

from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from nbtrain.wire import protocol as P
from nbtrain.launch.displays import PendingDisplays
from nbtrain.launch.output import OutputRelay
from helpers.runhelp import Captured, run_cell

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_mark_that_comes_before_its_bundle_holds_the_text_after_it():
    """Socket and pipe race: the text after a figure waits for the figure, then follows it."""
    shown: list = []
    text = Captured()
    displays = PendingDisplays(text, publish=lambda data, meta: shown.append((len(text.text()), data)))
    relay = OutputRelay(text, 1, show_display=displays.show)
    relay.feed(0, "stdout", f"before\n{P.DISPLAY_MARK}1\nafter\n")
    assert text.text() == "before\n" and not shown
    displays.add(P.Display(7, 0, 1, {"text/plain": "fig"}), relay)
    assert shown == [(len("before\n"), {"text/plain": "fig"})] and text.text() == "before\nafter\n"


def test_plt_show_on_the_ranks_shows_rank_0s_figure_between_its_lines(fresh_pools):
    """Through real ranks, without IPython: the figure's place is written as text; rank 1's is dropped."""
    out = Captured()
    run_cell(fresh_pools, """
        import matplotlib.pyplot as plt
        print("before")
        plt.plot([1, 2, 3])
        plt.show()
        print("after", plt.get_fignums())
        plt.figure()  # left open: shown when the cell ends, as in a notebook
        """, write=out)
    rank0 = [line for line in out.text("stdout").splitlines() if not line.startswith("[rank ")]
    assert rank0 == ["before", "<Figure with 1 Axes> [image/png: shown in a notebook]", "after []",
                     "<Figure with 0 Axes> [image/png: shown in a notebook]"]
    assert "[rank 1] before" in out.text() and "[rank 1] <Figure" not in out.text()


def test_a_cell_with_plt_show_has_an_image_output_in_the_notebook(no_leftover_workers):
    nb = new_notebook(cells=[new_code_cell(c) for c in [
        "%load_ext nbtrain",
        "%%distributed 2 --cpu --no-dashboard\nimport matplotlib.pyplot as plt\nprint('before')\nplt.plot([0, 1], [1, 0])\n"
        "plt.show()\nclass Html:\n    def _repr_html_(self):\n        return '<b>rank %d</b>' % rank\n"
        "display(Html())\nprint('after')",
        "%distributed_shutdown",
    ]])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[1].outputs
    kinds = [o["output_type"] if o["output_type"] == "stream" else sorted(o["data"]) for o in outputs]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1 and base64.b64decode(images[0]["data"]["image/png"])[:8] == PNG
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert html == ["<b>rank 0</b>"], "rank 1's display is dropped"
    stream = "".join(o.get("text", "") for o in outputs)
    assert "before" in stream and "after" in stream
    first_image = kinds.index(["image/png", "text/plain"])
    assert "before" in "".join(o.get("text", "") for o in outputs[:first_image]), kinds
    assert "after" in "".join(o.get("text", "") for o in outputs[first_image:]), kinds
