"""Sessions, kernel side: which warm pool each session lives on, what it holds, and when it ends.

``%%distributed 2 --session s1`` runs the cell in the namespace session ``s1`` keeps on every rank
(:mod:`nbtrain.rank.session`): cell 1 builds the model and the loader, cell 2 trains, cell 3 evaluates,
and the model never leaves the ranks. A session is not a pool of its own: it is a name on a warm pool, so
plain cells and sessions with the same options run on the same processes, and several sessions can share
one pool. :class:`SessionTable` (owned by the ``PoolManager``) records, per session, its pool, its cells,
the names rank 0 reported it holds, and what the notebook's names were bound to after its last cell.

The rules it decides:

* **Names in.** A name the cell reads comes from the notebook as in a plain cell — unless the session
  already holds that name and the notebook has not rebound it since the session's last cell. So the copy
  of ``model`` that came back after cell 1 does not overwrite the live model on the ranks in cell 2, but
  ``lr = 0.01`` typed in the notebook reaches the session. (Changing an object in place in the notebook is
  not seen; assign the name again.)
* **Names back.** As a plain cell: what the cell assigns, or ``--out``; ``%distributed_pull`` fetches a held
  name later.
* **One curve.** What the session's cells log with ``nbtrain.log()`` is one set of series: each cell's steps
  go on from the last cell's (the ranks keep the step counters, :mod:`nbtrain.rank.session`), and
  ``history`` after a cell holds the session's series so far (:attr:`Session.history`).
* **Same processes.** A session keeps its pool: the idle timer does not stop it, a plain cell that needs
  other options starts a pool beside it instead of replacing it, and a later cell of the session must ask
  for the same ranks (:meth:`SessionTable.check`, before anything runs; the error names each option that
  differs, with the session's value and the cell's).
* **Endings.** ``%distributed_close`` ends one session; ``%distributed_shutdown`` and the kernel's exit end
  all. A pool torn down — a rank that died, a rank stuck in a collective after another failed, the stop
  button — ends every session on it, and the run says so; the next cell of that session starts it afresh
  and says why. A cell that raised on every rank (or raised on some while the others finished) leaves the
  session as it was before the cell (:mod:`nbtrain.rank.session` restores the bindings).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace

import psutil

from ...wire import protocol as P
from ...common.words import count, plural
from ..observers.history import History
from ..ranks.rankgroup import RankGroup
from ..ranks.spec import PoolSpec
from ..request.config import ConfigError

SESSION_FAILURE_GRACE_S = 3.0  # a session survives a failure only if every rank answers: wait this long for them


class SessionError(ConfigError):
    """A session asked for something it cannot do (unknown name, other options than its ranks have)."""


@dataclass
class Session:
    name: str
    pool: RankGroup
    started: float = field(default_factory=time.time)
    cells: int = 0
    held: tuple[tuple[str, str], ...] = ()  # (name, type) on rank 0 after its last successful cell
    gpu_bytes: dict[int, int] = field(default_factory=dict)
    seen: dict[str, object] = field(default_factory=dict)  # the notebook's objects for held names, after that cell
    history: History = field(default_factory=History)  # every series its cells logged, one curve across them

    def carry(self, history: History) -> None:
        """The series of the session's cells so far: its next cell's curves go on from them."""
        self.history = history

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.held)


def describe_spec(spec: PoolSpec) -> str:
    where = "cpu" if spec.device_type == "cpu" else "GPUs " + ",".join(map(str, spec.gpu_ids))
    return f"{count('rank', spec.nprocs)} ({spec.backend}, {where})"


_OPTION_OF = {"nprocs": "the number of ranks", "backend": "--backend", "device_type": "the device (--cpu)",
              "gpu_ids": "--gpus", "timeout_s": "--timeout", "env": "--env", "nodes": "--nodes",
              "nproc_per_node": "--nproc-per-node", "rdzv_host": "--rdzv-host", "hosts": "--hosts",
              "ssh_options": "--ssh-option", "remote_python": "--remote-python", "min_nodes": "--nodes MIN:MAX"}


def spec_differences(session: PoolSpec, cell: PoolSpec) -> list[str]:
    """Each option in which a cell's ranks differ from a session's: "--env: the session's A=1, this cell's A=2"."""
    return [f"{_OPTION_OF.get(f.name, f.name)}: the session's {_shown(getattr(session, f.name))}, "
            f"this cell's {_shown(getattr(cell, f.name))}"
            for f in fields(PoolSpec) if f.compare and getattr(session, f.name) != getattr(cell, f.name)]


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:g} s"  # the only float options that decide the ranks are timeouts
    if isinstance(value, tuple):
        pairs = [f"{item[0]}={item[1]}" for item in value if isinstance(item, tuple)]  # --env
        return " ".join(pairs) if pairs else ",".join(map(str, value)) or "none"
    return str(value) if value != "" else "none"


class SessionTable:
    def __init__(self) -> None:
        self.live: dict[str, Session] = {}
        self.ended: dict[str, str] = {}  # name -> why it ended (said once, by the session's next cell)

    def check(self, name: str, spec: PoolSpec, fresh: bool) -> None:
        """Before anything runs: a live session's next cell must fit the ranks it lives on."""
        session = self.live.get(name)
        if session is None:
            return
        if fresh:
            raise SessionError(f"--fresh would start new ranks, but session {name!r} lives on its ranks. "
                               f"End it first with %distributed_close {name}, or leave --fresh out.")
        chosen = spec.gpu_count and replace(session.pool.spec, gpu_ids=()) == spec  # --gpus auto chose its GPUs
        if session.pool.spec != spec and not chosen:
            differences = "; ".join(spec_differences(session.pool.spec, spec))
            raise SessionError(f"Session {name!r} runs on {describe_spec(session.pool.spec)}, with other options than "
                               f"this cell's: {differences}. Give the options the session started with, or end it "
                               f"with %distributed_close {name} first.")

    def spec_holding(self, name: str, names: list[str]) -> PoolSpec:
        """The ranks' spec of session ``name``, which must hold every one of ``names`` (``%distributed_pull``)."""
        live = self.live.get(name)
        if live is None:
            raise SessionError(self.unknown(name))
        missing = [n for n in names if n not in live.names]
        if not names or missing:
            have = ", ".join(live.names) or "no names yet"
            raise SessionError(f"Session {name!r} holds no {', '.join(map(repr, missing)) or 'name given'}; "
                               f"it holds: {have}.")
        return live.pool.spec

    def pool_for(self, name: str) -> tuple[RankGroup | None, str]:
        """The live pool of session ``name`` (None: start it), and a note when it had ended."""
        session = self.live.get(name)
        if session is not None and session.pool.alive():
            return session.pool, ""
        if session is not None:
            self.end_pool(session.pool, "its ranks are no longer running")
        why = self.ended.pop(name, None)
        return None, (f"nbtrain: session {name!r} ended earlier ({why}); it starts again, empty\n" if why else "")

    def open(self, name: str, pool: RankGroup) -> Session:
        session = self.live.get(name)
        if session is None or session.pool is not pool:
            session = self.live[name] = Session(name, pool)
        return session

    def on(self, pool: RankGroup | None) -> list[str]:
        """The sessions living on ``pool``."""
        return [s.name for s in self.live.values() if s.pool is pool]

    def pools(self) -> list[RankGroup]:
        return list({id(s.pool): s.pool for s in self.live.values()}.values())

    def end_pool(self, pool: RankGroup, why: str) -> list[str]:
        """``pool`` is going: its sessions end, remembering ``why`` for their next cell."""
        ended = self.on(pool)
        for name in ended:
            del self.live[name]
            self.ended[name] = why
        return ended

    def remove(self, name: str) -> Session:
        session = self.live.pop(name, None)
        if session is None:
            raise SessionError(self.unknown(name))
        return session

    def nothing_to_pull(self, word: str) -> str:
        """What ``%distributed_pull WORD`` without names was missing: the names, or the session before them."""
        live = self.live.get(word)
        if live is not None:
            have = ", ".join(live.names) or "no names yet"
            return f"Say which names of session {word!r} to bring back: %distributed_pull {word} NAME …; it holds: {have}."
        holders = [s.name for s in self.live.values() if word in s.names]
        if holders:
            return f"%distributed_pull takes the session first: %distributed_pull {holders[0]} {word}"
        held = "; ".join(f"{s.name} holds {', '.join(s.names) or 'no names yet'}" for s in self.live.values())
        return (f"%distributed_pull SESSION NAME … brings names a session holds into the notebook, and {word!r} is "
                f"neither a session nor a name one holds. " + (f"Sessions: {held}." if held else
                                                                "This kernel has no session (--session NAME)."))

    def unknown(self, name: str) -> str:
        if name in self.ended:
            return f"Session {name!r} has ended ({self.ended[name]})."
        have = ", ".join(self.live) or "none"
        return f"There is no session {name!r}; the sessions of this kernel are: {have}."

    def names_to_send(self, name: str, names: list[str], namespace: dict) -> list[str]:
        """Of the notebook names a cell reads, those to send: not the ones the session holds and the notebook
        has not rebound since the session's last cell."""
        session = self.live.get(name)
        if session is None:
            return names
        held = set(session.names)
        return [n for n in names if n not in held or session.seen.get(n, _UNSEEN) is not namespace.get(n)]

    def record(self, name: str, pool: RankGroup, done: dict[int, P.Done], namespace: dict) -> None:
        """After a successful cell of ``name``: what the session holds now, and the notebook's bindings."""
        session = self.open(name, pool)
        session.cells += 1
        first = done.get(0)
        session.held = first.held if first is not None else session.held
        session.gpu_bytes = {r: d.gpu_bytes for r, d in done.items() if d.gpu_bytes is not None}
        session.seen = {n: namespace[n] for n in session.names if n in namespace}


_UNSEEN = object()


def stale_note(name: str, paths: list[str]) -> str:
    """A session's ranks imported a module that changed since: the session keeps the old one, and says so."""
    if not paths:
        return ""
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return (f"nbtrain: {shown} changed since session {name!r} imported it; the session keeps the version it "
            f"imported (reload it in a cell, or %distributed_close {name} and start again)\n")


def kept_sentence(name: str) -> str:
    return (f"Session {name!r} keeps the names it held before this cell (objects the cell changed in place "
            "stay changed), and the notebook's variables are unchanged; fix the cell and run it again.")


def stuck_sentence(raised: list[int], stuck: list[int], backend: str) -> str:
    """Why a session whose cell raised on some ranks could not be kept: the others did not finish the cell."""
    who, did = (f"Rank {stuck[0]}", "was") if len(stuck) == 1 else (f"Ranks {', '.join(map(str, stuck))}", "were")
    return (f"{who} {did} still in the cell {SESSION_FAILURE_GRACE_S:.0f} s after {plural('rank', len(raised))} "
            f"{', '.join(map(str, raised))} raised — waiting in a collective (a DDP backward's all-reduce), most likely. "
            f"{_NO_ABORT.get(backend, f'nbtrain does not abort a collective in flight on {backend} yet')}, "
            "so the ranks were stopped.")


_NO_ABORT = {  # why a pending collective ends only with its process (gloo's abort does not release a waiting peer)
    "gloo": "A collective in flight cannot be aborted on gloo without ending its process",
    "nccl": "nbtrain does not abort a collective in flight on nccl yet (it would re-create the process group under "
            "the session's DDP models)",
}


def ended_sentence(names: list[str]) -> str:
    which = ", ".join(repr(n) for n in names)
    return (f"{'Sessions' if len(names) > 1 else 'Session'} {which} ended with the ranks: "
            "what {} held is gone; running the cells that build it starts it again.".format(
                "they" if len(names) > 1 else "it"))


def memory_of(pid: int) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.Error, OSError):
        return None


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


def session_lines(table: SessionTable) -> list[str]:
    """``%distributed_sessions``: each session's ranks, devices, memory and the names it holds."""
    if not table.live:
        return ["nbtrain: no sessions (start one with %%distributed N --session NAME)."]
    lines = []
    for s in table.live.values():
        devices = sorted(set(s.pool.devices.values())) or ["?"]
        rss = ", ".join(_mib(memory_of(pid)) for pid in s.pool.pids())
        lines.append(f"{s.name}: {count('rank', s.pool.world_size)} · {s.pool.spec.backend} · {', '.join(devices)} · "
                     f"{count('cell', s.cells)} · memory per rank {rss}"
                     + (f" · GPU tensors {', '.join(_mib(b) for _, b in sorted(s.gpu_bytes.items()))}" if s.gpu_bytes else ""))
        shown = [f"{n} ({kind})" for n, kind in s.held if kind != "module" and not n.startswith("_")]
        lines.append("    holds: " + (", ".join(shown) if shown else "nothing yet"))
    return lines
