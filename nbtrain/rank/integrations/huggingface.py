"""Hugging Face ``Trainer`` in a cell: its logs, steps, learning rate and max_steps go to nbtrain's series.

The least intrusive public way in: ``transformers.trainer.DEFAULT_CALLBACKS`` is the list every ``Trainer``
starts its callbacks from (``Trainer.__init__`` reads it for each new trainer), and a ``TrainerCallback`` is
the library's documented extension point. The cell's code stays as it is (no ``callbacks=`` argument to add),
a cell that passes its own callbacks keeps them, and the entry is removed when the cell ends.
"""

from __future__ import annotations

import types
from collections.abc import Callable

from ..train import metrics

MODULE = "transformers.trainer"


def install(trainer_module: types.ModuleType) -> Callable[[], None]:
    """Add nbtrain's callback to the trainer module's default callbacks; return how to take it out again."""
    callback = _callback_class()
    defaults = trainer_module.DEFAULT_CALLBACKS
    defaults.append(callback)
    return lambda: defaults.remove(callback) if callback in defaults else None


def _callback_class() -> type:
    from transformers import TrainerCallback

    class NbtrainCallback(TrainerCallback):
        """Every scalar the Trainer logs, at the Trainer's global step; max_steps as the run's length."""

        def on_train_begin(self, args, state, control, **kwargs):
            metrics.send_setup({"integration": "Hugging Face Trainer"})  # named in the summary
            metrics.log_own(0, {"total_steps": state.max_steps})  # the dashboard's progress and ETA

        def on_log(self, args, state, control, logs=None, **kwargs):
            values = {name: value for name, value in (logs or {}).items()
                      if isinstance(value, (int, float)) and not isinstance(value, bool)}
            if values:
                metrics.log_own(state.global_step, values)  # the Trainer's step is the chart's x

    return NbtrainCallback
