"""What a new checkpoint file no longer names, beside it: older ``--shard`` folders (``PATH.shards-*``) and metric
history files (``PATH.history-*``), removed once the new file is in place.

Only this user's own entries go: in a folder others can write (``--checkpoint /tmp/run``) another user's folder, file
or link under the same names is left as it is. Deleting a large model's shard folder takes a while, so a synchronous
save leaves it to a thread of its own (:func:`remove_later`), which the next save and the cell's end wait for.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import threading

from .state import TrainContext

KINDS = (".shards-", ".history-")


def remove_later(context: TrainContext, target: str, keep: set[str]) -> None:
    """Remove, on a thread of its own, what the file at ``target`` does not name (``keep``: the names it does). The
    entries are listed now: a later save's new ones are never among them."""
    older = superseded(target, keep)
    if not older:
        return
    remover = threading.Thread(target=remove, args=(older,), name="nbtrain-old-shards", daemon=True)
    remover.start()
    context.remove_in_background(remover.join)


def superseded(target: str, keep: set[str]) -> list[str]:
    """This user's shard folders and history files of ``target`` whose names are not in ``keep``."""
    found = [path for kind in KINDS for path in glob.glob(f"{glob.escape(target)}{kind}*")]
    return [path for path in found if os.path.basename(path) not in keep and _own(path)]


def remove(paths: list[str]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass  # gone already, or not ours to remove: tidying never fails a save


def _own(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)) and info.st_uid == os.geteuid()
