"""Lightning's ``Trainer`` in a cell: what the module ``self.log``s, at the Trainer's global step, goes to nbtrain.

The public way in is Lightning's own: a package may declare a callback factory under the entry point group
``lightning.pytorch.callbacks_factory`` (``pytorch_lightning.callbacks_factory`` for the older package name),
and every ``Trainer`` adds what the factory returns to its callbacks. nbtrain declares :func:`callbacks` there
(pyproject.toml). The factory returns nothing outside a cell or under ``--no-integrations``, so a Trainer in a
plain script is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..train import metrics

_enabled = False  # True only while a cell with integrations runs (set by this module's scope())
_made: list = []  # the cell's one callback: a factory found twice (two paths to one install) gives it again


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """A cell that follows its libraries: the factory gives Trainers built in it nbtrain's callback."""
    global _enabled
    _enabled = True
    try:
        yield
    finally:
        _enabled = False
        _made.clear()


def callbacks() -> list:
    """The entry point's factory: nbtrain's callback inside a cell that follows its libraries, else none."""
    if not _enabled:
        return []
    if not _made:
        _made.append(_callback_class()())
    return [_made[0]]


def _callback_class() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]  # the older package name

    class NbtrainLightningCallback(Callback):
        """Each batch's logged scalars at ``trainer.global_step``; the stepping batches as the run's length."""

        logged_step = -1  # the last step sent: the callback listed twice (the entry point found twice) logs once

        def on_train_start(self, trainer, pl_module):
            self.logged_step = -1  # a new fit in the same cell
            metrics.send_setup({"integration": "Lightning Trainer"})  # named in the summary
            total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.estimated_stepping_batches
            metrics.log_own(0, {"total_steps": int(total)})

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            values = {name: value for name, value in trainer.callback_metrics.items()
                      if getattr(value, "numel", lambda: 1)() == 1 and not name.endswith("_epoch")}
            if values and trainer.global_step > self.logged_step:
                self.logged_step = trainer.global_step
                metrics.log_own(trainer.global_step, values)

        def on_validation_end(self, trainer, pl_module):
            values = {name: value for name, value in trainer.callback_metrics.items()
                      if name.startswith("val") and getattr(value, "numel", lambda: 1)() == 1}
            if values:
                metrics.log_own(trainer.global_step, values)

    return NbtrainLightningCallback
