"""What a failing or warning cell says, through real ranks: every line number is the cell's line as the
user sees it (the magic's line counts, as in "Cell line N"), and a failure's summary says what failed."""

from __future__ import annotations

import re
import traceback

import pytest
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError


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
        assert line.endswith(("RankFailedError: rank 0 raised ValueError: bad value",
                              "RankFailedError: rank 1 raised ValueError: bad value")), (where, line)


def test_torchs_own_frames_are_folded_into_one_line(pools):
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, """
            import torch

            layer = torch.nn.Linear(2, 2)
            layer(torch.ones(3, 3))
            """)
    lines = str(failed.value).splitlines()
    at = lines.index("  Cell line 5, in <module>")
    assert lines[at + 1] == "    layer(torch.ones(3, 3))", lines
    assert re.fullmatch(r"  … \d+ frames inside torch hidden", lines[at + 2]), lines
    assert lines[at + 3].startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied"), lines
    assert not any("site-packages" in line for line in lines), lines


def test_a_notebook_functions_frame_names_the_cell_that_defined_it(shell):
    defined_in = shell.execution_count  # the cell's In[n] (its history is kept, as a notebook keeps it)
    shell.run_cell("def check(value):\n    raise ValueError(f'bad value {value}')\n", store_history=True).raise_error()
    failed = shell.run_cell("%%distributed 2 --cpu --no-dashboard\ncheck(rank)\n").error_in_exec
    report = "\n".join(failed._render_traceback_())
    assert f"  Cell In[{defined_in}], line 2, in check" in report.splitlines(), report
    assert "raise ValueError(f'bad value {value}')" in report and "<dynamic-code>" not in report, report


@pytest.mark.parametrize("cell, hint", [
    ("import torch\nx = torch.ones(2).to('cuda')\n", "Hint: this run has no GPU (its ranks run on the CPU)"),
    ("import torch\nwith torch.device('meta'):\n    model = torch.nn.Linear(2, 2)\nmodel.to(device)\n",
     "Hint: the model was built on the meta device"),
])
def test_a_device_mistake_gets_a_hint_that_names_the_fix(pools, cell, hint):
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, cell)
    report = str(failed.value)
    assert hint in report, report
    assert "`device`" in report or "nbtrain.prepare(model)" in report, report
