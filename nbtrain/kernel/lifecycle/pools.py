"""The kernel's pools of ranks: one warm pool for plain cells, reused while its spec matches, and the pools
that sessions (:mod:`.sessions`) pin; stopped when idle, replaced, or at the kernel's exit.

:class:`PoolManager` only hands pools out and takes them back; running a cell on one is :mod:`.run`'s.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ...gpu import leases
from ...wire import protocol as P
from ...wire.payload import reason
from ..observers.runlog import RunLog
from ..ranks.pool import LocalPool
from ..ranks.rankgroup import RankGroup
from ..ranks.starter import RankStarter
from ..ranks.spec import PoolSpec
from ..request.config import DEFAULT_KEEP_ALIVE_S, LaunchConfig
from ..request.notebook_modules import Workdir, fresh_ranks_note, stale_modules
from . import gpulease
from .sessions import SessionTable, stale_note


@dataclass(frozen=True)
class Acquired:
    """What :meth:`PoolManager.acquire` hands a run: a started group, whether its ranks were warm, and lines for
    the cell (why warm ranks were not reused, a session that ended, ranks spawned although a zygote was there)."""

    pool: RankGroup
    warm: bool
    notes: tuple[str, ...] = ()
    asked_at: float = 0.0  # time.time() when the run asked for it: the summary's time counts from here


class Machines(Protocol):
    """Machines the pool factory holds beyond any pool — a Slurm job whose nodes stay joined — and that are
    billed while they are held: kept as long as a warm pool would be after a cell, then released."""

    def kept(self, seconds: float) -> str: ...  # what is kept, and for how long, in words ("" if nothing is held)
    def release(self) -> str: ...  # give them back now; what was released, in words ("" if nothing)


class PoolManager:
    """One warm pool per kernel for plain cells, reused while its spec matches; stopped when idle or at exit.

    Sessions (:mod:`.sessions`) pin the pool they live on: it is not stopped when idle or replaced, only
    set aside (a plain cell with other options gets a pool of its own), until its last session ends.
    ``machines`` (a Slurm job, :class:`Machines`) are released when the idle timer ends the warm pool — after
    ``--keep-alive`` however the cell ended, at once with ``--keep-alive 0`` — and held while sessions live.
    """

    def __init__(self, pool_factory: Callable[[PoolSpec], RankGroup] = LocalPool, starter: RankStarter | None = None,
                 machines: Machines | None = None, stop_at_exit: bool = True, runs: RunLog | None = None) -> None:
        self.runs = runs or RunLog()  # nbtrain.runs(): every run of this kernel, one row each (companions share it)
        self.pool: RankGroup | None = None
        self.pool_factory = pool_factory  # a spec -> a pool (several machines: nbtrain.kernel.cluster.Cluster.make_pool)
        self.starter = starter or RankStarter()  # new ranks: forked from the kernel's zygote, or spawned
        self.sessions = SessionTable()
        self.machines = machines
        self._lock = threading.RLock()
        self._idle_timer: threading.Timer | None = None
        self._atexit = not stop_at_exit  # a detached run's ranks must outlive the kernel's exit
        self._keep_alive_s = DEFAULT_KEEP_ALIVE_S
        self._released_note = ""  # why the next cell's ranks are fresh: the idle timer stopped the warm ones
        self._session_timers: list[threading.Timer] = []  # idle sessions holding GPUs: the offer, the policy's limit
        self._gpu_leases: dict[int, tuple[PoolSpec, leases.Lease]] = {}  # id(pool) -> (the spec asked, its lease)
        self._pending: tuple[PoolSpec, leases.Lease] | None = None  # leased for the pool acquire makes next

    def lease_gpus(self, config: LaunchConfig, say: Callable[[str], None]) -> PoolSpec:
        """The spec to :meth:`acquire` with: the cell's, its GPUs leased (waited for in turn, said with ``say``)
        unless warm ranks that hold them serve it. Raises :class:`~.gpulease.GpusNotFree` or KeyboardInterrupt."""
        spec = config.pool
        if not gpulease.wants_lease(spec):
            return spec
        with self._lock:
            self._give_back_pending()
            session = self.sessions.live.get(config.session)
            if session is not None and session.pool.alive():
                return spec  # the session's ranks run it, on the GPUs they hold
            for pool in [self.pool, *self.sessions.pools()]:
                asked, lease = self._gpu_leases.get(id(pool), (None, None))
                if pool is not None and lease is not None and not config.fresh and asked == spec and pool.alive():
                    lease.set_state(leases.LeaseState.BUSY)
                    return pool.spec
            self._cancel_timer()
            self._set_aside()  # warm ranks of ours on other GPUs must not make this cell wait for them
        leased, lease = gpulease.lease_gpus(spec, config.gpu_wait_s, say)
        self._pending = (spec, lease)
        return leased

    def _give_back_pending(self) -> None:
        if self._pending is not None:
            self._pending[1].release()
            self._pending = None

    def _hold_gpus(self, pool: RankGroup) -> None:
        """Keep the lease taken for ``pool`` with it until it stops; a pool made again on GPUs its predecessor
        just gave back (a module changed) leases them again, without waiting."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[1].gpus == list(pool.spec.gpu_ids):
            self._gpu_leases[id(pool)] = pending
            return
        if pending is not None:
            pending[1].release()
        if gpulease.wants_lease(pool.spec):
            asked = pending[0] if pending is not None else pool.spec
            self._gpu_leases[id(pool)] = (asked, gpulease.lease_now(pool.spec.gpu_ids))

    def _stop(self, pool: RankGroup, **how) -> None:
        """Stop ``pool`` (``how``: :meth:`RankGroup.teardown`'s arguments), then give back the GPUs it leased."""
        try:
            pool.teardown(**how)
        finally:
            _, lease = self._gpu_leases.pop(id(pool), (None, None))
            if lease is not None:
                lease.release()

    def companion(self, detached: bool = False) -> PoolManager:
        """A manager of its own, for a background run's ranks: it shares this one's pool factory, zygote and log of
        runs (``nbtrain.runs()`` lists background, detached and attached runs too), never its warm pool or sessions (a blocking cell's ranks are not taken from it). A ``detached`` run's are
        not stopped when the kernel exits."""
        return PoolManager(self.pool_factory, self.starter, stop_at_exit=not detached, runs=self.runs)

    def acquire(self, config: LaunchConfig, workdir: Workdir) -> Acquired:
        """A started group for ``config``: the warm one when it serves, else a new one whose ranks are started here
        (forked from the zygote unless ``--spawn``). A start that fails tears the new group down and raises.
        Called by the run with its stop button's presses deferred, so that a press lands in the run's loop."""
        asked_at = time.time()
        pool, warm, note = self._choose(config.pool, config.fresh, workdir, config.session)
        if warm:
            return Acquired(pool, True, (note,), asked_at)
        try:
            started = self.starter.start(pool, config.spawn)
        except BaseException as exc:
            self.teardown(pool, grace=1.0, why=f"nbtrain failed: {reason(exc)}")
            raise
        return Acquired(pool, False, (note, started), asked_at)

    def _choose(self, spec: PoolSpec, fresh: bool, workdir: Workdir, session: str) -> tuple[RankGroup, bool, str]:
        """The group to run on, whether it is warm, and a note: why warm ranks were not reused, or a session ended."""
        with self._lock:
            self._cancel_timer()
            held, note = self.sessions.pool_for(session) if session else (None, "")
            if held is not None:  # a session keeps its ranks, even if a module changed since
                changed, moved = stale_modules(held.module_stamps, workdir, held.rank_path)
                return held, True, stale_note(session, changed + moved)
            for pool in [self.pool, *self.sessions.pools()]:  # the plain pool first, then those sessions hold
                if pool is not None and not fresh and pool.serves(spec) and pool.alive():
                    changed, moved = stale_modules(pool.module_stamps, workdir, pool.rank_path)
                    if not changed and not moved:  # warm ranks must not run an old version of the user's code
                        if pool is not self.pool:
                            self._set_aside()
                            self.pool = pool
                        return pool, True, note
                    note = note or fresh_ranks_note(changed, moved, workdir.cwd)
            self._set_aside()
            if not self._atexit:
                atexit.register(self.shutdown)
                self._atexit = True
            try:
                self.pool = self.pool_factory(spec)
            except BaseException:
                self._give_back_pending()
                raise
            try:
                self._hold_gpus(self.pool)
            except BaseException:
                self.pool = None  # made, never started: nothing to stop
                raise
            released, self._released_note = self._released_note, ""
            return self.pool, False, note or released

    def _set_aside(self) -> None:
        """The plain pool is being replaced: stop it, unless sessions live on it."""
        pool, self.pool = self.pool, None
        if pool is not None and not self.sessions.on(pool):
            self._stop(pool, graceful=True)

    def release(self, healthy: bool, keep_alive_s: float) -> None:
        with self._lock:
            self._keep_alive_s = keep_alive_s
            _, lease = self._gpu_leases.get(id(self.pool), (None, None))
            if lease is not None:
                lease.set_state(leases.LeaseState.IDLE_WARM)  # until the next cell, or until the pool stops
            if self.sessions.on(self.pool):
                self._watch_idle_sessions(keep_alive_s)
                return  # its sessions keep it until they end (or the administrator's limit)
            if not healthy or keep_alive_s <= 0:
                self.shutdown(graceful=healthy)
                return
            self._start_timer(keep_alive_s)

    def cell_ended(self, keep_alive_s: float) -> str:
        """A cell is over, however it ended (its restarts included): the machines stay for ``keep_alive_s``, as a
        warm pool does, then are released; what to say under the cell."""
        with self._lock:
            if self.machines is None or self.sessions.pools():
                return ""  # sessions keep their machines until they end
            if keep_alive_s <= 0:
                return self.machines.release()
            if self._idle_timer is None:  # no warm pool waits (a failure, the stop button): the machines alone
                self._start_timer(keep_alive_s)
            return self.machines.kept(keep_alive_s)

    def _start_timer(self, seconds: float) -> None:
        self._idle_timer = threading.Timer(seconds, self._idle)
        self._idle_timer.daemon = True
        self._idle_timer.start()

    def _idle(self) -> None:
        with self._lock:
            self._idle_timer = None
            if not self.sessions.on(self.pool):  # a session opened since the timer started keeps it
                if self.pool is not None:  # the next cell starts fresh ranks: it says why
                    held_gpus = id(self.pool) in self._gpu_leases
                    self._released_note = (f"nbtrain: the warm ranks were stopped after {self._keep_alive_s:g} s "
                                           "without a cell (--keep-alive)"
                                           + (", giving their GPUs back" if held_gpus else "")
                                           + "; started fresh ranks\n")
                self._set_aside()
            if self.machines is not None and not self.sessions.pools():
                self.machines.release()  # no cell to say it in: %distributed_nodes no longer lists the job

    def teardown(self, pool: RankGroup, *, grace: float, drain=None, why: str = "its ranks were stopped") -> list[str]:
        """Forget ``pool`` and end it at once (a failure, the stop button); ``drain`` shows its last output.
        Returns the sessions that ended with it."""
        with self._lock:
            if self.pool is pool:
                self._cancel_timer()
                self.pool = None
            ended = self.sessions.end_pool(pool, why)
        self._stop(pool, graceful=False, grace=grace, drain=drain)
        return ended

    def close_session(self, name: str) -> None:
        """End one session: its processes stop, unless another session lives on them (then only its namespace
        is dropped). Plain cells that shared them start warm ranks of their own when they next run."""
        with self._lock:
            pool = self.sessions.remove(name).pool
            if self.sessions.on(pool):
                pool.send_all(P.CloseSession(name))
                return
            if pool is self.pool:
                self._cancel_timer()
                self.pool = None
            if self.machines is not None and not self.sessions.pools() and self._idle_timer is None:
                self._start_timer(self._keep_alive_s)  # the last session held the machines: now as after a cell
        self._stop(pool, graceful=True)

    def shutdown(self, graceful: bool = True) -> bool:
        """Stop every pool: the warm one and those sessions hold (their sessions end)."""
        with self._lock:
            self._cancel_timer()
            pools = [p for p in [self.pool, *self.sessions.pools()] if p is not None]
            self.pool = None
            for pool in pools:
                self.sessions.end_pool(pool, "the ranks were shut down")
        for pool in dict.fromkeys(pools):
            self._stop(pool, graceful=graceful)
        return bool(pools)

    def _cancel_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        for timer in self._session_timers:
            timer.cancel()
        self._session_timers = []

    def _watch_idle_sessions(self, keep_alive_s: float) -> None:
        """Sessions' ranks that hold GPUs are not stopped silently when idle: after ``keep_alive_s`` a line under the
        last cell offers to give the GPUs back, and the administrator's ``session_release_s`` closes them."""
        held = self._gpu_leases.get(id(self.pool))
        if held is None or keep_alive_s <= 0:
            return
        limit = gpulease.session_release_s()
        self._session_timers = [threading.Timer(keep_alive_s, self._offer_release, (self.pool, held[1].gpus, limit))]
        if limit is not None:
            self._session_timers.append(threading.Timer(limit, self._close_idle_sessions, (self.pool, limit)))
        for timer in self._session_timers:
            timer.daemon = True
            timer.start()

    def _offer_release(self, pool: RankGroup, gpus: list[int], limit: float | None) -> None:
        names = self.sessions.on(pool)
        if names:  # printed with no cell running: it shows under the notebook's last cell
            later = f"; the server closes idle sessions after {limit:g} s" if limit is not None else ""
            print(f"nbtrain: session {', '.join(names)} keeps GPU {', '.join(map(str, gpus))} while idle; "
                  f"%distributed_close {names[0]} gives {'it' if len(gpus) == 1 else 'them'} back{later}", flush=True)

    def _close_idle_sessions(self, pool: RankGroup, limit: float) -> None:
        names = self.sessions.on(pool)
        for name in names:
            self.close_session(name)
        if names:
            print(f"nbtrain: session {', '.join(names)} closed after {limit:g} s without a cell (the administrator's "
                  "session_release_s), its GPUs given back; its variables on the ranks are gone", flush=True)
