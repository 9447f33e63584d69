"""What a failing or warning cell says, through real ranks: every line number is the cell's line as the
user sees it (the magic's line counts, as in "Cell line N"), and a failure's summary says what failed."""

from __future__ import annotations

import re
import traceback

import pytest
from helpers.runhelp import Captured, run_cell

from nbtrain.launch.diagnostics.failures import RankFailedError


def test_a_warning_names_the_cell_line_as_the_traceback_does(pools):
    out = Captured()
    run_cell(pools, """
        import warnings

        warnings.warn("lr looks high")
        """, write=out)
    lines = out.text("stderr").splitlines()
    assert "Cell line 4: UserWarning: lr looks high" in lines, lines
    assert "[rank 1] Cell line 4: UserWarning: lr looks high" in lines, lines
    assert "<%%distributed cell" not in out.text(), lines


def test_a_dataloader_workers_traceback_names_the_cell_line(pools):
    """torch re-raises a DataLoader worker's exception in the rank with the worker's traceback as text."""
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, """
            from torch.utils.data import DataLoader, Dataset

            class Broken(Dataset):
                def __len__(self):
                    return 4

                def __getitem__(self, i):
                    raise ValueError(f"bad item {i}")

            for batch in DataLoader(Broken(), num_workers=1):
                pass
            """)
    report = str(failed.value)
    assert "  Cell line 9, in __getitem__" in report.splitlines(), report
    assert "  Cell line 11, in <module>" in report.splitlines(), report
    assert "<%%distributed cell" not in report, report


def test_a_cpu_allocation_failure_says_how_much_was_asked_for(pools):
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, "import torch\nhuge = torch.empty(2**40)\n")
    first_line = failed.value._render_traceback_()[0]
    assert re.match(r"RankFailedError: rank [01] raised RuntimeError: DefaultCPUAllocator: can't allocate memory: "
                    r"you tried to allocate 4398046511104 bytes\.", first_line), first_line
    assert "enforce fail" not in first_line, first_line


def test_the_errors_name_is_said_once_wherever_it_is_shown(pools):
    """IPython shows _render_traceback_(); Python's traceback, Jupyter's error output (ename: evalue) and
    ``print(error)`` show the type's name beside str(error): each names RankFailedError once."""
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, "raise ValueError('bad value')\n")
    error = failed.value
    shown = {"ipython": error._render_traceback_()[0],
             "python": traceback.format_exception_only(error)[-1].splitlines()[0],
             "jupyter": f"{type(error).__name__}: {error}".splitlines()[0]}
    for where, line in shown.items():
        assert line.count("RankFailedError") == 1, (where, line)
        assert line.endswith("RankFailedError: rank 0 raised ValueError: bad value") or line.endswith(
            "RankFailedError: rank 1 raised ValueError: bad value"), (where, line)
