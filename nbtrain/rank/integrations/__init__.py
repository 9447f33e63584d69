"""The ecosystem's own training loops, logging into nbtrain with no change to the cell.

While a cell runs on a rank (:func:`scope`, unless ``--no-integrations``), what Hugging Face's ``Trainer``
(:mod:`.huggingface`), Lightning's ``Trainer`` (:mod:`.lightning`) and accelerate's trackers (:mod:`.accelerate`)
log becomes nbtrain's series — the dashboard's
curves and ``history`` — at their own step, with their planned number of steps as the progress bar's end. Each is
hooked in through the library's public extension point, never by changing its code: the Trainer's default
callbacks for Hugging Face (added once the library is imported, :mod:`.imports`), the
``lightning.pytorch.callbacks_factory`` entry point for Lightning, accelerate's registry of tracker classes. Outside a
cell the callbacks do nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import accelerate, huggingface
from .imports import after_import

_state = {"active": False}
_last: dict[str, float] = {}  # each series' last value logged in this cell


def active() -> bool:
    """Whether a cell with integrations on runs on this rank now."""
    return _state["active"]


def new_values(values: dict[str, float]) -> dict[str, float]:
    """Of what a Trainer reports now, the values that changed since it last did: a Trainer reports every metric it
    holds at each log (Lightning's ``logged_metrics``; Hugging Face's ``epoch`` with each train and eval log), and
    the same measurement must not become several points of a curve."""
    changed = {name: value for name, value in values.items() if _last.get(name) != value}
    _last.update(changed)
    return changed


@contextlib.contextmanager
def scope(enabled: bool) -> Iterator[None]:
    """The cell's integrations: on for its length, unless ``--no-integrations``."""
    if not enabled:
        yield
        return
    after_import("transformers.trainer", huggingface.install)  # now if imported already, else when it is
    after_import("accelerate.tracking", accelerate.install)
    _state["active"] = True
    _last.clear()
    try:
        yield
    finally:
        _state["active"] = False
