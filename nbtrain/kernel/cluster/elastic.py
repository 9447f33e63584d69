"""Elastic ``--nodes MIN:MAX``: when the group forms, and with how many nodes — torch elastic's rule, kernel-side.

torchrun's ``--nnodes MIN:MAX`` forms the group once MIN agents are in the rendezvous and then waits
``last_call_timeout`` for more, up to MAX. Here the kernel knows which nodes have joined its hub, so it makes
that decision itself (:class:`Formation`), then tells exactly the chosen nodes to run torch elastic's agent
with a rendezvous of that fixed size (``min_nodes = max_nodes = count``): every node agrees on the world size
(nodes × ``--nproc-per-node``) before any rank starts, and a node that joins late waits, idle, for the next cell.

The group is decided again for each new pool: the next cell after a node joined (an elastic group below MAX
re-forms with it, :meth:`~.group.NodePool.serves`), and each ``--max-restarts`` attempt after a node was lost
(the remaining and replacement nodes, as long as at least MIN are there).
"""

from __future__ import annotations

from ...common.words import count as counted


class Formation:
    """How many of the joined, idle nodes the group forms with, and when."""

    def __init__(self, min_nodes: int, max_nodes: int, last_call_s: float) -> None:
        self.min_nodes, self.max_nodes, self.last_call_s = min_nodes, max_nodes, last_call_s
        self._min_since: float | None = None  # when MIN nodes were first idle together

    def size(self, idle: int, now: float) -> int:
        """The group's node count if it forms now, else 0 (fewer than MIN, or the last call is still open)."""
        if idle >= self.max_nodes:
            return self.max_nodes
        if idle < self.min_nodes:
            self._min_since = None
            return 0
        if self._min_since is None:
            self._min_since = now
        return idle if now - self._min_since >= self.last_call_s else 0

    def announce(self, names: list[str], per_node: int) -> str:
        """What the cell prints when an elastic group forms: its nodes and the world size decided."""
        world = len(names) * per_node
        return (f"nbtrain: the group forms with {counted('node', len(names))} of {self.min_nodes}–{self.max_nodes} "
                f"({', '.join(names)}): world size {world} ({counted('node', len(names))} × "
                f"{counted('rank', per_node)})")
