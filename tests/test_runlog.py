"""nbtrain.runs(): every run of a kernel, one row each — what it ran, what differed, how it ended, its numbers."""

from __future__ import annotations

import csv
import io

import pytest
from helpers.runhelp import run_cell

from nbtrain.launch.diagnostics.failures import RankFailedError
from nbtrain.launch.observers.runlog import RunLog

CELL = """
import nbtrain
for step in range(5):
    nbtrain.log(loss=1.0 / (step + 1), accuracy=step / 10)
"""


def test_each_run_is_a_row_with_its_options_state_and_series(pools, tmp_path):
    run_cell(pools, CELL)
    run_cell(pools, CELL, grad_accum=2, checkpoint=str(tmp_path / "ckpt"))
    with pytest.raises(RankFailedError):
        run_cell(pools, "raise ValueError('boom')\n")
    rows = pools.runs.table().to_dicts()[-3:]
    first, second, failed = rows
    assert first["cell"] == "import nbtrain" and first["state"] == "finished" and first["world_size"] == 2
    assert first["steps"] == 4 and first["loss final"] == pytest.approx(0.2) and first["loss best"] == pytest.approx(0.2)
    assert first["accuracy best"] == pytest.approx(0.4)  # accuracy-like: the largest is best
    assert "--grad-accum 2" in second["options"] and f"--checkpoint {tmp_path / 'ckpt'}" in second["options"]
    assert second["checkpoint"] == str(tmp_path / "ckpt")
    assert failed["state"] == "failed" and failed["cell"] == "raise ValueError('boom')"
    table = pools.runs.table()
    text, markup = str(table), table._repr_html_()
    assert "loss final" in text and "<table>" in markup and "raise ValueError(&#x27;boom&#x27;)" in markup
    parsed = list(csv.DictReader(io.StringIO(table.to_csv(str(tmp_path / "runs.csv")))))
    assert [r["state"] for r in parsed][-3:] == ["finished", "finished", "failed"]
    with open(tmp_path / "runs.csv", newline="") as written:
        assert written.read() == table.to_csv()


def test_a_mistake_before_anything_starts_is_no_run():
    from nbtrain.launch.lifecycle.entry import run_source
    from nbtrain.launch.lifecycle.pools import PoolManager
    from nbtrain.launch.request.config import ConfigError, LaunchRequest

    manager = PoolManager()
    with pytest.raises(ConfigError):
        run_source("x = 1", LaunchRequest(nprocs=2, cpu=True, grad_accum=0), {}, manager=manager)
    assert len(manager.runs.table()) == 0 and "no %%distributed run" in str(RunLog().table())
