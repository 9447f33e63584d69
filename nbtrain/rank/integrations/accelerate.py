"""accelerate's trackers logging into nbtrain: what ``Accelerator.log`` sends its trackers becomes nbtrain's series.

accelerate builds the trackers named in ``Accelerator(log_with=…)`` from its registry of tracker classes, which
it lets other code add to (``accelerate.tracking.register_tracker_class``). :func:`install` registers, under each
built-in name, a subclass of that tracker whose ``log`` also logs the values with nbtrain at accelerate's step;
the tracker itself (TensorBoard, W&B, MLflow, …) logs as before. It registers ``nbtrain`` too, a tracker that only
logs into nbtrain, for a cell with no other tracker: ``Accelerator(log_with="nbtrain")``. ``Accelerator.log`` runs
on the main process, so the series are rank 0's. Outside a cell (or with ``--no-integrations``) the subclasses log
as their parents do and nothing more.
"""

from __future__ import annotations

import math
import warnings

from ..train import metrics

NAME = "accelerate"


def install(tracking) -> None:
    """Register the teeing tracker classes in ``accelerate.tracking`` (once)."""
    registry = tracking.LOGGER_TYPE_TO_CLASS
    with warnings.catch_warnings():  # "… is already registered and will be overwritten": on purpose, and said here
        warnings.simplefilter("ignore")
        for tracker in list(registry.values()):
            if not getattr(tracker, "nbtrain_tee", False):
                tracking.register_tracker_class(_teed(tracker))
        if "nbtrain" not in registry:
            tracking.register_tracker_class(_own_tracker(tracking.GeneralTracker))


def _teed(tracker: type) -> type:
    class Teed(tracker):
        __doc__ = f"{tracker.__name__}, also logging into nbtrain."
        __qualname__ = f"nbtrain.{tracker.__name__}"  # as accelerate's own messages name the class
        nbtrain_tee = True

        def start(self):
            super().start()
            _started()

        def log(self, values: dict, step: int | None = None, **kwargs):
            super().log(values, step=step, **kwargs)
            _log(values, step)

    return Teed


def _own_tracker(general: type) -> type:
    class NbtrainTracker(general):
        """``log_with="nbtrain"``: the values become the cell's series, and go nowhere else."""

        name = "nbtrain"
        requires_logging_directory = False
        nbtrain_tee = True

        def __init__(self, run_name: str = "", **kwargs):
            super().__init__()

        @property
        def tracker(self):
            return None

        def start(self):
            _started()

        def store_init_configuration(self, values: dict):
            pass

        def log(self, values: dict, step: int | None = None, **kwargs):
            _log(values, step)

    return NbtrainTracker


def _started() -> None:
    from . import active

    if active():
        metrics.send_setup({"integration": NAME})  # the summary says which


_call: list = [None, None]  # the last Accelerator.log call's (values, step): held, so the dict is not another's


def _log(values: dict, step: int | None) -> None:
    """One ``Accelerator.log`` call's scalars, once: every tracker of the call gets the same dict (two teed
    trackers, or one and ``nbtrain``, log it once). A value logged again unchanged is a point again: the cell asked."""
    from . import active

    if not active() or (_call[0] is values and _call[1] == step):
        return
    _call[:] = [values, step]
    scalars = {name: float(value) for name, value in values.items() if isinstance(value, (int, float))
               and not isinstance(value, bool) and math.isfinite(value)}
    if scalars:  # with no step from accelerate, each name's next one, as nbtrain.log counts
        metrics.log_own(None if step is None else int(step), scalars)
