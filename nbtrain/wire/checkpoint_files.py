"""Whose checkpoint it is: the ``--checkpoint`` folder and the files nbtrain reads from it must be the user's own.

A checkpoint file is unpickled when it is loaded (restricted to tensors and plain values, but still a pickle:
:mod:`nbtrain.rank.train.checkpoint`), so whoever can write it — or replace it, through a folder they can write —
chooses what the ranks load. ssh refuses a key that others can write for the same reason. The kernel checks the
folder before any process starts (:func:`~nbtrain.wire.settings.parse_train_settings`) and each rank checks the
file again when it loads it (:func:`refuse_foreign_checkpoint`), which also covers ``load_checkpoint(path)``.

Refused: an entry owned by another user (root's are accepted: only root could have made them), and one that
group or others may write. The message names the entry, its owner and mode, and the command that fixes it.
Importing this module imports nothing heavy.
"""

from __future__ import annotations

import os
import pwd
import stat


HISTORY, SHARDS = ".history-", ".shards-"  # what follows a checkpoint file's name in its history files and shard folders


class ForeignCheckpointError(ValueError):
    """A checkpoint folder or file that someone other than this user could have written; says which and how to fix it."""


def refuse_foreign_folder(folder: str, checkpoint_file: str) -> None:
    """``--checkpoint DIR``: the folder, its checkpoint file and the file's shard folders, if they exist."""
    if os.path.exists(os.path.join(folder, checkpoint_file)):
        refuse_foreign_checkpoint(os.path.join(folder, checkpoint_file))
    elif os.path.isdir(folder):
        _refuse_foreign(folder)


def refuse_foreign_checkpoint(path: str) -> None:
    """A checkpoint file, the folder that holds it, its metric history files (``PATH.history-*``) and its ``--shard``
    folders (``PATH.shards-*``) with their files."""
    folder = os.path.dirname(os.path.abspath(path))
    _refuse_foreign(folder)
    _refuse_foreign(path)
    for entry in beside(path):
        _refuse_foreign(entry)
        if os.path.basename(entry).startswith(f"{os.path.basename(path)}{SHARDS}"):
            for name in _listed(entry):
                _refuse_foreign(os.path.join(entry, name))


def beside(path: str, kinds: tuple[str, ...] = (HISTORY, SHARDS)) -> list[str]:
    """The checkpoint file ``path``'s entries of ``kinds`` beside it (``PATH.history-*``, ``PATH.shards-*``), sorted.
    One listing, where a glob compiled a pattern for each new path (a rank's first resume paid for it)."""
    folder, base = os.path.split(os.path.abspath(path))
    return [os.path.join(folder, name) for name in _listed(folder, tuple(base + kind for kind in kinds))]


def _listed(folder: str, prefixes: tuple[str, ...] = ("",)) -> list[str]:
    """The names in ``folder`` that start with one of ``prefixes``; none where it is not a folder (any more: a save
    may remove a superseded one meanwhile)."""
    try:
        return sorted(name for name in os.listdir(folder) if name.startswith(prefixes))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _refuse_foreign(path: str) -> None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    mode = stat.S_IMODE(info.st_mode)
    what = "folder" if stat.S_ISDIR(info.st_mode) else "file"
    if info.st_uid not in (os.geteuid(), 0):
        raise ForeignCheckpointError(
            f"the checkpoint {what} {path} belongs to {_user(info.st_uid)} (mode {mode:04o}), not to you "
            f"({_user(os.geteuid())}): loading a checkpoint unpickles it, so its owner chooses what your ranks load. "
            f"Use a --checkpoint folder of your own (a new one, such as ~/runs/exp1), or copy the checkpoint there "
            "if you trust it.")
    writers = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit]
    if writers:
        raise ForeignCheckpointError(
            f"the checkpoint {what} {path} can be written by {' and '.join(writers)} (mode {mode:04o}): whoever "
            f"can write it chooses what your ranks load. Run chmod go-w {path} (or use another --checkpoint folder).")


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
