"""Counted words: "1 rank", never "1 ranks", in every text nbtrain builds (Python and the JupyterLab panel)."""

from __future__ import annotations

import pathlib
import re

from nbtrain.common.words import count, plural

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_count_agrees_with_the_number():
    assert [count("rank", n) for n in (0, 1, 2)] == ["0 ranks", "1 rank", "2 ranks"]
    assert plural("process", 3) == "processes" and count("core", 1) == "1 core"


def test_no_text_puts_a_bare_plural_after_a_number():
    """A number formatted straight before a plural noun ("{n} ranks") says "1 ranks" when n is 1."""
    pattern = re.compile(r"(\}|\$\{[^}]*\}) ((other|more|emulated|joined|idle|node) )*"
                         r"(ranks|cores|GPUs|restarts|monitors|names|steps|nodes|agents)\b(?!/)")
    sources = [*ROOT.joinpath("nbtrain").rglob("*.py"), *ROOT.joinpath("labextension", "src").rglob("*.ts")]
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for path in sources for number, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line) and ("f\"" in line or "f'" in line or "`" in line)]
    assert not offenders, "use nbtrain.common.words.count (or count() in format.ts):\n" + "\n".join(offenders)
