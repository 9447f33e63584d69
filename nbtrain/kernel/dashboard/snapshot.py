"""The run's latest state as text, kept in the cell's outputs beside the live widget while the run lasts.

A live widget is drawn from models that live in the kernel: a notebook saved during the run and opened later
(another day, another kernel, nbconvert, GitHub's viewer) has none, and JupyterLab shows the widget's output as
"Error displaying widget: model not found". So from the moment the dashboard appears, a second output under it holds
what it shows in words — how far the run got, what it logged, the load — and the ticker refreshes it every
:data:`EVERY_S` seconds (one ``update_display``; its text took 55 µs to make on a loaded 2-core machine). It carries
the summary's role, so the summary takes its place at the end (:meth:`~nbtrain.kernel.dashboard.widget.RunDashboard.finish`).

Its markdown starts with an empty ``<span class="nbtrain-snapshot">``: nbtrain's JupyterLab extension
(``labextension/style/base.css``) hides this output while the cell's widget is live (the widget's box has the
class ``nbtrain-live``), so a running dashboard is not shown twice, and hides the widget's output where the widget
cannot be drawn, so a reopened notebook shows the latest state instead of the error. Front ends without the
extension show both outputs; a plain-text reader gets the ``text/plain`` copy. The widget's own output says in its
``text/plain`` (what an untrusted notebook, an export or a text reader shows) where the state is, not the widget
tree's ``repr`` (:class:`LiveView`).
"""

from __future__ import annotations

import time

from ..observers.events import RunState
from .final import summary_paragraph
from .model import RunModel
from .text import markdown_lines

EVERY_S = 10.0  # a few times a minute: what a notebook saved mid-run (autosave: every 2 min) shows is this recent
MARK = '<span class="nbtrain-snapshot"></span>'  # the class labextension/style/base.css hides and shows by
LIVE_CLASS = "nbtrain-live"  # the live dashboard's box: while one is drawn in the cell, the snapshot is hidden


LIVE_TEXT = "nbtrain's live dashboard (drawn while its kernel runs the cell; the run's latest state is below)"


class LiveView:
    """The live widget's output: the widget's view for front ends that draw it, :data:`LIVE_TEXT` as its text."""

    def __init__(self, widget) -> None:
        self.widget = widget

    def _repr_mimebundle_(self, **kwargs):
        return {**self.widget._repr_mimebundle_(**kwargs), "text/plain": LIVE_TEXT}


def snapshot_text(model: RunModel) -> str:
    """The run as the dashboard last saw it, in the summary's words, and when that was."""
    paragraph = summary_paragraph(model.store, model.telemetry, model.status or RunState.RUNNING, model.detail,
                                  len(model.ranks), model.where, model.progress(), model.cold_start)
    seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    return f"{paragraph}\nLast seen at {seen}; the live dashboard needs the kernel that ran it."


class Snapshot:
    """The latest state as a display object: marked markdown for front ends, the same words as plain text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/markdown": f"{MARK}\n\n{markdown_lines(self.text)}", "text/plain": self.text}
