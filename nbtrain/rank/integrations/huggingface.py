"""Hugging Face's ``Trainer`` logging into nbtrain: every scalar it logs becomes a series at its global step.

:func:`install` adds one callback class to ``transformers.trainer.DEFAULT_CALLBACKS``, the list every ``Trainer``
starts its callbacks from; the callback does nothing unless an nbtrain cell runs on the rank with integrations
on. On the world's first process it logs what the Trainer logs (``loss``, ``learning_rate``, ``grad_norm``,
``epoch``, ``eval_loss``, …) with ``nbtrain.log(step=state.global_step, …)``, and ``total_steps`` (the Trainer's
``max_steps``) for the progress bar; the Trainer's own progress bar is shown by local process zero alone already.
"""

from __future__ import annotations

import math

from ..train import metrics

NAME = "Hugging Face Trainer"


def install(trainer_module) -> None:
    """Put the callback in the Trainer's default callbacks (once)."""
    callback = _callback_class()
    if callback not in trainer_module.DEFAULT_CALLBACKS:
        trainer_module.DEFAULT_CALLBACKS.append(callback)


_made: list = []


def _callback_class():
    if _made:
        return _made[0]
    from transformers import TrainerCallback

    class NbtrainCallback(TrainerCallback):
        """What the Trainer logs, as nbtrain series (see the module docstring)."""

        def on_train_begin(self, args, state, control, **kwargs):
            if _logging(state) and state.max_steps and state.max_steps > 0:
                metrics.send_setup({"integration": NAME})  # the summary says which
                metrics.log(step=state.global_step, total_steps=state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not _logging(state) or not logs:
                return
            from . import new_values

            values = new_values({name: float(value) for name, value in logs.items() if isinstance(value, (int, float))
                                 and not isinstance(value, bool) and math.isfinite(value)})
            if values:
                metrics.log_own(state.global_step, values)

    _made.append(NbtrainCallback)
    return NbtrainCallback


def _logging(state) -> bool:
    from . import active

    return active() and bool(state.is_world_process_zero)
