"""Every rank's own part of a checkpoint (its RNG states, metric step counters and logged series) on rank 0, which
writes the checkpoint file; and rank 0's word for a save on every rank: a new shard folder's name, and which history
file the ranks' new logged points go to (:mod:`.history_saves`).

Under ``--shard`` the gather runs over the background saves' own gloo group while DCP writes the shards, so training
waits for one small broadcast of its own, rank 0's word.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from . import shard
from .history_saves import HistoryPlan
from .plain_gather import gather_plain
from .state import SaveGroup


def beside_the_write(group: SaveGroup, snapshot: dict) -> Callable[[], dict] | None:
    """The snapshot with every rank's state, gathered on rank 0 over the background saves' group — on a thread
    started now on the other ranks (what is returned joins it), on rank 0 by whoever calls what is returned (the
    file's writer). None for one rank: the snapshot holds its state already."""
    if group.size <= 1:
        return None
    background = shard.background_group()  # made on this thread: making a group is a collective of the default one
    mine = snapshot["ranks"][0]

    def gathered() -> dict:
        return {**snapshot, "ranks": gathered_on_rank0(group, mine, background)}

    if group.rank == 0:
        return gathered
    helper = threading.Thread(target=gathered, name="nbtrain-save-gather", daemon=True)
    helper.start()

    def joined() -> dict:
        helper.join()
        return snapshot
    return joined


def rank0s_plan(device, group: SaveGroup, history: HistoryPlan | None) -> tuple[str, HistoryPlan]:
    """Rank 0's word for a save, on every rank, in one small broadcast: a random name part for a new shard folder,
    and the history file the ranks' new points go to (``history``: rank 0's plan; None elsewhere)."""
    words = torch.tensor([secrets.randbits(31), *((history.token, history.saves) if history else (0, 0))],
                         dtype=torch.int64, device=device)
    if group.size > 1:
        dist.broadcast(words, src=0)
    token, file_token, saves = (int(word) for word in words.tolist())
    return f"{token:08x}", HistoryPlan(file_token, saves)


def gathered_on_rank0(group: SaveGroup, mine: dict, background) -> list | None:
    """Every rank's ``mine`` on rank 0, in rank order, over the ``background`` process group; None elsewhere."""
    if group.size <= 1:
        return [mine]
    return gather_plain(mine, torch.device("cpu"), background)  # the background group is gloo's
