"""What a new checkpoint file no longer names, beside it: older ``--shard`` folders (``PATH.shards-*``) and metric
history files (``PATH.history-*``), removed once the new file is in place.

Only this user's own entries go: in a folder others can write (``--checkpoint /tmp/run``) another user's folder, file
or link under the same names is left as it is. Deleting a large model's shard folder takes a while, so a synchronous
save leaves it to a thread of its own (:func:`remove_later`), which the next save and the cell's end wait for.
"""

from __future__ import annotations

import os
import threading

from ...common.leftovers import owned_by_me, remove_entry
from ...wire.checkpoint_files import beside
from .state import TrainContext

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
    return [path for path in beside(target) if os.path.basename(path) not in keep and owned_by_me(path)]


def remove(paths: list[str]) -> None:
    for path in paths:
        remove_entry(path)  # a link unlinked, never followed; what cannot go stays: tidying never fails a save
