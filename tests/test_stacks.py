"""Where a rank is, read from its faulthandler dump: pure tests of nbtrain.kernel.diagnostics.stacks, no process.

The dumps in tests/data/stacks/ are what ``faulthandler.dump_traceback(all_threads=True)`` writes in a
rank (the format of CPython 3.11): the parent watcher thread of nbtrain's worker, a DataLoader feeder
thread, a thread with no Python frame, torch's ``c10d_logger`` and elastic ``@record`` wrappers, and a
deep recursion cut at faulthandler's 100 frames. The cell ran with ``%%distributed`` on the line above
it, so cell lines as the user sees them are one more than the compiled source's (``line_offset`` 1).
"""

from __future__ import annotations

import pathlib

import pytest

from nbtrain.kernel.diagnostics.stacks import is_complete, locate, main_thread, parse_threads, summarise

DUMPS = pathlib.Path(__file__).parent / "data" / "stacks"
CELL_FILENAME = "<%%distributed cell 7f0c1d2e3a40>"  # as the kernel names a job's source

CELLS = {
    "barrier": "import torch.distributed as dist\nx = torch.ones(1)\nif rank == 0:\n    ready = True\ndist.barrier()\n",
    "sleeping": "import time\nprint('up', flush=True)\nstep = 0\ntime.sleep(600)\n",
    "dataloader": "import torch\nloader = make_loader(rank)\nfor x, y in loader:\n    pass\n",
    "notebook_function": "model = build()\ntrain(model)\n",
    "loading_inputs": "y = big * 2\n",
    "exiting": "x = 1\n",
    "recursion": "import time\ndef countdown(n):\n    return countdown(n - 1) if n else time.sleep(600)\ncountdown(500)\n",
}


def where(name: str) -> str:
    return summarise((DUMPS / f"{name}.txt").read_text(), CELL_FILENAME, CELLS[name].splitlines(), 1)


@pytest.mark.parametrize("name, summary", [
    ("barrier", "waiting in barrier() (torch.distributed), from cell line 6: dist.barrier()"),
    ("sleeping", "at cell line 5: time.sleep(600)"),
    ("dataloader", "at cell line 4: for x, y in loader: (inside wait, threading.py:331)"),
    ("notebook_function", "waiting in all_reduce() (torch.distributed), from cell line 3: train(model)"),
    ("loading_inputs", "at serialization.py:1025 in load"),
    ("exiting", "no Python stack (the rank may be exiting)"),
    ("recursion", "at cell line 4: return countdown(n - 1) if n else time.sleep(600)"),
])
def test_a_dump_is_summarised_as_the_collective_and_the_cell_line(name, summary):
    assert where(name) == summary


def test_the_cells_thread_is_the_one_running_the_worker_loop_not_the_first_listed():
    threads = parse_threads((DUMPS / "dataloader.txt").read_text())
    assert [len(frames) for frames in threads] == [5, 4, 16]  # feeder, parent watcher, main (innermost first)
    main = main_thread(threads)
    assert main is threads[2] and main[0].function == "wait" and main[-1].function == "_run_module_as_main"


def test_a_thread_without_python_frames_is_listed_empty():
    threads = parse_threads((DUMPS / "sleeping.txt").read_text())
    assert threads[0] == [] and main_thread(threads)[0].filename == CELL_FILENAME


def test_position_gives_the_collective_and_the_users_line_separately():
    pos = locate((DUMPS / "barrier.txt").read_text(), CELL_FILENAME, CELLS["barrier"].splitlines(), 1)
    assert (pos.collective, pos.cell_line, pos.has_stack) == ("barrier", 6, True)
    assert pos.where == "cell line 6: dist.barrier()" and pos.inside == "barrier, distributed_c10d.py:4812"


def test_a_cell_line_outside_the_source_is_named_without_its_text():
    lines = CELLS["barrier"].splitlines()[:3]  # the dump's line 5 is past what the kernel knows of the cell
    text = summarise((DUMPS / "barrier.txt").read_text(), CELL_FILENAME, lines, 1)
    assert text == "waiting in barrier() (torch.distributed), from cell line 6"


def test_another_cells_frames_are_not_taken_for_this_one():
    dump = (DUMPS / "barrier.txt").read_text()
    assert summarise(dump, "<%%distributed cell 1234>", CELLS["barrier"].splitlines(), 1) == \
        "waiting in barrier() (torch.distributed), from distributed_c10d.py:4812 in barrier"


@pytest.mark.parametrize("name, complete", [
    ("barrier", True), ("dataloader", True), ("loading_inputs", True),
    ("recursion", False),  # cut at 100 frames: the worker loop is not in it
    ("exiting", False), ("sleeping", True),
])
def test_a_dump_is_complete_when_it_reaches_the_worker_loop(name, complete):
    assert is_complete((DUMPS / f"{name}.txt").read_text()) is complete


def test_a_dump_cut_mid_line_keeps_the_frames_before_the_cut():
    dump = (DUMPS / "barrier.txt").read_text()
    cut = dump[:dump.index('line 5 in <module>')]  # read while faulthandler was still writing
    assert not is_complete(cut)  # so the mismatch check does not judge from it
    assert [f.function for f in parse_threads(cut)[1]] == ["barrier", "wrapper"]
