"""One rank of a :class:`~.group.NodePool`, as its node reports it, and how a set of ranks is named in messages."""

from __future__ import annotations

from dataclasses import dataclass

from .hub import NodeConn


def rank_span(ranks) -> str:
    ranks = sorted(ranks)
    if not ranks:
        return "no ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    contiguous = ranks == list(range(ranks[0], ranks[-1] + 1))
    return f"ranks {ranks[0]}–{ranks[-1]}" if contiguous else "ranks " + ", ".join(map(str, ranks))


@dataclass
class RemoteRank:
    """One rank of the group, as its node reports it: the record that every per-rank question reads."""

    node: NodeConn | None = None  # known once its node said RanksStarted
    pid: int = 0  # on its node's machine
    exit_code: int | None = None  # None while it runs
    error: str | None = None  # its node's account of an exit (torch elastic's error file)
    account: str | None = None  # why its node is gone (lost, let go, never started)

    def exited(self) -> bool:
        return self.exit_code is not None
