"""Counted words for the texts nbtrain builds: ``count("rank", 1)`` is "1 rank", ``count("rank", 2)`` "2 ranks".

Every message, summary and label that puts a number before a noun goes through :func:`count` (or
:func:`plural` for the noun alone), so none says "1 ranks". No imports: any package may use it.
"""

from __future__ import annotations

_IRREGULAR = {"process": "processes", "this": "these", "was": "were"}


def plural(word: str, number: float) -> str:
    """``word`` as it goes after ``number``: singular for exactly one, plural otherwise (0 ranks, 2 ranks)."""
    if number == 1:
        return word
    return _IRREGULAR.get(word, word + "s")


def count(word: str, number: float) -> str:
    """``"1 rank"``, ``"2 ranks"``, ``"0 ranks"``."""
    return f"{number} {plural(word, number)}"


def checkpoint_position(epoch: int, step: int, logged_step: int | None) -> str:
    """Where a checkpoint resumes, in the steps ``history`` and the dashboard count (the logged series go on at
    ``logged_step``), with the optimizer's step where that differs (``--grad-accum``, or logging less often)."""
    if logged_step is None or logged_step == step:
        return f"epoch {epoch}, step {step}"
    return f"epoch {epoch}, step {logged_step}; optimizer step {step}"
