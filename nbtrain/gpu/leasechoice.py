"""Which GPUs a run asking for ``auto`` gets on a shared server, and the fair order of those who wait.

:func:`choose` is a plain function of what NVML says (each GPU's processes and their memory) and of the
leases held: a GPU is free when nobody leases it and processes nbtrain does not know of (a plain ``python
rank/train.py``) use little of its memory. Among free GPUs it prefers those close together where a distance is
given (NVML's topology), else the lowest indices. When too few are free, the answer says in plain words who
holds the others. :func:`queue_order` is the first-come order of waiting requests, fair across users.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

from nbtrain.gpu.devices import GpuStatus
from nbtrain.gpu.leases import HeldLease, describe
from nbtrain.common.words import count

FOREIGN_MEMORY_LIMIT = 1 << 30  # bytes other processes may use on a GPU that still counts as free
GIB = 1 << 30
MAX_EXHAUSTIVE = 5000  # groups compared for closeness before settling for the lowest indices


@dataclass(frozen=True)
class Choice:
    gpus: tuple[int, ...]  # empty when too few are free
    account: str  # why, in plain words ("" when chosen)


@dataclass(frozen=True)
class Ticket:
    """One waiting request: its owner (the ticket file's uid) and when it was made."""

    uid: int
    since: float
    name: str  # the ticket file's name, the last tie-breaker


def choose(wanted: int, gpus: list[GpuStatus], leases: list[HeldLease], known_pids: set[int],
           owner_of: Callable[[int], tuple[str, str]], distance: Callable[[int, int], int] | None = None) -> Choice:
    """Pick ``wanted`` free GPUs, or say why not. ``owner_of(pid)`` is (user, command line) of a process."""
    leased = {lease.gpu for lease in leases}
    in_use = {gpu.index: _foreign(gpu, known_pids) for gpu in gpus}
    free = [gpu.index for gpu in gpus if gpu.index not in leased and
            sum(memory for _, memory in in_use[gpu.index]) < FOREIGN_MEMORY_LIMIT]
    if len(free) >= wanted:
        return Choice(_closest(free, wanted, distance), "")
    reasons = describe_held(leases)
    for index, processes in sorted(in_use.items()):
        if index in leased:
            continue
        for pid, memory in processes:
            if not pid:
                reasons.append(f"GPU {index} by processes NVML does not list ({memory / GIB:.0f} GiB used)")
                continue
            user, command = owner_of(pid)
            reasons.append(f"GPU {index} by a process of {user}'s ({command}, {memory / GIB:.0f} GiB)")
    return Choice((), f"waiting for {count('GPU', wanted)} ({len(free)} free): " + ", ".join(reasons))


def describe_held(leases: list[HeldLease]) -> list[str]:
    """``GPU 0–1 held by bob (notebooks/llm.ipynb, training since 12:04)``: one phrase per holder's run of GPUs."""
    runs: list[list[HeldLease]] = []
    for lease in sorted(leases, key=lambda held: held.gpu):
        if runs and runs[-1][-1].pid == lease.pid and runs[-1][-1].gpu + 1 == lease.gpu:
            runs[-1].append(lease)
        else:
            runs.append([lease])
    return [describe(run[0]).replace(f"GPU {run[0].gpu}", f"GPU {run[0].gpu}\u2013{run[-1].gpu}", 1) if len(run) > 1
            else describe(run[0]) for run in runs]


def _foreign(gpu: GpuStatus, known_pids: set[int]) -> list[tuple[int, int]]:
    """(pid, bytes) of the processes on ``gpu`` that nbtrain does not know of; where NVML lists none (a container
    that hides them), the GPU's used memory, as pid 0's."""
    if gpu.processes is None:
        return [(0, gpu.memory_used)] if gpu.memory_used and gpu.memory_used >= FOREIGN_MEMORY_LIMIT else []
    return [(process.pid, process.used_memory or 0) for process in gpu.processes if process.pid not in known_pids]


def _closest(free: list[int], size: int, distance: Callable[[int, int], int] | None) -> tuple[int, ...]:
    groups = combinations(sorted(free), size)
    if distance is None:
        return next(groups)
    best = next(groups)
    best_cost = _spread(best, distance)
    for tried, group in enumerate(groups):
        if tried >= MAX_EXHAUSTIVE:
            break  # a very large machine: the lowest indices are close enough
        if (cost := _spread(group, distance)) < best_cost:
            best, best_cost = group, cost
    return best


def _spread(group: tuple[int, ...], distance: Callable[[int, int], int]) -> int:
    return sum(distance(a, b) for a, b in combinations(group, 2))


def queue_order(tickets: list[Ticket]) -> list[Ticket]:
    """First come, first served across users: each user's k-th request waits behind every user's (k-1)-th."""
    turn: dict[int, int] = {}
    keyed = []
    for ticket in sorted(tickets, key=lambda t: (t.since, t.name)):
        turn[ticket.uid] = turn.get(ticket.uid, 0) + 1
        keyed.append(((turn[ticket.uid], ticket.since, ticket.name), ticket))
    return [ticket for _, ticket in sorted(keyed, key=lambda pair: pair[0])]
