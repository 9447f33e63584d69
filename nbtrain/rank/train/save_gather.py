"""Every rank's own part of a checkpoint (its RNG states, metric step counters and logged series) on rank 0, which
writes the checkpoint file; and rank 0's word for a save on every rank: a new shard folder's name, and which history
file the ranks' new logged points go to (:mod:`.history_saves`).

Under ``--shard`` a sync save's parts travel with the ranks' DCP plans (:mod:`.save_planner`), in the gather DCP
makes anyway; a background save's go over the background saves' own gloo group while DCP writes the shards. Either
way training waits for one small broadcast of its own, rank 0's word. Each part is the bytes of ``torch.save``,
read with ``weights_only=True`` (:mod:`.plain_gather`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import torch
import torch.distributed as dist

from . import shard
from .history_saves import HistoryPlan
from .plain_gather import PeerValueError, from_plain_bytes, gather_plain, plain_bytes
from .state import SaveGroup


def part_for_rank0(group: SaveGroup, snapshot: dict) -> bytes | None:
    """This rank's own state, as the bytes its DCP plan carries to rank 0; None on rank 0 (its own is at hand there)
    and for one rank."""
    return plain_bytes(snapshot["ranks"][0]) if group.size > 1 and group.rank != 0 else None


def with_every_rank(snapshot: dict, parts: list[bytes | None] | None) -> dict:
    """Rank 0's snapshot with every rank's own state (``parts``: what each rank's plan carried, rank 0's None), read
    as plain values; a PeerValueError, and nothing run, for a part that is not."""
    if not parts or len(parts) <= 1:
        return snapshot
    own = snapshot["ranks"][0]
    return {**snapshot, "ranks": [own if rank == 0 else from_plain_bytes(part or b"", rank)
                                  for rank, part in enumerate(parts)]}


def after_the_write(group: SaveGroup, snapshot: dict) -> Callable[[], dict]:
    """Every rank's part gathered on rank 0 now, over the background saves' group: should a DCP not call its
    planner's ``finish_plan``, which hands the parts over. Returns what rank 0's file holds (a part that is not plain
    values raises when it is asked for: rank 0's error in writing the file)."""
    if group.size <= 1:
        return lambda: snapshot
    try:
        ranks = gathered_on_rank0(group, snapshot["ranks"][0], shard.background_group())
    except PeerValueError as exc:
        refusal = exc  # the except clause unbinds exc

        def refused() -> dict:
            raise refusal
        return refused
    whole = {**snapshot, "ranks": ranks} if ranks is not None else snapshot
    return lambda: whole


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
