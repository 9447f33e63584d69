"""``--track mlflow[=URI]``, ``--track wandb[=PROJECT]``, ``--track trackio[=PROJECT]``: the run's series, options and summary in a tracking service, from the kernel.

Like ``--tensorboard`` (:mod:`nbtrain.kernel.observers.trackers`), the tracker runs in the kernel, which already
receives every rank's series: the ranks import nothing and are not slowed. Rank 0's series are the run's
(every rank logs alike); the run's facts are its parameters, the final summary its ``summary.txt`` artifact,
and the run's name and where to find it are printed under the cell when it ends.

:func:`parse_tracks` checks each ``--track`` before any process starts: a name nbtrain knows, and a package
that can be imported in this kernel, or :class:`~nbtrain.kernel.observers.trackers.TrackerSetupError` saying
what to install.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from typing import Any

from .events import RunInfo, RunObserver, RunState

_PACKAGES = {"mlflow": ("mlflow", "mlflow-skinny"), "wandb": ("wandb", "wandb"),
             "trackio": ("trackio", "trackio")}  # name -> (module to import, what pip installs)
TRACKED_RANK = 0


@dataclass(frozen=True)
class TrackSpec:
    name: str  # a key of _PACKAGES
    where: str | None  # mlflow: the tracking URI (a directory: a local file store); wandb, trackio: the project; None: default


def parse_tracks(texts: tuple[str, ...], cwd: str) -> tuple[TrackSpec, ...]:
    """``("mlflow=runs/ml",)`` -> the trackers to follow the run with; a clear error for an unknown or missing one."""
    from .trackers import TrackerSetupError

    specs = []
    for text in texts:
        name, _, where = text.strip().partition("=")
        name = name.strip().lower()
        if name not in _PACKAGES:
            raise TrackerSetupError(f"--track {text}: nbtrain tracks to {', '.join(_PACKAGES)} (such as --track "
                                    "mlflow=runs/mlflow); for another service, register a nbtrain.Tracker.")
        module, package = _PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise TrackerSetupError(f"--track {name} needs the {module} package, which is not installed in this "
                                    f"kernel's environment: pip install 'nbtrain[{name}]' (or pip install {package}), "
                                    "then restart the kernel.")
        where = where.strip()
        specs.append(TrackSpec(name, (_local_uri(where, cwd) if name == "mlflow" else where) if where else None))
    return tuple(specs)


def _local_uri(where: str, cwd: str) -> str:
    """A URI as given; a plain path: a local store in that directory, relative to the notebook's ``cwd``."""
    if "://" in where or where.startswith(("file:", "sqlite:", "databricks")):
        return where
    return "file://" + os.path.normpath(os.path.join(cwd, os.path.expanduser(where)))


def tracker_for(spec: TrackSpec) -> RunObserver:
    if spec.name == "mlflow":
        return MlflowTracker(spec.where)
    return WandbTracker(spec.where) if spec.name == "wandb" else TrackioTracker(spec.where)


class MlflowTracker(RunObserver):
    """One MLflow run per cell (restarts included) in the experiment ``nbtrain``: rank 0's series as metrics."""

    _shown_as = "the MLflow tracker (--track mlflow)"

    def __init__(self, uri: str | None) -> None:
        self.uri = uri
        self._client: Any = None  # an MlflowClient once the run started (mlflow is imported only then)
        self._run_id: str | None = None

    def run_started(self, info: RunInfo) -> None:
        if self._run_id is not None:  # --max-restarts: the same run goes on
            return
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = client = MlflowClient(self.uri)
        experiment = client.get_experiment_by_name("nbtrain")
        experiment_id = experiment.experiment_id if experiment else client.create_experiment("nbtrain")
        self._run_id = client.create_run(experiment_id, run_name=info.run_id).info.run_id
        client.log_batch(self._run_id, params=[Param(k, str(v)) for k, v in _parameters(info).items()])

    def metrics(self, rank: int, records: list) -> None:
        if rank != TRACKED_RANK or self._client is None:
            return
        from mlflow.entities import Metric

        batch = [Metric(name, value, int(when * 1000), step)
                 for step, when, values in records for name, value in values.items()]
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics a batch
            self._client.log_batch(self._run_id, metrics=batch[start:start + 1000])

    def run_finished(self, status: RunState, summary: str) -> None:
        client, run_id = self._client, self._run_id
        if client is None or run_id is None:
            return
        client.log_text(run_id, summary, "summary.txt")
        client.set_terminated(run_id, "FINISHED" if status == RunState.FINISHED else "FAILED", end_time=int(time.time() * 1000))
        print(f"nbtrain: MLflow run {run_id} in {client.tracking_uri} (experiment nbtrain)")


class _ProjectTracker(RunObserver):
    """A tracker whose run lives in a project (W&B, trackio): one run per cell, restarts included, started by
    :meth:`_start`; rank 0's series logged at their steps."""

    def __init__(self, project: str | None) -> None:
        self.project = project or "nbtrain"
        self._run: Any = None

    def run_started(self, info: RunInfo) -> None:
        if self._run is None:  # --max-restarts: the same run goes on
            self._run = self._start(info)

    def _start(self, info: RunInfo) -> Any:
        raise NotImplementedError

    def metrics(self, rank: int, records: list) -> None:
        if rank != TRACKED_RANK or self._run is None:
            return
        for step, _when, values in records:
            self._run.log(values, step=step)


class WandbTracker(_ProjectTracker):
    """One W&B run per cell (restarts included) in ``project`` (default ``nbtrain``): rank 0's series, at their steps.

    ``WANDB_MODE=offline`` keeps the run in the notebook's folder (``wandb/offline-run-*``) for ``wandb sync``."""

    _shown_as = "the W&B tracker (--track wandb)"

    def _start(self, info: RunInfo) -> Any:
        import wandb

        return wandb.init(project=self.project, name=info.run_id, config=_parameters(info), reinit="create_new")

    def run_finished(self, status: RunState, summary: str) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        with open(os.path.join(run.dir, "summary.txt"), "w") as file:
            file.write(summary)
        run.save(os.path.join(run.dir, "summary.txt"), base_path=run.dir, policy="now")
        run.summary["status"] = str(status)
        where = run.url or run.dir
        run.finish(exit_code=0 if status == RunState.FINISHED else 1)
        print(f"nbtrain: W&B run {run.name} ({where})")


class TrackioTracker(_ProjectTracker):
    """One trackio run per cell (restarts included) in ``project`` (default ``nbtrain``), stored locally
    (``TRACKIO_DIR``): rank 0's series at their steps, the run's facts as its config. trackio keeps no files
    with a run, so the summary is only printed."""

    _shown_as = "the trackio tracker (--track trackio)"

    def _start(self, info: RunInfo) -> Any:
        import trackio

        return trackio.init(project=self.project, name=info.run_id, config=_parameters(info))

    def run_finished(self, status: RunState, summary: str) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.finish()
            print(f"nbtrain: trackio run {run.name} in project {self.project} (trackio show --project {self.project})")


def _parameters(info: RunInfo) -> dict[str, object]:
    return {"nprocs": info.nprocs, "backend": info.backend, "device": info.device_type, "warm": info.warm}
