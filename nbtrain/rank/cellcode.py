"""How a rank runs the cell's code: as a notebook runs a cell.

* **The last expression's value is shown**, as the cell's ``Out[n]``: when the cell's last top-level
  statement is an expression, it is compiled in ``"single"`` mode — as IPython compiles it — so Python
  hands its value to ``sys.displayhook``, which sends it through :func:`nbtrain.rank.display.show_value`
  (rank 0's value only; ``None`` is not shown, and a trailing ``;`` silences it, as in IPython; a
  figure shown this way is closed, not shown again at the end of the cell). A cell
  that ends with a statement runs as one module.
* **A warning names the cell's line** as the kernel's tracebacks do — ``Cell line 14: UserWarning: …``,
  the line as the user sees it (the magic's line counts, ``line_offset``), not the compiled cell's file
  name and body line. Only warnings whose location is the cell are changed; DataLoader workers forked
  while the cell runs inherit the formatting.
"""

from __future__ import annotations

import ast
import contextlib
import io
import sys
import tokenize
import warnings
from collections.abc import Callable, Iterator

from . import display


def run(source: str, filename: str, namespace: dict) -> None:
    """Execute the cell's ``source`` in ``namespace``; a last expression's value is shown (rank 0)."""
    tree = ast.parse(source, filename)
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr) or _silenced(source):
        exec(compile(tree, filename, "exec"), namespace)
        return
    exec(compile(ast.Module(tree.body[:-1], type_ignores=[]), filename, "exec"), namespace)
    with _displayhook(display.show_value):
        exec(compile(ast.Interactive([last]), filename, "single"), namespace)


@contextlib.contextmanager
def _displayhook(hook: Callable[[object], None]) -> Iterator[None]:
    saved = sys.displayhook
    sys.displayhook = hook
    try:
        yield
    finally:
        sys.displayhook = saved


def _silenced(source: str) -> bool:
    """Whether the cell's last token is ``;`` (IPython shows no value then)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT}
    last = None
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in skip:
                last = token
    except (tokenize.TokenError, SyntaxError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"


@contextlib.contextmanager
def cell_warnings(cell_filename: str, line_offset: int) -> Iterator[None]:
    """While the cell runs, a warning raised at one of its lines reads ``Cell line N: …``."""
    original = warnings.formatwarning

    def formatwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
        text = original(message, category, filename, lineno, line)
        where = f"{filename}:{lineno}:"
        if filename == cell_filename and text.startswith(where):
            text = f"Cell line {lineno + line_offset}:" + text[len(where):]
        return text

    warnings.formatwarning = formatwarning
    try:
        yield
    finally:
        warnings.formatwarning = original
