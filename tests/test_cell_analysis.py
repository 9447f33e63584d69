"""Which notebook names a cell reads and which it assigns — decided from the syntax tree alone."""

import pytest

from nbtrain.kernel.request.cell import CellSyntaxError, analyse_cell, imported_only


def test_reads_notebook_names_before_they_are_rebound():
    info = analyse_cell("model = model.to(device)\nopt = make_opt(model)\n")
    assert info.reads == ("model", "device", "make_opt")
    assert info.assigns == ("model", "opt")


def test_names_bound_earlier_in_the_cell_are_not_reads():
    info = analyse_cell("import torch\nx = torch.ones(3)\ny = x * scale\n")
    assert "x" not in info.reads and "torch" not in info.reads
    assert info.reads == ("scale",)
    assert info.assigns == ("torch", "x", "y")


def test_functions_read_globals_the_cell_does_not_define():
    src = "def step(batch):\n    return model(batch) * factor\nmodel = Net()\nout = step(data)\n"
    info = analyse_cell(src)
    assert set(info.reads) == {"Net", "data", "factor"}
    assert info.assigns == ("step", "model", "out")


def test_comprehensions_lambdas_and_classes():
    src = ("squares = [f(i) for i in items]\n"
           "g = lambda v: v + offset\n"
           "class Head(Base):\n    size = width\n    def forward(self, x):\n        return act(x)\n")
    info = analyse_cell(src)
    assert set(info.reads) == {"f", "items", "offset", "Base", "width", "act"}
    assert "i" not in info.reads and "v" not in info.reads


def test_augmented_assignment_reads_first_and_for_with_targets_bind():
    info = analyse_cell("total += 1\nfor k in range(n):\n    pass\nwith open(p) as fh:\n    data = fh.read()\n")
    assert info.reads == ("total", "range", "n", "open", "p")
    assert info.assigns == ("total", "k", "fh", "data")


def test_syntax_error_names_the_cell_line_counting_the_magic_line():
    with pytest.raises(CellSyntaxError) as err:
        analyse_cell("x = 1\ny = (2\n", line_offset=1)
    assert "line 3" in str(err.value) or "line 2" in str(err.value)
    with pytest.raises(CellSyntaxError, match="line 3"):
        analyse_cell("a = 1\nb = 2\nreturn 3 +\n", line_offset=0)
    with pytest.raises(CellSyntaxError, match="line 3: expected an indented block after 'for' statement on line 2\n"):
        analyse_cell("for i in range(3):\nprint(i)", line_offset=1)


def test_names_the_cell_deletes():
    info = analyse_cell("buf = 1\nkeep = 2\ndel buf\nif keep:\n    del keep\ndef f():\n    x = 1\n    del x\n")
    assert info.deletes == ("buf", "keep") and info.assigns == ("buf", "keep", "f")


def test_an_except_clauses_name_counts_as_deleted_as_python_deletes_it_when_the_clause_ends():
    info = analyse_cell("try:\n    x = 1 / 0\nexcept ZeroDivisionError as exc:\n    why = str(exc)\n")
    assert info.assigns == ("x", "exc", "why") and info.deletes == ("exc",)  # never said to be missing


def test_names_bound_only_by_imports_are_known_apart():
    info = analyse_cell("import time, os.path\nfrom torch import nn as tnn\nimport numpy as np\nnp = np.asarray([1])\n"
                        "total = 3\nif total:\n    import json\n")
    assert imported_only(info) == {"time", "os", "tnn"}  # np is rebound; json's import is not a top-level statement
