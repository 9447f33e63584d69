"""Writing a checkpoint's file atomically: ``path`` is always either the old file or the whole new one.

The file is written to a temporary name in the same directory, flushed and ``fsync``-ed, then ``os.replace``-d
over the old one, and the directory is ``fsync``-ed (the rename itself durable). A process killed while writing
leaves the previous file intact, and a temporary that the next save removes.

Under ``--shard`` the file names a DCP folder the ranks write at the same time: :class:`StagedFile` writes the
temporary on a thread of its own while they do, and puts it in place only once they are done — so the file's
write costs the save no time of its own, and never names a folder that is not whole.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import threading
from collections.abc import Callable

import torch

from ...common.leftovers import remove_entry, sweep_dead, sweep_quietly


def write_atomic(state: dict, path: str) -> None:
    """Write ``state`` with torch.save so that ``path`` is always either the old file or the whole new one
    (readable by others as the umask allows, writable by this user alone)."""
    _put_in_place(_write_temporary(state, path), path)


class StagedFile:
    """``state`` written to a temporary beside ``path`` on a thread of its own, from the moment it is made — or,
    given a function, what it returns, called on that thread; :meth:`put_in_place` makes it ``path``,
    :meth:`discard` drops it."""

    def __init__(self, state: dict | Callable[[], dict], path: str) -> None:
        self.path = path
        self._temporary: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, args=(state,), name="nbtrain-checkpoint-file", daemon=True)
        self._thread.start()

    def _write(self, state: dict | Callable[[], dict]) -> None:
        try:
            self._temporary = _write_temporary(state() if callable(state) else state, self.path)
        except BaseException as exc:  # raised where the file is put in place
            self._error = exc

    def put_in_place(self, first: Callable[[], object] = lambda: None) -> None:
        """Once the temporary is written: ``first()``, then the temporary renamed over ``path``. The temporary is
        removed if anything fails (and the error raised)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._temporary is not None  # written, since no error was recorded
        try:
            first()
        except BaseException:
            remove_entry(self._temporary)
            raise
        _put_in_place(self._temporary, self.path)

    def discard(self) -> None:
        self._thread.join()
        if self._temporary is not None:
            remove_entry(self._temporary)


def writable_by_owner_only(folder: str) -> None:
    """A DCP folder and its files, as the umask left them, less group and others' write: a checkpoint others can
    write is refused when it is loaded (:mod:`nbtrain.wire.checkpoint_files`), so nbtrain never writes one."""
    for path in [folder, *(os.path.join(folder, name) for name in os.listdir(folder))]:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.chmod(path, mode & ~(stat.S_IWGRP | stat.S_IWOTH))


def _write_temporary(state: dict, path: str) -> str:
    """``state`` in a new file beside ``path``, flushed and fsynced; returns its name."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    _remove_stale_temporaries(path)
    temporary = f"{os.path.join(directory, '.' + os.path.basename(path))}.tmp-{secrets.token_hex(4)}-{os.getpid()}"
    # A new file of this user's, under a name nobody can guess: in a shared folder another user may have planted a
    # file or a link at a predictable name, and renaming theirs into place would hand them the checkpoint.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(descriptor, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        remove_entry(temporary)
        raise
    return temporary


def _put_in_place(temporary: str, path: str) -> None:
    try:
        os.replace(temporary, path)
    except BaseException:
        remove_entry(temporary)
        raise
    descriptor = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(descriptor)  # make the rename itself durable
    finally:
        os.close(descriptor)


def _remove_stale_temporaries(path: str) -> None:
    """Temporary files of saves whose process died (a killed rank) are left behind; clear this user's. The folder
    may be shared (``--checkpoint /tmp/run``): an entry another user made there is theirs, whatever its name says,
    and nothing found there stops the save."""
    folder, name = os.path.split(path)
    stale = re.compile(re.escape(f".{name}.tmp-") + r"(?:[0-9a-f]+-)?(\d+)$")  # group 1: the saving process
    sweep_quietly(lambda: sweep_dead(folder or ".", stale))
