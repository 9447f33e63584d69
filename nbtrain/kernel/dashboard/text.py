"""Short, human formats shared by the views: sizes, durations, percentages, sparklines. ``None`` is N/A.

Text that holds what the user or their code chose (metric names, a failure's message, node names) is made
literal before it enters markup: :func:`markdown_literal` for ``text/markdown`` (which a trusted notebook
renders with its raw HTML alive), :func:`plot_literal` for matplotlib (which reads ``$…$`` as math and hides
labels that start with ``_``). HTML panels use :func:`html.escape`.
"""

from __future__ import annotations

import html
import re

from ...gpu.telemetry import NO_DRIVER

NA = "N/A"
_BLOCKS = "▁▂▃▄▅▆▇█"


def size(num_bytes: float | None) -> str:
    if num_bytes is None:
        return NA
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit in ("B", "KiB") else f"{value:.1f} {unit}"
        value /= 1024
    return NA


def duration(seconds: float | None) -> str:
    """``7 s``, ``3 min 5 s``, ``2 h 10 min``: one form for every duration the views show (the JupyterLab panel's too)."""
    if seconds is None or seconds != seconds or seconds < 0:
        return NA
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def percent(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return NA
    return f"{value:.{digits}g}"


def rate(value: float | None) -> str:
    if value is None:
        return NA
    return f"{value:.1f}/s" if value < 100 else f"{value:.0f}/s"


def no_gpu(nvml_error: str) -> str:
    """Why there are no GPU numbers, in plain words that start a sentence: "No GPU on this machine" where no NVIDIA
    driver is installed (a laptop, CI), else the driver's own error (a GPU that is there but cannot be read)."""
    return "No GPU on this machine" if nvml_error.startswith(NO_DRIVER) else f"No GPU numbers ({nvml_error})"


def sparkline(values, top: float = 100.0) -> str:
    """Unicode blocks, one per value scaled to ``top``; missing values are blanks."""
    out = []
    for value in values:
        if value is None:
            out.append(" ")
        else:
            level = min(max(value / top, 0.0), 1.0)
            out.append(_BLOCKS[min(int(level * len(_BLOCKS)), len(_BLOCKS) - 1)])
    return "".join(out)


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()!|~$])")
_LINE_BREAKS = re.compile(r"\s*[\r\n]+\s*")


def markdown_literal(plain: str) -> str:
    """Markdown that renders as exactly ``plain``, on one line: no tag, link, image, emphasis or math in
    ``plain`` comes alive (HTML's ``& < >`` become entities, markdown's own marks are backslash-escaped)."""
    one_line = _LINE_BREAKS.sub(" ", plain)  # a line of its own could start a heading, a list or a code block
    return html.escape(_MARKDOWN_SPECIAL.sub(r"\\\1", one_line), quote=False)


def markdown_lines(plain: str) -> str:
    """Markdown that renders as ``plain``'s lines, each literally (:func:`markdown_literal`), each on a line of its own."""
    return "  \n".join(markdown_literal(line) for line in plain.splitlines())  # two spaces: a line break


def plot_literal(plain: str) -> str:
    """``plain`` as matplotlib draws it literally: ``$`` escaped (not math), a leading ``_`` kept visible."""
    escaped = plain.replace("$", r"\$")
    return "\u200b" + escaped if escaped.startswith("_") else escaped
