"""Warm ranks run what fresh ranks would: the notebook's edited modules, in the notebook's current directory.

Through a real kernel started in a notebook folder, as Jupyter starts one. File edits change the size
and bump the mtime explicitly, so a coarse file-system clock cannot hide them.
"""

from __future__ import annotations

import os

import pytest
from helpers.kernelhelp import Kernel

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


def write_module(path, body: str) -> None:
    """Write ``body`` and move the mtime forward a second, whatever the file system's clock granularity."""
    before = os.stat(path).st_mtime_ns if path.exists() else 0
    path.write_text(body)
    later = max(os.stat(path).st_mtime_ns, before + 1_000_000_000)
    os.utime(path, ns=(later, later))


@pytest.fixture
def notebook_dir(tmp_path):
    folder = tmp_path / "project" / "notebooks"
    folder.mkdir(parents=True)
    kernel = Kernel(cwd=str(folder))
    try:
        kernel.run("%load_ext nbtrain")
        yield kernel, folder
    finally:
        kernel.execute("%distributed_shutdown", timeout=30)
        kernel.shutdown()


def test_edited_local_modules_run_in_their_new_version_on_the_next_cell(notebook_dir):
    kernel, folder = notebook_dir
    mymod, helper = folder / "mymod.py", folder / "helper.py"
    write_module(mymod, "def f():\n    return 1\n")
    write_module(helper, "VALUE = 'old'\n")
    kernel.run("import importlib, mymod\nfrom mymod import f")
    # mymod travels from the notebook (module and function by reference); helper is imported by the cell only
    cell = "%%distributed 2 --cpu --out got\nimport helper\ngot = (mymod.f(), f(), helper.VALUE)\n"
    kernel.run(cell)
    out = kernel.run(cell + "assert got == (1, 1, 'old'), got\n")
    assert "(warm)" in out and "changed since" not in out  # nothing changed: the ranks stay warm

    write_module(mymod, "def f():\n    return 222\n")
    kernel.run("importlib.reload(mymod)\nfrom mymod import f")
    out = kernel.run(cell)
    assert "nbtrain: mymod.py changed since the warm ranks imported it; started fresh ranks" in out
    assert "(warm)" not in out
    kernel.run("assert got == (222, 222, 'old'), got")


def test_every_cell_runs_in_the_notebooks_current_directory(notebook_dir):
    kernel, folder = notebook_dir
    other = folder.parent / "other"
    other.mkdir()
    (folder / "data.txt").write_text("first folder")
    (other / "data.txt").write_text("other folder")
    (other / "othermod.py").write_text("WHERE = 'othermod from other'\n")
    read = "%%distributed 2 --cpu --out text,where\nimport os\ntext = open('data.txt').read()\nwhere = os.getcwd()\n"
    kernel.run(read)
    kernel.run(f"assert (text, where) == ('first folder', {str(folder)!r}), (text, where)")

    kernel.run("%cd ../other")
    out = kernel.run(read)
    assert "(warm)" in out
    kernel.run(f"assert (text, where) == ('other folder', {str(other)!r}), (text, where)")
    # modules are imported from the notebook's current directory, as on a fresh rank
    kernel.run("%%distributed 2 --cpu --out w\nimport othermod\nw = othermod.WHERE\n")
    kernel.run("assert w == 'othermod from other', w")

    # a relative --checkpoint, and a relative path in the cell, are under the notebook's current directory
    save = "import nbtrain, torch\nnbtrain.prepare(torch.nn.Linear(2, 2))\nnbtrain.save_checkpoint({})\n"
    out = kernel.run("%%distributed 2 --cpu --checkpoint ckdir\n" + save.format(""))
    assert "(warm)" in out
    assert (other / "ckdir" / "checkpoint.pt").is_file()
    kernel.run("%%distributed 2 --cpu\n" + save.format("'by_hand.pt'"))
    assert (other / "by_hand.pt").is_file()
    assert not (folder / "ckdir").exists() and not (folder / "by_hand.pt").exists()

    # back in the first folder, which has its own othermod.py: the warm ranks' othermod is not the one a
    # fresh rank would import
    (folder / "othermod.py").write_text("WHERE = 'othermod from the first folder'\n")
    kernel.run(f"%cd {folder}")
    out = kernel.run("%%distributed 2 --cpu --out w\nimport othermod\nw = othermod.WHERE\n")
    assert "othermod.py, but another file now comes first on the path; started fresh ranks" in out
    kernel.run("assert w == 'othermod from the first folder', w")


def test_a_deleted_working_directory_is_a_clear_error_before_anything_starts(notebook_dir):
    kernel, folder = notebook_dir
    doomed = folder / "doomed"
    doomed.mkdir()
    kernel.run(f"%cd {doomed}")
    doomed.rmdir()
    reply, out = kernel.execute("%%distributed 2 --cpu\nx = 1\n", timeout=60)
    assert reply["status"] == "error", out
    assert f"UsageError: The notebook's working directory {doomed} was deleted" in out and "%cd" in out
    assert "Traceback" not in out
    _, out = kernel.execute("%distributed_shutdown", timeout=30)
    assert "no warm ranks to stop" in out  # no rank was started
