"""One run per ``--checkpoint`` folder: a cell holds the folder's lock while it runs.

Two notebooks given the same folder would otherwise both resume from it and both write the same
``checkpoint.pt``, each overwriting the other's progress and each reporting success. So the kernel takes an
exclusive ``flock`` on a file inside the folder (:data:`LOCK_FILE`) before the job reaches any rank, and holds it
until the cell is over — its restarts (``--max-restarts``) and background saves included. A second cell that
asks for the folder meanwhile is refused at once, before any rank runs it, with the notebook and kernel that hold
it (they wrote their names into the file when they took it).

The lock belongs to the open file, which only this kernel has (``O_CLOEXEC``: no rank inherits it), so it is
released when the cell ends or the kernel dies, however it dies; a stale file left behind holds nothing. The one
process given the open file is a ``--detach`` run's agent (:func:`descriptor_of`): the run outlives the kernel,
and so does its hold on the folder, until the run ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator

from ..request.mistakes import UserInputError

LOCK_FILE = ".nbtrain-lock"
_HELD: dict[str, int] = {}  # folder -> this process's locked descriptor on it, while held (written here alone)
NOTEBOOK_ENV = "JPY_SESSION_NAME"  # the notebook's path, as Jupyter's server gives it to the kernel it starts


class CheckpointInUse(UserInputError):
    """Another run holds the ``--checkpoint`` folder; says which notebook and kernel."""


@contextlib.contextmanager
def hold_checkpoint_folder(folder: str | None) -> Iterator[None]:
    """Hold ``folder``'s lock for the ``with`` block (nothing without ``--checkpoint``); :class:`CheckpointInUse`
    at once if another process holds it."""
    if folder is None:
        yield
        return
    os.makedirs(folder, mode=0o755, exist_ok=True)  # never group-writable, whatever the umask: it would be refused
    descriptor = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointInUse(
                f"--checkpoint {folder} is in use by {_holder(descriptor)}: two runs in one folder would resume from "
                "each other's checkpoints and overwrite them. Wait for that run to end (or stop it), or give this "
                "cell another --checkpoint folder.") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps({"pid": os.getpid(), "notebook": os.environ.get(NOTEBOOK_ENV)}).encode(), 0)
        _HELD[folder] = descriptor
        try:
            yield
        finally:
            _HELD.pop(folder, None)
    finally:
        os.close(descriptor)  # releases the lock (unless a detached run's agent shares the open file)


def descriptor_of(folder: str | None) -> int | None:
    """This process's locked descriptor on ``folder`` while a cell holds it, for a ``--detach`` run's agent to
    inherit (it then holds the folder as long as the run runs); None when none is held."""
    return _HELD.get(folder) if folder else None


def _holder(descriptor: int) -> str:
    """Who holds the lock, as it wrote itself into the file (JSON: never unpickled)."""
    try:
        said = json.loads(os.pread(descriptor, 4096, 0) or b"{}")
        pid, notebook = int(said["pid"]), said.get("notebook")
    except (OSError, ValueError, KeyError, TypeError):
        return "another run (it has not said which yet)"
    return f"the notebook {notebook} (kernel pid {pid})" if notebook else f"another kernel (pid {pid})"
