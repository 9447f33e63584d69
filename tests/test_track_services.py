"""--track mlflow[=URI]: rank 0's series, the run's facts and its summary in MLflow, read back with MLflow's client;
a tracker that is not installed is a usage error before any process starts."""

from __future__ import annotations

import sys

import pytest
from helpers.runhelp import Captured, run_cell
from helpers.workers import nbtrain_workers

from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

LOGGING_CELL = """
import nbtrain
for step in range(4):
    nbtrain.log(loss=10.0 * (rank + 1) - step)
"""


@pytest.mark.slow
def test_track_mlflow_writes_rank_0s_series_the_options_and_the_summary(pools, tmp_path, monkeypatch, capsys):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a local directory store, as a laptop has it
    store = tmp_path / "mlruns"
    run_cell(pools, LOGGING_CELL, write=Captured(), track=(f"mlflow={store}",))
    client = mlflow.tracking.MlflowClient(f"file://{store}")
    (run,) = client.search_runs([client.get_experiment_by_name("nbtrain").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [
        (step, 10.0 - step) for step in range(4)]  # rank 0's
    assert run.data.params["nprocs"] == "2" and run.info.status == "FINISHED"
    summary = client.download_artifacts(run.info.run_id, "summary.txt", str(tmp_path))
    assert "2 ranks" in open(summary).read()
    assert f"MLflow run {run.info.run_id}" in capsys.readouterr().out


def test_a_missing_tracker_package_is_a_usage_error_before_ranks_start(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` meets where it is not installed
    running = {p.pid for p in nbtrain_workers()}
    with pytest.raises(ConfigError, match=r"--track mlflow needs the mlflow package.*pip install 'nbtrain\[mlflow\]'"):
        run_source("import nbtrain\nnbtrain.log(loss=1.0)", LaunchRequest(nprocs=2, cpu=True, fresh=True,
                                                                         track=("mlflow",)), {})
    assert {p.pid for p in nbtrain_workers()} == running


def test_an_unknown_tracker_says_which_ones_exist():
    with pytest.raises(ConfigError, match="nbtrain tracks to mlflow, wandb, trackio"):
        resolve(LaunchRequest(nprocs=2, cpu=True, track=("neptune",)))


@pytest.mark.slow
def test_track_wandb_offline_writes_rank_0s_series_the_options_and_the_summary(pools, tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    from helpers import wandb_offline

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_cell(pools, LOGGING_CELL, write=Captured(), track=("wandb=exp1",))
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    kinds = wandb_offline.finished(str(log))
    assert "exit" in kinds, kinds
    steps = [(h["_step"], h["loss"]) for h in wandb_offline.history(str(log)) if "loss" in h]
    assert steps == [(step, 10.0 - step) for step in range(4)], kinds  # rank 0's
    assert wandb_offline.config(str(log))["nprocs"] == 2
    assert "summary.txt" in wandb_offline.saved_files(str(log))
    assert "nbtrain: W&B run" in capsys.readouterr().out


@pytest.mark.slow
def test_track_trackio_writes_rank_0s_series_and_the_options_locally(pools, tmp_path, monkeypatch, capsys):
    pytest.importorskip("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path))  # read when trackio is imported: in the kernel, by the run
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for module in [m for m in sys.modules if m == "trackio" or m.startswith("trackio.")]:
        monkeypatch.delitem(sys.modules, module)
    run_cell(pools, LOGGING_CELL, write=Captured(), track=("trackio=exp1", f"mlflow={tmp_path / 'mlruns'}"))
    assert (tmp_path / "exp1.db").exists()
    from trackio.sqlite_storage import SQLiteStorage

    (name,) = SQLiteStorage.get_runs("exp1")
    assert [(m["step"], m["loss"]) for m in SQLiteStorage.get_logs("exp1", name)] == [(s, 10.0 - s) for s in range(4)]
    assert SQLiteStorage.get_run_config("exp1", name)["nprocs"] == 2
    out = capsys.readouterr().out
    assert f"nbtrain: trackio run {name} in project exp1" in out and "MLflow run" in out  # both at once
