"""nbtrain.runs(): every run of a kernel, one row each — what it ran, what differed, how it ended, its numbers."""

from __future__ import annotations

import csv
import io

import pytest
from helpers.runhelp import run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.observers.runlog import RunLog

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
    assert first["cell"] == "for step in range(5):" and first["state"] == "finished" and first["world_size"] == 2
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
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.lifecycle.pools import PoolManager
    from nbtrain.kernel.request.config import ConfigError, LaunchRequest

    manager = PoolManager()
    with pytest.raises(ConfigError):
        run_source("x = 1", LaunchRequest(nprocs=2, cpu=True, grad_accum=0), {}, manager=manager)
    assert len(manager.runs.table()) == 0 and "no %%distributed run" in str(RunLog().table())


def test_a_row_names_its_cell_past_the_imports_and_says_the_summarys_seconds_and_cost(pools):
    import numpy as np

    from nbtrain.kernel.lifecycle.entry import format_summary

    source = """
        import time
        from os import (
            path,
        )
        # lr sweep, second try
        time.sleep(0.3)
        total = float(data.sum())
        """
    _, result = run_cell(pools, source, {"data": np.ones(2**24)}, price_per_gpu_hour=3600.0, out="total")
    row = pools.runs.table().to_dicts()[-1]
    assert row["cell"] == "# lr sweep, second try"
    summary = format_summary(result)[0]
    assert f"· {result.seconds:.1f} s" in summary and result.metering.words(result.seconds) in summary
    assert row["seconds"] == result.seconds  # the inputs' packing and the cell's checks count in neither or both
    assert row["core_hours"] == result.metering.hours(result.seconds) and row["cost"] == result.metering.cost(
        result.seconds)


@pytest.mark.parametrize("cell, shown", [
    ("import torch\nimport nbtrain\nmodel = torch.nn.Linear(2, 2)\n", "model = torch.nn.Linear(2, 2)"),
    ("\nimport os\n", "import os"),  # nothing but imports: its first line
    ("%time x = 1\n", "%time x = 1"),  # not plain Python: its first line
])
def test_a_cells_title_is_its_first_line_past_the_imports(cell, shown):
    from nbtrain.kernel.observers.runlog import title

    assert title(cell) == shown


def test_the_runs_are_a_pandas_frame_that_plots_a_series_per_run(pools):
    pandas = pytest.importorskip("pandas")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    run_cell(pools, CELL)
    run_cell(pools, CELL, grad_accum=2)
    table = pools.runs.table()
    frame = table.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and list(frame["loss final"])[-2:] == pytest.approx([0.2, 0.2])
    axes = table.plot("loss")
    assert [line.get_label() for line in axes.get_lines()] == ["loss final", "loss best"]
    assert len(axes.get_lines()[0].get_xdata()) == len(table)
    with pytest.raises(KeyError, match="no run of this kernel logged 'lr'; the runs logged: accuracy, loss"):
        table.plot("lr")
    matplotlib.pyplot.close("all")
