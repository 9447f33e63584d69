"""What a run says while its ranks are not all there, and when ``--start-timeout`` passes before they are.

A ``--max-restarts`` restart after a lost node needs a node in its place: the run says at once that it
waits — how many nodes joined, the command that joins one (the pool's :meth:`start_hint`, which asks the
hub for it), the time left — then again every :data:`WAITING_EVERY_S`. When the time is up no rank raised
or died, so the failure is nbtrain's own account (a :class:`~nbtrain.kernel.diagnostics.failures.RankFailure` with ``account`` and no
exit code), which :mod:`.restarts` does not restart: "no replacement node joined within 90 s".
"""

from __future__ import annotations

from ...common.words import plural
from ..ranks.rankgroup import RankGroup

WAITING_EVERY_S = 30.0  # how often a restart that waits for a replacement node says so again


def start_timeout_account(pool: RankGroup, timeout_s: float, restart: int) -> str:
    """Why the ranks ``pool.not_ready()`` failed: they did not join within ``timeout_s``."""
    joined = pool.nodes_joined()
    if restart and joined:  # a restart's group needs a node in place of a lost one
        return f"no replacement node joined within {timeout_s:.0f} s; {joined}"
    waiting = pool.not_ready()
    return (f"{plural('rank', len(waiting))} {', '.join(map(str, waiting))} did not join the process group within "
            f"{timeout_s:.0f} s (--start-timeout SECONDS or NBTRAIN_START_TIMEOUT waits longer){pool.start_hint()}")


def waiting_line(pool: RankGroup, left_s: float, first: bool) -> str:
    """A restart's line about the nodes it waits for; "" when none is missing (or the pool has no nodes)."""
    joined = pool.nodes_joined()
    if not joined:
        return ""
    if first:
        return (f"nbtrain: waiting for a node to replace the lost one{pool.start_hint()}\n"
                f"The restart waits {left_s:.0f} s for it (--start-timeout).\n")
    return f"nbtrain: still waiting for a replacement node: {joined}; {left_s:.0f} s left\n"
