"""What a cell shows, as text: one reading for live iopub messages and for the outputs a notebook saves.

An iopub message's ``msg_type`` and ``content`` have the shape of a saved output's ``output_type`` and
fields (nbformat stores the message), so both go through ``output_text``: a stream's text, an error's
traceback, a rich output's plain text (its markdown where it has no plain text). Parts are joined as the
front end shows them, with nothing added between a stream's chunks.
"""

from __future__ import annotations

RICH = ("execute_result", "display_data")


def output_text(kind: str, content: dict) -> str:
    """The text of one output (``kind``: its ``msg_type`` or ``output_type``); "" for one with none."""
    if kind == "stream":
        return content.get("text", "")
    if kind == "error":
        return "\n".join(content.get("traceback", []))
    if kind in RICH:
        data = content.get("data", {})
        return data.get("text/plain") or data.get("text/markdown", "")
    return ""


def cell_text(cell) -> str:
    """Everything a saved notebook cell shows, as text."""
    return "".join(output_text(o["output_type"], o) for o in cell.get("outputs", []))
