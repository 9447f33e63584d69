"""Machine-wide GPU leases: who holds which GPU of a shared server, in lock files every user can read.

A lease is one file per GPU in a shared directory (``/dev/shm/nbtrain-leases``, or ``NBTRAIN_LEASE_DIR``),
named ``gpu-<index>-<uid>-<random>.lease``, made by its holder with ``O_EXCL`` and ``flock``-ed by it for as long
as it holds the GPU: a holder killed with SIGKILL drops its lock with its last descriptor, so its lease frees
itself (the file stays until its owner's next take sweeps it). The directory is sticky and world-writable, as
``/tmp``: anyone may take a lease, only a file's owner (or root, or the directory's owner) may remove it, which
is why a directory owned by another user is refused.

Whether a file is held is read from ``/proc/locks`` (which process holds an exclusive ``flock`` on which inode),
never by taking a lock on someone else's file; a lock counts only when its process belongs to the file's owner,
so another user who opens a stale file and locks it forges nothing. Who holds a lease is the file's owner from
``stat``; what the file says (notebook, kernel, since, state) is read field by field and only ever displayed.
Anything else in the directory (another name, a symlink, a FIFO, garbage) is passed over and reported once.
"""

from __future__ import annotations

import enum
import fcntl
import json
import os
import pwd
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from nbtrain.gpu import jsonfields, nvml

DEFAULT_DIR = "/dev/shm/nbtrain-leases"
DIR_MODE = 0o1777  # sticky and world-writable, as /tmp
FILE_MODE = 0o644  # every user reads who holds what
MAX_RECORD = 4096  # bytes of a lease's JSON read; a larger file is not a lease
MAX_GPU_INDEX = 9999  # the most digits a lease's name may give its GPU
NAME = re.compile(r"^gpu-([0-9]{1,4})-([0-9]{1,10})-([0-9a-f]{16})\.lease$")
TICKET_NAME = re.compile(r"^wait-([0-9]{1,10})-([0-9a-f]{16})\.ticket$")  # a place in the queue (nbtrain.gpu.leasequeue)


class LeaseState(enum.Enum):
    BUSY = "busy"  # a cell is running on the GPU
    IDLE_WARM = "idle-warm"  # the ranks are kept warm between cells


class LeaseDirError(RuntimeError):
    """The lease directory cannot be trusted; the message names it and how to fix it."""


class LeaseBusy(RuntimeError):
    """A GPU asked for is already leased; ``holders`` are the leases in the way."""

    def __init__(self, message: str, holders: list[HeldLease]) -> None:
        super().__init__(message)
        self.holders = holders


@dataclass(frozen=True)
class LeaseInfo:
    """What a holder says about its lease: shown to other users, never acted on."""

    notebook: str | None = None
    kernel_id: str | None = None
    state: LeaseState = LeaseState.BUSY


@dataclass(frozen=True)
class HeldLease:
    gpu: int
    uid: int  # the file's owner, from stat
    user: str  # that uid's login name (or the uid as text)
    pid: int  # the process holding the lock, from /proc/locks
    since: float | None  # seconds since the epoch, as the file says
    notebook: str | None
    kernel_id: str | None
    state: LeaseState | None
    path: str


def lease_dir(environ=os.environ) -> str:
    """The lease directory, made (mode 1777) if missing; refused when someone else could tamper with it."""
    path = environ.get("NBTRAIN_LEASE_DIR") or DEFAULT_DIR
    try:
        os.mkdir(path, DIR_MODE)
        os.chmod(path, DIR_MODE)  # the umask took bits away from mkdir's mode
    except FileExistsError:
        pass
    check_dir(path)
    return path


def check_dir(path: str) -> None:
    """Raise :class:`LeaseDirError` unless ``path`` is a real directory of root's or ours, of mode 1777."""
    info = os.lstat(path)
    fix = (f"remove it and let nbtrain make it again, or have root make it for every user: "
           f"sudo install -d -m 1777 -o root {path} (or point NBTRAIN_LEASE_DIR at another directory)")
    if not stat.S_ISDIR(info.st_mode):
        raise LeaseDirError(f"the GPU lease directory {path} is not a directory (a link or a file); {fix}")
    if info.st_uid not in (0, os.geteuid()):
        raise LeaseDirError(f"the GPU lease directory {path} belongs to {user_name(info.st_uid)}, who could remove "
                            f"other users' leases; {fix}")
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        raise LeaseDirError(f"the GPU lease directory {path} has mode {stat.S_IMODE(info.st_mode):o}, "
                            f"not 1777 (sticky, as /tmp); {fix}")


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class Lease:
    """GPUs this process holds until :meth:`release` (or its exit); a context manager."""

    def __init__(self, directory: str, gpus: list[int], files: list[tuple[str, int]], record: dict) -> None:
        self.directory = directory
        self.gpus = gpus
        self._files = files  # (path, locked descriptor) per GPU
        self._record = record

    def set_state(self, state: LeaseState) -> None:
        """Say whether a cell runs on the GPUs or the ranks only wait warm (what ``%gpus`` shows others)."""
        if self._record.get("state") == state.value:
            return
        self._record = {**self._record, "state": state.value}
        data = json.dumps(self._record).encode()
        for _, fd in self._files:
            os.ftruncate(fd, 0)  # a reader in between sees no details for a moment, never a mix of two records
            os.pwrite(fd, data, 0)

    def release(self) -> None:
        for path, fd in self._files:
            unlink_quietly(path)  # unlinked before unlocking: nobody sees a free file of ours that is still held
            os.close(fd)
        self._files = []

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take(gpu_ids: list[int], info: LeaseInfo = LeaseInfo(), directory: str | None = None) -> Lease:
    """Lease ``gpu_ids`` for this process, or raise :class:`LeaseBusy` naming who holds them."""
    return _take(gpu_ids, info, directory, lambda holder: True, "already leased")


def take_over(gpu_ids: list[int], info: LeaseInfo = LeaseInfo(), directory: str | None = None) -> Lease:
    """Lease ``gpu_ids`` for this process while this user's other process holds them: a detached run's agent takes
    over its kernel's lease, so the GPUs stay leased when that kernel goes. Another user's lease on one of them is
    :class:`LeaseBusy`, as in :func:`take`."""
    return _take(gpu_ids, info, directory, lambda holder: holder.uid != os.geteuid(), "leased by another user")


def _take(gpu_ids: list[int], info: LeaseInfo, directory: str | None, in_the_way: Callable[[HeldLease], bool],
          busy: str) -> Lease:
    check_gpu_ids(gpu_ids)
    directory = directory or lease_dir()
    sweep_own(directory)
    record = {"user": user_name(os.geteuid()), "notebook": info.notebook, "kernel_id": info.kernel_id,
              "pid": os.getpid(), "since": time.time(), "state": info.state.value}
    files = [_make_locked(directory, gpu, json.dumps(record).encode()) for gpu in gpu_ids]
    lease = Lease(directory, list(gpu_ids), files, record)
    ours = {path for path, _ in files}
    # Everyone locks first and looks second, so of two takers at once at least one sees the other.
    others = [holder for holder in held(directory)
              if holder.gpu in gpu_ids and holder.path not in ours and in_the_way(holder)]
    if others:
        lease.release()
        raise LeaseBusy(f"GPU {', '.join(str(h.gpu) for h in others)} {busy}: "
                        + "; ".join(describe(h) for h in others), others)
    return lease


def check_gpu_ids(gpu_ids: list[int]) -> None:
    """Raise ValueError, saying which, unless ``gpu_ids`` are distinct GPU indices (a lease no name could hold
    would be invisible to everyone else)."""
    wrong = [gpu for gpu in gpu_ids if type(gpu) is not int or not 0 <= gpu <= MAX_GPU_INDEX]
    if wrong or not gpu_ids or len(set(gpu_ids)) != len(gpu_ids):
        raise ValueError(f"GPUs to lease must be distinct indices from 0 to {MAX_GPU_INDEX}, as nvidia-smi numbers "
                         f"them (got {list(gpu_ids)!r}): pass e.g. [0, 1]")


def _make_locked(directory: str, gpu: int, record: bytes) -> tuple[str, int]:
    return make_locked(lambda: os.path.join(directory, f"gpu-{gpu}-{os.geteuid()}-{secrets.token_hex(8)}.lease"), record)


def make_locked(fresh_path: Callable[[], str], record: bytes) -> tuple[str, int]:
    """A new file at ``fresh_path()`` holding ``record``, ``flock``-ed by this process: (path, descriptor)."""
    while True:
        path, fd = _create_locked(fresh_path(), record)
        if _still_linked(path, fd):
            return path, fd
        os.close(fd)  # our own sweep in another kernel removed it between create and lock: make another


def _still_linked(path: str, fd: int) -> bool:
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _create_locked(path: str, record: bytes) -> tuple[str, int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh name nobody else knows: this never waits
    os.fchmod(fd, FILE_MODE)
    os.write(fd, record)
    return path, fd


def held(directory: str | None = None) -> list[HeldLease]:
    """The leases held now, by GPU; files that are not leases are passed over (each reported once)."""
    directory = directory or lease_dir()
    holders = lock_holders()
    found = []
    for name in sorted(os.listdir(directory)):
        if TICKET_NAME.match(name):
            continue  # a waiting run's place in the queue, not a lease
        lease = _read_lease(directory, name, holders)
        if lease is not None:
            found.append(lease)
    return sorted(found, key=lambda lease: (lease.gpu, lease.since or 0.0))


def _read_lease(directory: str, name: str, holders: dict[tuple[int, int, int], int]) -> HeldLease | None:
    path = os.path.join(directory, name)
    match = NAME.match(name)
    if match is None:
        _report(path, "its name is not a lease's")
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        _report(path, f"it cannot be opened ({exc.strerror})")
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            _report(path, "it is not a plain file")
            return None
        if info.st_uid != int(match.group(2)):
            _report(path, f"its name says uid {match.group(2)} but {user_name(info.st_uid)} owns it")
            return None
        pid = holders.get((os.major(info.st_dev), os.minor(info.st_dev), info.st_ino))
        if pid is None or uid_of(pid) != info.st_uid:
            return None  # not held, or locked by a process of another user: a stale lease
        record = os.read(fd, MAX_RECORD + 1)
    finally:
        os.close(fd)
    fields = _fields(record)
    return HeldLease(gpu=int(match.group(1)), uid=info.st_uid, user=user_name(info.st_uid), pid=pid,
                     since=jsonfields.number(fields.get("since")), notebook=jsonfields.text(fields.get("notebook")),
                     kernel_id=jsonfields.text(fields.get("kernel_id")), state=_state(fields.get("state")), path=path)


def _fields(record: bytes) -> dict:
    if len(record) > MAX_RECORD:
        return {}
    try:
        fields = json.loads(record.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}  # a holder still writing, or garbage: the lease shows without its details
    return fields if isinstance(fields, dict) else {}


def _state(value) -> LeaseState | None:
    return next((state for state in LeaseState if state.value == value), None)


def _report(path: str, why: str) -> None:
    """Say once that ``path`` in the lease directory is passed over, and why."""
    nvml.hint(f"passing over {path} in the GPU lease directory: {why}")


def lock_holders() -> dict[tuple[int, int, int], int]:
    """(device major, minor, inode) -> pid of each exclusive ``flock`` on this machine, from /proc/locks."""
    holders = {}
    with open("/proc/locks") as locks:
        for line in locks:
            parts = line.split()
            if len(parts) < 6 or parts[1] != "FLOCK" or parts[3] != "WRITE" or "->" in parts[0]:
                continue  # not a held flock (a waiter's line starts with "->")
            major, minor, inode = parts[5].split(":")
            holders[(int(major, 16), int(minor, 16), int(inode))] = int(parts[4])
    return holders


def uid_of(pid: int) -> int | None:
    """The owner of process ``pid``, None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def free_gpus(all_gpu_ids: list[int], directory: str | None = None) -> list[int]:
    """Of ``all_gpu_ids``, those nobody holds a lease on."""
    taken = {lease.gpu for lease in held(directory)}
    return [gpu for gpu in all_gpu_ids if gpu not in taken]


def sweep_own(directory: str) -> None:
    """Remove this user's lease and ticket files whose holder is gone (a SIGKILLed kernel's)."""
    holders = lock_holders()
    for name in os.listdir(directory):
        lease, ticket = NAME.match(name), TICKET_NAME.match(name)
        owner = int(lease.group(2)) if lease else int(ticket.group(1)) if ticket else None
        if owner != os.geteuid():
            continue
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and \
                (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino) not in holders:
            unlink_quietly(path)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def describe(lease: HeldLease) -> str:
    """``GPU 0 held by bob (notebooks/llm.ipynb, training since 12:04)``."""
    doing = "idle-warm" if lease.state is LeaseState.IDLE_WARM else "training"
    since = f" since {time.strftime('%H:%M', time.localtime(lease.since))}" if lease.since else ""
    notebook = f"{lease.notebook}, " if lease.notebook else ""
    return f"GPU {lease.gpu} held by {lease.user} ({notebook}{doing}{since})"


def view_lines(environ=os.environ) -> list[str]:
    """One line per leased GPU, for ``%gpus``: ``GPU 0 leased by bob (llm.ipynb, since 12:04, busy)``.

    Only reads: a machine where nobody took a lease yet has no directory, and shows nothing.
    """
    path = environ.get("NBTRAIN_LEASE_DIR") or DEFAULT_DIR
    if not os.path.lexists(path):
        return []
    try:
        check_dir(path)
    except LeaseDirError as exc:
        return [str(exc)]
    return [_view_line(lease) for lease in held(path)]


def _view_line(lease: HeldLease) -> str:
    details = [os.path.basename(lease.notebook) if lease.notebook else None,
               f"since {time.strftime('%H:%M', time.localtime(lease.since))}" if lease.since else None,
               lease.state.value if lease.state else None]
    shown = ", ".join(detail for detail in details if detail)
    return f"GPU {lease.gpu} leased by {lease.user}" + (f" ({shown})" if shown else "")
