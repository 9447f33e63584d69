"""``--ft`` in a cell: this rank is one torchft replica group, which keeps stepping while another is lost.

The kernel gives each rank a :class:`~nbtrain.wire.protocol.FaultTolerance` with its job (over the authenticated
channel): the run's Lighthouse and recovery secret. The cell does not change; ``prepare()`` does the rest.

* **Joining.** As the cell starts the group builds its Manager (:class:`~.ft.ReplicaGroup`), whose heartbeats tell
  the Lighthouse it is coming; at its first ``prepare()`` it waits for the kernel's go (every rank has come) and
  takes its first quorum. Groups that start together meet at step 0 (and the model's weights are then made equal,
  as DDP's broadcast does); a group that comes later — a replacement for a lost one — is behind the others' step, so
  torchft copies a healthy peer's state to it: its :func:`~.checkpoint.own_snapshot` (model, optimizer, schedulers,
  loader positions, step, epoch, RNG), applied as it is prepared, as a checkpoint is. The copy travels over
  :mod:`.ft_transport`, sealed with the run's secret and loaded with ``weights_only=True``.
* **Each step** the groups agree on a quorum where a step starts — before a prepared DataLoader hands out its next
  batch, or at ``optimizer.zero_grad()`` without one — so the state a peer copies is a step's boundary, and its
  loader positions are exact. Gradients are averaged over the quorum's groups (:func:`~.ft.fault_tolerant_ddp`);
  ``optimizer.step()`` steps only when every group in the quorum finished the step (torchft's ``should_commit``),
  so a group lost in the middle of a step costs the others that step's update, never a wrong one.
* **What each step saw** is logged as the series ``ft_groups`` (how many groups' gradients counted), so ``history``
  and the dashboard show the steps taken with fewer groups.
* **The global batch** shrinks while a group is out, or, under ``--ft keep-batch``, is kept: each group of the
  step's quorum accumulates ⌈groups / groups in the quorum⌉ micro-batches (``nbtrain.backward`` scales each), the
  same number in every group, so their loaders stay at one position; ``ft_batches`` logs how many a step averaged
  (the global batch exactly when the quorum's size divides the groups', a little more otherwise).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...wire import protocol as P
from ...wire.restart_policy import ft_attempt
from . import metrics
from .checkpoint import own_snapshot, resume_from_peer
from .ft_buckets import sum_across_groups
from .state import SaveGroup, TrainContext, current

GROUPS_SERIES = "ft_groups"
BATCHES_SERIES = "ft_batches"  # --ft keep-batch: the micro-batches a committed step averaged (groups × window)
JOIN_WAIT_S = 60.0  # how long a group waits at its first prepare() for the others that start with it
# a new group with no peer to copy from waits this long to be stopped by the kernel (seconds, normally), then fails
# the cell with a clear error rather than hang it if that stop never comes
ALONE_WAIT_S = 120.0


class FtCell:
    """This rank's replica group during one cell (built as the cell starts, joined at its first ``prepare()``)."""

    def __init__(self, job: P.FaultTolerance, slot: int, job_id: int, send) -> None:
        self.job, self.slot, self.job_id, self.send = job, slot, job_id, send
        self.host = job.host or _own_address()
        self.go = threading.Event()  # the kernel's FtGo: every group that starts together reached its join
        self.group: Any = None  # .ft.ReplicaGroup, from start()
        self._store: Any = None  # the group's own c10d store, kept alive with it
        self.quorum_open = False  # a quorum was formed for the step in progress
        self.joined = False  # the first prepare() took the first quorum
        self.sharded: list[Any] = []  # --shard hybrid: the FSDP2 models whose gradient shards commit() averages
        self.averaged = False  # this step's gradient shards were averaged across the groups (by clipping, or commit)
        self.context: TrainContext | None = None  # the cell's, from start()
        self.out: frozenset[int] = frozenset()  # the groups out of the run, as the kernel last said (FtOut)

    def start(self, context: TrainContext) -> None:
        """Build the Manager as the cell starts: its heartbeats tell the Lighthouse that this group is coming, so
        the first quorum waits for it (up to the Lighthouse's join timeout) instead of forming without it."""
        from .ft import ReplicaConfig, ReplicaGroup

        self.context = context
        size = self.job.group_size
        config = ReplicaConfig(lighthouse=self.job.lighthouse, replica_id=str(self.slot // size), host=self.host,
                               secret=self.job.secret, store_port=self._group_store_port(), sync_quorum=True,
                               init_sync=False, timeout_s=60.0, group_rank=self.slot % size, group_world_size=size)
        self.group = ReplicaGroup(config, lambda: own_snapshot(context),
                                  lambda state: resume_from_peer(context, state, "a peer replica group"))
        context.save_with(self.save_group)
        if _replacing():  # a group in place of a lost one copies a peer's state, newer than any checkpoint
            context.mark_resume_checked()

    def save_group(self) -> SaveGroup:
        """``--checkpoint`` under ``--ft``: every group holds the same state, so one writes it — the first of the last
        quorum (before the first quorum, the first group); the others' ``save_checkpoint()`` returns at once."""
        import torch.distributed as dist

        manager = self.group.manager if self.group is not None else None
        if self.joined and manager is not None:
            writes = bool(manager.is_participating()) and manager.participating_rank() == 0
        else:
            writes = self.slot // self.job.group_size == 0
        return SaveGroup(dist.get_rank(), dist.get_world_size(), writes)

    def _group_store_port(self) -> int:
        """The group's own c10d store (its Manager's address book): the group's first rank hosts it and tells the
        others its port over the group's process group (a tensor, nothing pickled)."""
        import torch
        import torch.distributed as dist

        from .ft import group_store

        first = self.slot % self.job.group_size == 0
        if first:
            self._store = group_store(self.host)
        if self.job.group_size == 1:
            return self._store.port
        port = torch.tensor([self._store.port if first else 0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.broadcast(port, src=0)  # the default group is this replica group
        return int(port.item())

    def join(self) -> None:
        """The cell's first ``prepare()``: the first quorum (copying a peer's state, if this group is behind). The
        groups that start together take it together: the kernel says go once each has come here, so none forms a
        quorum of its own while the others are still on their way (a rank that replaces a lost one goes at once)."""
        if not self.joined:
            self.send(P.FtJoining(self.job_id, self.slot))
            self.go.wait(JOIN_WAIT_S)  # past it (a group that never comes): the Lighthouse's join timeout decides
            self.joined = True
            self.boundary()
            if self._alone_in_place_of_a_lost_group():
                print(f"nbtrain: --ft: rank {self.slot}'s new replica group found no other group to copy the state "
                      "from (they finished the cell); it waits to be stopped.", file=sys.stderr, flush=True)
                time.sleep(ALONE_WAIT_S)  # the kernel stops it within seconds (ft_run's too_late); alone it would start over
                raise RuntimeError(f"--ft: rank {self.slot}'s new replica group found no other group to copy the state "
                                   f"from, and nbtrain did not stop it within {ALONE_WAIT_S:.0f} s; it ends here rather "
                                   "than train alone from step 0.")

    def brings_back(self) -> bool:
        """At the cell's end: whether this rank's names go back to the notebook — the first rank of the first group
        the kernel has not said is out (rank 0, unless its group was lost and has not rejoined)."""
        first = min((group for group in range(self.job.groups) if group not in self.out), default=0)
        return self.slot == first * self.job.group_size

    def heard_out(self, groups: tuple[int, ...]) -> None:
        self.out = frozenset(groups)

    def _alone_in_place_of_a_lost_group(self) -> bool:
        """Whether this group replaces a lost one yet formed its first quorum alone, at step 0: nothing to copy."""
        manager = self.group.manager
        return _replacing() and manager.num_participants() <= 1 and manager.current_step() == 0

    def boundary(self) -> None:
        """A step starts: the groups agree on who takes part (once per step). Under ``--ft keep-batch`` the step
        then accumulates as many micro-batches as keep the global batch: ⌈groups / groups in the quorum⌉ times
        ``--grad-accum``'s K (under ``--grad-accum`` alone the groups agree once per window of K)."""
        if self.joined and not self.quorum_open:
            manager = self.group.manager
            manager.start_quorum()
            self.quorum_open = True
            context = self.context
            if context is not None and context.settings.ft_keep_batch:  # times --grad-accum's K
                more = -(-self.job.groups // max(manager.num_participants(), 1))
                context.accum.resize(context.settings.grad_accum * more)

    def wrap_model(self, model: Any, ddp_class: type, **ddp_kwargs: Any) -> Any:
        """The model in fault-tolerant DDP; at step 0 every group takes the weights of the quorum's first."""
        if self.group.manager.current_step() == 0:
            _equal_weights(self.group.manager, model)
        # DDP reorders its buckets after a first iteration unless it looks for unused parameters; a group that joins
        # late would then all-reduce buckets laid out differently from the others' (torchft's DDP sets it for this)
        ddp_kwargs["find_unused_parameters"] = True
        return self.group.wrap_model(model, ddp_class, **ddp_kwargs)

    def replicate_shards(self, model: Any) -> None:
        """``--shard hybrid --ft``: an FSDP2 model sharded over this group's ranks, replicated across the groups —
        each rank with its peers of the same group rank, which hold the same slices. At step 0 every group takes the
        first group's shards; at each step :meth:`commit` averages the gradient shards across the groups."""
        if self.group.manager.current_step() == 0:
            _equal_weights(self.group.manager, model)
        self.sharded.append(model)

    def average_shards(self) -> None:
        """``--shard hybrid --ft``: this step's gradient slices averaged across the groups, once — before
        ``nbtrain.clip_grad_norm_`` when the cell clips (so it clips the averaged gradient), else at the commit."""
        if self.sharded and not self.averaged:
            _average_shards(self.group.manager, self.sharded)
            self.averaged = True

    def _window(self) -> int | None:
        """Under ``--ft keep-batch``: the micro-batches this step accumulates (None without it)."""
        context = self.context
        if context is None or not context.settings.ft_keep_batch:
            return None
        if not context.accum.backward_used:
            raise RuntimeError("--ft keep-batch accumulates micro-batches while a group is out, so it needs "
                               "nbtrain.backward(loss) in place of loss.backward(): nbtrain then scales each one.")
        return context.accum.k

    def commit(self) -> bool:
        """After backward: whether this step's optimizer step is taken (every group of the quorum finished it)."""
        window = self._window()
        manager = self.group.manager
        step, groups = manager.current_step(), manager.num_participants()
        self.quorum_open = False
        self.average_shards()
        self.averaged = False
        committed = manager.should_commit()
        if committed:
            self.group.participation.committed(step, groups, manager.is_participating())
            logged = {GROUPS_SERIES: float(groups)}
            if window is not None:
                logged[BATCHES_SERIES] = float(groups * window)
            metrics.log_own(step, logged)
        return committed

    def close(self, ended_well: bool) -> None:
        if self.group is not None:
            self.group.shutdown()
        self.group = self._store = None
        if ended_well and not self.joined and self.slot == 0:  # said once, by the first group
            print("nbtrain: --ft did nothing in this cell: it prepared no model, optimizer or loader with "
                  "nbtrain.prepare(), which is where the replica groups meet; each rank trained alone.",
                  file=sys.stderr, flush=True)


def _equal_weights(manager: Any, model: Any) -> None:
    """Step 0: the weights of the quorum's first group in every group, as DDP broadcasts rank 0's: within a group
    of several ranks from its first, then across the groups (a sum to which only the first group adds). A sharded
    parameter (a DTensor) is this rank's slice alone: it is made equal to its peers' across the groups only."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    first = manager.participating_rank() == 0
    several = dist.is_initialized() and dist.get_world_size() > 1
    local = []
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if not tensor.is_floating_point():
                continue
            if isinstance(tensor, DTensor):
                tensor = tensor.to_local()
            elif several:
                dist.broadcast(tensor, src=0)
            if not first:
                tensor.zero_()
            local.append(tensor)
    sum_across_groups(manager, local)


def _average_shards(manager: Any, models: list) -> None:
    """The gradient shards of sharded ``models`` (FSDP2 averaged them over this group's ranks in backward) averaged
    over the quorum's groups, each rank with its peers; a step in which a peer is lost is not committed."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
             for model in models for p in model.parameters() if p.grad is not None]
    sum_across_groups(manager, grads, scale=1.0 / max(manager.num_participants(), 1))


def _own_address() -> str:
    """On a node: the address this machine reaches the kernel's store from (its interface on that network), where
    the group's servers listen — never every interface."""
    import socket

    family = socket.AF_INET6 if ":" in os.environ["MASTER_ADDR"] else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:  # a UDP connect sends nothing: it picks the route
        probe.connect((os.environ["MASTER_ADDR"].strip("[]"), int(os.environ["MASTER_PORT"])))
        return probe.getsockname()[0]


_cell: FtCell | None = None
_ran_a_cell = False  # this process has run a cell: a rank started in place of a lost one is new for that cell only


def _replacing() -> bool:
    """Whether this rank was started in place of a lost group's rank, in the cell it runs now (its process stays in
    a warm pool, where later cells find it one of the group's ranks like any other)."""
    return ft_attempt() != 0 and not _ran_a_cell


@contextlib.contextmanager
def scope(job: P.Job, slot: int, send) -> Iterator[None]:
    """A cell's job (a ``--ft`` one: its replica group, which leaves the quorum when the cell ends)."""
    global _cell, _ran_a_cell
    cell = FtCell(job.ft, slot, job.job_id, send) if job.ft is not None else None
    if cell is not None:
        cell.start(current())
    _cell = cell
    try:
        yield
    finally:
        _cell, _ran_a_cell = None, True
        if cell is not None:
            cell.close(ended_well=sys.exc_info()[0] is None)


def active() -> FtCell | None:
    return _cell


def groups_out(message: P.FtOut) -> None:
    """The kernel's :class:`~nbtrain.wire.protocol.FtOut` (on the channel's thread)."""
    cell = _cell
    if cell is not None and message.job_id == cell.job_id:
        cell.heard_out(message.groups)


def go(message: P.FtGo) -> None:
    """The kernel's :class:`~nbtrain.wire.protocol.FtGo` (on the channel's thread)."""
    cell = _cell
    if cell is not None and message.job_id == cell.job_id:
        cell.go.set()
