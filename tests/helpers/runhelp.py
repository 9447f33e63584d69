"""``run_cell``: the one way a test runs a cell on real ranks (2 CPU ranks on gloo unless told otherwise)."""

from __future__ import annotations

import textwrap

from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.request.config import LaunchRequest

DTYPE_PROBE = """
class Probe(torch.nn.Module):  # a Linear(8, 8) that records the dtype its forward computed in
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
    def forward(self, x):
        hidden = self.linear(x)
        self.seen = hidden.dtype
        return hidden
probe = Probe()
"""  # cell code: what precision prepare()'s autocast gives a model's forward (the cell imports torch first)


class Captured:
    """Collects what the ranks print, as the kernel's cell would show it."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, str]] = []

    def __call__(self, stream: str, text: str) -> None:
        self.parts.append((stream, text))

    def text(self, stream: str | None = None) -> str:
        return "".join(t for s, t in self.parts if stream in (None, s))

    def lines(self, stream: str | None = None) -> list[str]:
        """The lines as a notebook (or terminal) shows them: text after a \\r is drawn over the line's start."""
        shown = []
        for line in self.text(stream).split("\n"):
            screen = ""
            for part in line.split("\r"):
                screen = part + screen[len(part):]
            shown.append(screen)
        return shown


def run_cell(pools, source: str, ns: dict | None = None, *, write=None, observers=(), outcome=None, **options):
    """Run ``source`` (dedented) with the pool manager ``pools``; returns ``(namespace, result)``.

    ``options`` are LaunchRequest's (default: 2 ranks on the CPU); the ranks' output goes to ``write``
    (a ``Captured``, or any ``(stream, text)`` callable), and is dropped without one; ``outcome`` (a
    ``RunOutcome``) gets what was logged however the run ends.
    """
    options.setdefault("nprocs", 2)
    options.setdefault("cpu", True)
    ns = {} if ns is None else ns
    result = run_source(textwrap.dedent(source).lstrip("\n"), LaunchRequest(**options), ns, manager=pools,
                        write=write or Captured(), observers=observers, outcome=outcome)
    return ns, result


def notebook(source: str, **extra) -> dict:
    """A namespace as a notebook kernel has it: code run with __name__ == "__main__"."""
    ns = {"__name__": "__main__", **extra}
    exec(textwrap.dedent(source), ns)
    del ns["__builtins__"]
    return ns
