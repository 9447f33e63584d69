"""The GPUs a run leases on a shared server: taken in the kernel before any rank starts, waited for in turn.

A pool on this machine's GPUs holds a lease (:mod:`nbtrain.gpu.leases`) on each GPU it makes visible to its ranks,
from before its first rank starts until it stops; :class:`~.pools.PoolManager` keeps it with the pool. Only NVML
is read here (the kernel never initialises CUDA). ``--gpus auto`` gets as many free GPUs as ranks
(:func:`~nbtrain.gpu.leasechoice.choose`); GPUs named by ``--gpus 0,2`` (or every visible GPU, without ``--gpus``)
are refused at once when another user leases one, naming who. When the GPUs are not free the cell takes a place
in the machine's first-come queue (:mod:`nbtrain.gpu.leasequeue`) and says under the cell what it waits for, each
time that changes; the stop button leaves the queue at once, ``--no-wait`` fails at once with the same words and
``--gpu-timeout`` after that many seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

import psutil

from ...common.words import count, plural
from ...gpu import leasepolicy, leases
from ...gpu import nvml
from ...gpu.devices import DeviceReader, GpuStatus
from ...gpu.fabric import TOPOLOGY_FAR, topology_distance
from ...gpu.leasechoice import Choice, Ticket, choose, describe_held
from ...gpu.leasequeue import WaitTicket
from ..observers.registry import kernel_identity
from ..ranks.spec import PoolSpec
from ..request.mistakes import UserInputError
from .checkpoint_lock import NOTEBOOK_ENV

POLL_S = 0.05  # how often a waiting cell looks again (each look costs well under a millisecond)
NVML_EVERY_S = 1.0  # other processes' GPU memory changes slowly; leases are looked at every POLL_S
COMMAND_SHOWN = 60  # characters of another process's command line shown


class GpusNotFree(UserInputError):
    """The GPUs asked for are not free and the cell may not wait (longer); the message says who holds them."""


def wants_lease(spec: PoolSpec) -> bool:
    """Whether ``spec``'s ranks use GPUs of this machine (a pool of joined nodes leases nothing here; a detached
    run's agent is on this machine)."""
    local = spec.nodes is None or (bool(spec.nodes.detached) and not spec.nodes.recorded)  # attached: the agent's
    return local and bool(spec.gpu_ids or spec.gpu_count)


def _lease_info() -> leases.LeaseInfo:
    """What others see of this kernel's lease: the notebook, and the kernel's id (Jupyter's server names its
    connection file kernel-<id>.json; a kernel started otherwise is named by its connection file)."""
    kernel_id, connection_file = kernel_identity()
    if kernel_id is None and connection_file:
        kernel_id = os.path.basename(connection_file).removesuffix(".json")
    return leases.LeaseInfo(notebook=os.environ.get(NOTEBOOK_ENV), kernel_id=kernel_id)


def lease_now(gpu_ids: tuple[int, ...]) -> leases.Lease:
    """Lease ``gpu_ids`` again at once, out of turn: a pool made anew on GPUs its predecessor just gave back."""
    try:
        return leases.take(list(gpu_ids), _lease_info())
    except leases.LeaseBusy as busy:
        raise GpusNotFree(f"nbtrain: {', '.join(describe_held(busy.holders))}: taken while this kernel's ranks "
                          "were started again. Run the cell again to wait for free GPUs.") from None


def lease_gpus(spec: PoolSpec, wait_s: float | None, say: Callable[[str], None]) -> tuple[PoolSpec, leases.Lease]:
    """Lease the GPUs ``spec`` asks for, waiting in turn up to ``wait_s`` seconds (None: no limit); the spec
    naming them and the lease. Raises :class:`GpusNotFree`, or KeyboardInterrupt from the stop button."""
    try:
        directory = leases.lease_dir()
    except leases.LeaseDirError as exc:
        raise GpusNotFree(f"nbtrain: {exc}. The cell did not run: its GPUs could not be leased.") from None
    info = _lease_info()
    policy = _check_policy(spec, directory)
    if not spec.gpu_count:
        _refuse_other_users(spec.gpu_ids, directory)
        _refuse_reserved(spec.gpu_ids, policy)
    deadline = None if wait_s is None else time.monotonic() + wait_s
    reader = _Readings() if spec.gpu_count else None
    said = ""
    try:
        with WaitTicket(directory) as ticket:
            while True:
                ahead = ticket.ahead()
                choice = _choose(spec, directory, reader, policy)
                if choice.gpus and not ahead:
                    try:
                        return replace(spec, gpu_ids=choice.gpus), leases.take(list(choice.gpus), info, directory)
                    except leases.LeaseBusy:  # another taker at the same moment (both back off): look again
                        time.sleep(POLL_S)
                        continue
                account = choice.account or "waiting for GPUs"
                account += _queue_words(ahead) if ahead else ""
                if wait_s == 0:
                    raise GpusNotFree(f"nbtrain: {account}. --no-wait: the cell did not wait.")
                if deadline is not None and time.monotonic() > deadline:
                    raise GpusNotFree(f"nbtrain: {account}. Waited {wait_s:g} s (--gpu-timeout); the cell did not run.")
                if account != said:
                    say(f"nbtrain: {account} (the stop button leaves the queue)\n")
                    said = account
                time.sleep(POLL_S)
    finally:
        if reader is not None:
            reader.close()


def _queue_words(ahead: list[Ticket]) -> str:
    """``; 2 runs wait before this one (bob's, carol's)``: who is in front, from the tickets' owners."""
    owners = ", ".join(f"{leases.user_name(uid)}'s" for uid in dict.fromkeys(ticket.uid for ticket in ahead))
    return f"; {count('run', len(ahead))} {'waits' if len(ahead) == 1 else 'wait'} before this one ({owners})"


class _Readings:
    """NVML's GPUs and their processes, read again at most every :data:`NVML_EVERY_S` while a cell waits."""

    def __init__(self) -> None:
        self._reader = DeviceReader()
        self._gpus: list[GpuStatus] = []
        self._read_at = -NVML_EVERY_S
        self._distances: dict[tuple[int, int], int] = {}

    def gpus(self) -> list[GpuStatus]:
        if time.monotonic() - self._read_at >= NVML_EVERY_S:
            self._gpus, self._read_at = self._reader.read(), time.monotonic()
        return self._gpus

    def distance(self, first: int, second: int) -> int:
        """How close two GPUs are (NVML's topology: :func:`~nbtrain.gpu.fabric.topology_distance`), read once."""
        pair = (min(first, second), max(first, second))
        if pair not in self._distances:
            lib, handles = nvml.library(), {gpu.index: gpu.handle for gpu in nvml.all_gpus()}
            known = lib is not None and first in handles and second in handles
            self._distances[pair] = (topology_distance(lib, handles[first], handles[second]) if known
                                     else TOPOLOGY_FAR)
        return self._distances[pair]

    def close(self) -> None:
        self._reader.close()


def _choose(spec: PoolSpec, directory: str, readings: _Readings | None, policy: leasepolicy.Policy) -> Choice:
    """The GPUs to take now, or why not in plain words (GPUs the policy reserves for others are not offered)."""
    held = leases.held(directory)
    if readings is not None:
        me = leases.user_name(os.geteuid())
        allowed = [gpu for gpu in readings.gpus() if policy.may_use(gpu.index, me)]
        return choose(spec.gpu_count, allowed, held, known_pids=set(), owner_of=_owner_of,
                      distance=readings.distance)  # GPUs on one NVLink or PCIe switch before scattered ones
    in_the_way = [lease for lease in held if lease.gpu in spec.gpu_ids]
    if not in_the_way:
        return Choice(spec.gpu_ids, "")
    free = len(spec.gpu_ids) - len({lease.gpu for lease in in_the_way})
    return Choice((), f"waiting for {plural('GPU', len(spec.gpu_ids))} {', '.join(map(str, spec.gpu_ids))} "
                      f"({free} free): " + ", ".join(describe_held(in_the_way)))


def _check_policy(spec: PoolSpec, directory: str) -> leasepolicy.Policy:
    """The administrator's policy (:mod:`nbtrain.gpu.leasepolicy`): its most GPUs per user, counting this user's
    other leases, checked; the policy, for the GPUs it reserves."""
    try:
        policy = leasepolicy.load()
        mine = {lease.gpu for lease in leases.held(directory) if lease.uid == os.geteuid()}
        policy.check(spec.gpu_count or len(spec.gpu_ids), len(mine))
    except leasepolicy.PolicyError as exc:
        raise GpusNotFree(f"nbtrain: {exc}") from None
    return policy


def session_release_s() -> float | None:
    """The administrator's limit on an idle session holding GPUs (None: none, or a policy that cannot be read)."""
    try:
        limit = leasepolicy.load().session_release_s
    except leasepolicy.PolicyError:
        return None
    return None if limit is None else float(limit)


def _refuse_reserved(gpu_ids: tuple[int, ...], policy: leasepolicy.Policy) -> None:
    """GPUs the policy reserves for other users are refused by number, saying for whom."""
    me = leases.user_name(os.geteuid())
    reserved = [gpu for gpu in gpu_ids if not policy.may_use(gpu, me)]
    if reserved:
        raise GpusNotFree(f"nbtrain: GPU {', '.join(map(str, reserved))} {'is' if len(reserved) == 1 else 'are'} "
                          f"reserved for {', '.join(policy.reserved_for) or 'nobody'} by the administrator's policy "
                          f"({policy.path}); give --gpus others, or --gpus auto.")


def _refuse_other_users(gpu_ids: tuple[int, ...], directory: str) -> None:
    """GPUs pinned by number are not waited for when another user leases them: that user decides when."""
    theirs = [lease for lease in leases.held(directory) if lease.gpu in gpu_ids and lease.uid != os.geteuid()]
    if theirs:
        raise GpusNotFree(f"nbtrain: {', '.join(describe_held(theirs))}. --gpus {','.join(map(str, gpu_ids))}: another "
                          f"user leases one of these GPUs; ask them, or use --gpus auto to wait for free ones.")


def _owner_of(pid: int) -> tuple[str, str]:
    """(user, command line) of a process NVML lists, as far as this user may see them."""
    try:
        process = psutil.Process(pid)
        user, command = process.username(), " ".join(process.cmdline())
    except (psutil.Error, KeyError):
        return "another user", "a process nbtrain cannot see"
    return user, (command[:COMMAND_SHOWN] + "…" if len(command) > COMMAND_SHOWN else command) or "a process"
