"""Figures and display() on rank 0 reach the cell as rich output, at their place among the text."""

from __future__ import annotations

import base64

from helpers.runhelp import Captured, run_cell
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from nbtrain.kernel.relay.displays import PendingDisplays
from nbtrain.kernel.relay.output import AtMarks, OutputRelay
from nbtrain.wire import protocol as P

PNG = b"\x89PNG\r\n\x1a\n"
PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def test_a_mark_that_comes_before_its_bundle_holds_the_text_after_it():
    """Socket and pipe race: the text after a figure waits for the figure, then follows it."""
    shown: list = []
    text = Captured()
    displays = PendingDisplays(text, publish=lambda message: shown.append((len(text.text()), message.data)))
    relay = OutputRelay(text, 1, at_marks=AtMarks(show_display=displays.show))
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
        figure = plt.figure()  # left open: shown when the cell ends, as in a notebook
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


def test_ipython_display_imported_in_the_cell_shows_rank_0s_only(fresh_pools):
    """Through real ranks, without IPython's shell: IPython's own display() goes the cell's way, not print's."""
    out = Captured()
    run_cell(fresh_pools, """
        from IPython.display import HTML, display
        display(HTML("<b>rank %d</b>" % rank))
        print("after")
        """, write=out)
    lines = out.text("stdout").splitlines()
    assert lines.count("<IPython.core.display.HTML object> [text/html: shown in a notebook]") == 1, lines
    assert sorted(lines) == sorted(["<IPython.core.display.HTML object> [text/html: shown in a notebook]",
                                    "after", "[rank 1] after"]), lines


def test_ipython_display_and_the_last_value_are_rich_outputs_in_the_notebook(no_leftover_workers):
    """In a real kernel: HTML, Markdown and Image from IPython.display show as rank 0's rich outputs (a
    display_id's output is updated in place); the cell's last expression shows as a notebook's Out does
    (pretty text) — not after a `;` or a statement."""
    body = ("from IPython.display import display, HTML, Markdown, Image\n"
            "import IPython.display\n"
            "print('before')\n"
            "display(HTML('<b>rank %d</b>' % rank), Markdown('*rank %d*' % rank))\n"
            f"IPython.display.display(Image(data={PNG_1PX!r}))\n"
            "progress = display(HTML('<i>step 0</i>'), display_id=True)\n"  # a handle on every rank
            "progress.update(HTML('<i>step 2</i>'))\n")
    nb = new_notebook(cells=[new_code_cell(c) for c in [
        "%load_ext nbtrain",
        f"%%distributed 2 --cpu --no-dashboard\n{body}{{'rank': rank, 'steps': list(range(30))}}",
        "%%distributed 2 --cpu --no-dashboard\nrank + 10;",
        "%%distributed 2 --cpu --no-dashboard\nvalue = rank + 10",
        "%distributed_shutdown",
    ]])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[1].outputs
    rich = [o["data"] for o in outputs if o["output_type"] == "display_data"]
    stream = "".join(o.get("text", "") for o in outputs)
    assert "IPython.core.display" not in stream and "before" in stream, stream
    assert [d.get("text/html") for d in rich[:1]] == ["<b>rank 0</b>"], rich
    assert [d.get("text/markdown") for d in rich[1:2]] == ["*rank 0*"], rich
    assert base64.b64decode(rich[2]["image/png"]) == PNG_1PX, rich
    assert rich[3]["text/html"] == "<i>step 2</i>", "updated in place, as IPython's update_display does"
    assert len(rich) == 4, rich
    value = [o for o in outputs if o["output_type"] == "execute_result"]  # Out[2], as the notebook shows it
    assert len(value) == 1 and value[0]["execution_count"] == 2, outputs
    assert value[0]["data"]["text/plain"].startswith("{'rank': 0,\n 'steps': [0,\n  1,"), value
    for quiet in nb.cells[2:4]:
        assert not [o for o in quiet.outputs if o["output_type"] != "stream"], quiet.outputs
