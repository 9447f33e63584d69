"""One replica group's part in torchft's per-step fault tolerance: its Manager, its model and optimizer wrapped.

Under torchft each replica group trains a full copy of the model and the groups average their gradients with a
fault-tolerant all-reduce: a Lighthouse forms a quorum of the groups that are alive at each step, a group that
dies drops out of the next quorum while the others keep stepping, and a group that (re)joins copies the state of
a healthy peer before its first step (live recovery, no checkpoint read). This module sets that up inside a
rank, from a :class:`ReplicaConfig`:

* the group's ``Manager``, with :class:`~.ft_transport.SignedTransport` as its recovery transport (torchft's own
  unpickle what a peer sends) and its manager server bound to the address the group advertises — torchft binds
  every interface (``[::]``), and that server answers anyone;
* the model in torchft's ``DistributedDataParallel`` and the optimizer in its ``OptimizerWrapper``, so a step is
  committed only when every group in the quorum finished it;
* :class:`Participation`, what the group saw at each committed step (which step, how many groups), for the
  run's history.

torchft is imported here only, inside functions, and only by a run that asks for it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .ft_transport import SignedTransport


@dataclass(frozen=True)
class ReplicaConfig:
    """Where one replica group's rank finds the others: all from the run's job, none from the environment."""

    lighthouse: str  # http://HOST:PORT of the run's Lighthouse
    replica_id: str  # the group's name, kept by a replacement: node name or rank slot
    host: str  # the address this group's servers bind and advertise
    secret: bytes  # the run's recovery secret (see ft_transport)
    store_port: int  # the group's own c10d store on ``host``
    group_rank: int = 0
    group_world_size: int = 1
    min_replicas: int = 1
    timeout_s: float = 30.0
    sync_quorum: bool = False  # each quorum (and a heal) done before start_quorum() returns: the group takes part at once
    init_sync: bool = True  # torchft copies step 0's weights from one group (False: the caller makes them equal)


@dataclass
class Participation:
    """What this group saw at each step it committed: ``{step: (groups whose gradients counted, counted its own)}``.

    A group that heals in a step copies a peer's state and applies the others' averaged gradients: it commits the
    step without taking part in it.
    """

    steps: dict[int, tuple[int, bool]] = field(default_factory=dict)
    healed_at: int | None = None  # the step whose state it copied from a peer, if it did

    def committed(self, step: int, groups: int, took_part: bool) -> None:
        self.steps[step] = (groups, took_part)


def group_store(host: str) -> Any:
    """A replica group's own c10d store (its Manager's address book), listening on ``host`` only — a
    ``TCPStore`` that binds its own socket listens on every interface."""
    import socket

    import torch.distributed as dist

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.bind((host, 0))
    listening.listen(64)
    return dist.TCPStore(host, listening.getsockname()[1], is_master=True, wait_for_workers=False,
                         master_listen_fd=listening.detach())  # the store takes the descriptor over


def _bound_server(host: str) -> Callable[..., Any]:
    """torchft's ManagerServer, bound to ``host`` instead of every interface."""
    from torchft._torchft import ManagerServer

    def server(**kwargs: Any) -> Any:
        port = kwargs["bind"].rsplit(":", 1)[1]
        kwargs["bind"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return ManagerServer(**kwargs)
    return server


@contextlib.contextmanager
def _manager_server_on(host: str) -> Iterator[None]:
    # Manager.__init__ builds its server with bind=f"[::]:{port}" and offers no argument for it; the name it
    # calls is swapped only while one Manager is built, in this process
    import torchft.manager as tm

    original = tm.ManagerServer
    tm.ManagerServer = _bound_server(host)
    try:
        yield
    finally:
        tm.ManagerServer = original


def _quiet_deprecated_noop() -> None:
    """torchft calls each backend's ``_set_sequence_number_for_group()`` at every quorum change, which this torch
    made a no-op that warns ("deprecated and is now a no-op") on every rank, into the cell: it stays a no-op, quietly."""
    from torch._C import _distributed_c10d as c10d

    for name in ("ProcessGroupGloo", "ProcessGroupNCCL"):
        backend = getattr(c10d, name, None)
        if backend is not None and hasattr(backend, "_set_sequence_number_for_group"):
            backend._set_sequence_number_for_group = lambda self: None


def fault_tolerant_ddp(manager: Any, model: Any, ddp_class: type | None = None, **ddp_kwargs: Any) -> Any:
    """DDP over torchft's fault-tolerant all-reduce (as torchft's own ``DistributedDataParallel``, whose comm hook
    fails on the buckets after the first that meets a lost peer — nbtrain's lets the step end uncommitted).
    ``ddp_class``: a subclass of torch's DDP to build (nbtrain's prepared one), with ``ddp_kwargs``."""
    from torch.nn.parallel import DistributedDataParallel
    from torchft.process_group import ProcessGroupDummy

    ddp_kwargs.setdefault("find_unused_parameters", True)
    if ddp_kwargs["find_unused_parameters"]:
        _spend_unused_parameters_warning()
    wrapped = (ddp_class or DistributedDataParallel)(model, process_group=ProcessGroupDummy(0, 1), **ddp_kwargs)
    wrapped.register_comm_hook(manager, _fault_tolerant_hook)
    return wrapped


@functools.cache
def _spend_unused_parameters_warning() -> None:
    """DDP warns, once per process and from C++ (outside Python's ``warnings``, so no filter reaches it), that
    ``find_unused_parameters=True`` found no unused parameter and that the user should turn it off. nbtrain sets it
    on purpose under ``--ft`` (see :meth:`~.ft_cell.FtCell.wrap_model`), so the advice is wrong there, and it came
    once per rank into the cell. A throwaway one-weight DDP spends that one warning with the process's stderr on
    /dev/null (about a millisecond; DDP's first construction, which loads what it needs, happens here instead
    of a moment later); the user's own DDP then warns no more. In that moment the rank is wrapping the cell's
    model, and writes nothing else to stderr. A failure here costs the cell nothing: the warning is only shown."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torchft.process_group import ProcessGroupDummy

    with _stderr_discarded(), contextlib.suppress(Exception):
        throwaway = DistributedDataParallel(torch.nn.Linear(1, 1), process_group=ProcessGroupDummy(0, 1),
                                            find_unused_parameters=True)
        throwaway(torch.ones(1, 1)).sum().backward()


@contextlib.contextmanager
def _stderr_discarded() -> Iterator[None]:
    """File descriptor 2 on /dev/null (C++ writes there, not to ``sys.stderr``), put back after."""
    import os
    import sys

    sys.stderr.flush()  # what Python holds for fd 2 goes out before it is redirected
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _fault_tolerant_hook(manager, bucket):  # unannotated: DDP checks the annotations it finds against its own types
    """One bucket's gradients averaged over the quorum's groups — first over this group's own ranks, when it has
    several (its default process group), then across the groups, each rank with its peers of the same group rank.
    Once a peer group is lost in this step torchft hands back a plain future (its work is a no-op from then on): the
    bucket is returned as it is, and the step, which the groups will not commit, ends."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(bucket.buffer())  # gloo has no average: a sum, divided
        bucket.buffer().div_(dist.get_world_size())
    work = manager.allreduce(bucket.buffer())
    work.wait()
    inner = getattr(work.get_future(), "_fut", None)
    if inner is not None:
        return inner
    done: Any = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


@functools.cache
def _recording_wrapper() -> type:
    from torchft.optim import OptimizerWrapper

    class Recording(OptimizerWrapper):
        """torchft's optimizer wrapper, which also notes each committed step in the group's participation."""

        def __init__(self, manager: Any, optim: Any, participation: Participation) -> None:
            super().__init__(manager, optim)
            self.participation = participation

        def step(self, closure: object | None = None) -> None:
            assert closure is None, "optimizers that use closures are not supported under --ft"
            step, groups, took_part = (self.manager.current_step(), self.manager.num_participants(),
                                       self.manager.is_participating())
            if self.manager.should_commit():
                self.optim.step()
                self.participation.committed(step, groups, took_part)
    return Recording


class ReplicaGroup:
    """This rank's Manager and what it wraps. ``state`` / ``load`` are the group's state for live recovery."""

    def __init__(self, config: ReplicaConfig, state: Callable[[], Any], load: Callable[[Any], None]) -> None:
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        timeout = timedelta(seconds=config.timeout_s)
        _quiet_deprecated_noop()
        # torchft logs each peer it loses with a traceback; nbtrain's kernel says what happened, once, in the cell's
        # words (an error that ends the step still reaches the cell as its exception)
        quiet = logging.getLogger("torchft")
        if not quiet.handlers:  # a handler of its own, or Python's last resort would print them all the same
            quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
        self.participation = Participation()
        self.transport = SignedTransport(config.secret, config.host, timeout)
        with _manager_server_on(config.host):
            self.manager = Manager(
                pg=ProcessGroupGloo(timeout=timeout), state_dict=state, load_state_dict=functools.partial(self._healed, load),
                min_replica_size=config.min_replicas, replica_id=config.replica_id,
                lighthouse_addr=config.lighthouse, hostname=config.host, store_addr=config.host,
                store_port=config.store_port, rank=config.group_rank, world_size=config.group_world_size,
                checkpoint_transport=self.transport, timeout=timeout, quorum_timeout=timeout * 2,
                connect_timeout=timeout, use_async_quorum=not config.sync_quorum, init_sync=config.init_sync)

    def _healed(self, load: Callable[[Any], None], state: Any) -> None:
        load(state)
        self.participation.healed_at = self.manager.current_step()

    def wrap_model(self, model: Any, ddp_class: type | None = None, **ddp_kwargs: Any) -> Any:
        return fault_tolerant_ddp(self.manager, model, ddp_class, **ddp_kwargs)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        return _recording_wrapper()(self.manager, optimizer, self.participation)

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
        self.transport.shutdown(wait=False)
