"""How a set of a NodePool's ranks is named in messages: ``rank 3``, ``ranks 2–3``, ``ranks 0, 2``."""

from __future__ import annotations


def rank_span(ranks) -> str:
    ranks = sorted(ranks)
    if not ranks:
        return "no ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    contiguous = ranks == list(range(ranks[0], ranks[-1] + 1))
    return f"ranks {ranks[0]}–{ranks[-1]}" if contiguous else "ranks " + ", ".join(map(str, ranks))
