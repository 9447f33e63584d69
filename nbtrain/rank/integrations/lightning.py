"""Lightning's ``Trainer`` logging into nbtrain, through its ``lightning.pytorch.callbacks_factory`` entry point.

Lightning asks every installed package that declares the entry point for callbacks when a ``Trainer`` is made;
:func:`callbacks` gives one while an nbtrain cell runs with integrations on (none otherwise). On global rank zero,
after each training batch whose step the Trainer logs (``log_every_n_steps``) and after each validation, the
callback logs the scalars of ``trainer.logged_metrics`` — what the module gave ``self.log`` — at the Trainer's
global step, and the planned number of steps (``estimated_stepping_batches``) for the progress bar.
"""

from __future__ import annotations

import math

from ..train import metrics

NAME = "Lightning Trainer"


def callbacks() -> list:
    """The entry point's factory: nbtrain's callback inside a cell with integrations on, else none."""
    from . import active

    return [_callback_class()()] if active() else []


_made: list = []


def _callback_class():
    if _made:
        return _made[0]
    try:
        from lightning.pytorch import Callback
    except ImportError:  # the standalone pytorch_lightning package: the same class under its older name
        from pytorch_lightning import Callback  # type: ignore[assignment]

    class NbtrainLightningCallback(Callback):
        def on_train_start(self, trainer, pl_module):
            total = trainer.estimated_stepping_batches
            if trainer.is_global_zero and isinstance(total, (int, float)) and math.isfinite(total) and total > 0:
                metrics.send_setup({"integration": NAME})  # the summary says which
                metrics.log(step=trainer.global_step, total_steps=int(total))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.is_global_zero and trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
                _log(trainer)

        def on_validation_end(self, trainer, pl_module):
            if trainer.is_global_zero and not trainer.sanity_checking:
                _log(trainer)

    _made.append(NbtrainLightningCallback)
    return NbtrainLightningCallback


def _log(trainer) -> None:
    from . import new_values

    values = new_values({name: number for name, value in trainer.logged_metrics.items()
                         if (number := _number(value)) is not None})
    if values:
        metrics.log_own(trainer.global_step, values)


def _number(value) -> float | None:
    """A logged scalar (a number, a one-element tensor) as a float; None for anything else, or NaN/inf."""
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) else None
