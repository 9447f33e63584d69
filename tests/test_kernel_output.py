"""What a real kernel's cell shows of the ranks' output and keeps of their history, on every ending."""

from __future__ import annotations

import pytest
from helpers.kernelhelp import nbtrain_kernel

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


@pytest.fixture(scope="module")
def kernel():
    with nbtrain_kernel() as kernel:
        yield kernel


def test_partial_lines_of_two_ranks_never_share_a_line(kernel):
    reply, out = kernel.execute(
        "%%distributed 2 --cpu --no-dashboard --keep-alive 0\n"
        "import time\n"
        "print('epoch 1 ... ', end='', flush=True)\n"
        "time.sleep(0.5)\n"  # longer than any time-based hold
        "print('done', flush=True)\n"
        "print(f'last words of {rank}', end='')\n")
    assert reply["status"] == "ok", out
    lines = out.splitlines()
    assert sorted(lines[:4]) == ["[rank 1] epoch 1 ... done", "[rank 1] last words of 1", "epoch 1 ... done",
                                 "last words of 0"], out
    assert lines[4].startswith("nbtrain: 2 ranks"), out  # the summary on a line of its own


def test_a_stopped_run_keeps_what_was_logged(kernel):
    msg_id = kernel.start(
        "%%distributed 2 --cpu --no-dashboard\n"
        "import itertools, time, nbtrain\n"
        "for step in itertools.count():\n"
        "    nbtrain.log(loss=1.0 / (step + 1))\n"
        "    if step == 5:\n"
        "        print('logging', flush=True)\n"
        "    time.sleep(0.01)\n")
    kernel.collect(msg_id, 60, until=lambda out: "logging" in out and "[rank 1] logging" in out)
    kernel.km.interrupt_kernel()
    reply, out = kernel.collect(msg_id, 30)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", (reply, out[-1500:])
    reply, out = kernel.execute(
        "logged = history['loss']\n"
        "print(len(logged) >= 6, logged[0], logged.steps[:3], history.ranks('loss'))\n")
    assert reply["status"] == "ok", (reply, out)
    assert out.strip() == "True 1.0 [0, 1, 2] [0, 1]", out


def test_a_syntax_error_names_the_lines_as_the_notebook_numbers_them(kernel):
    """The magic's line is line 1: the `for` is on line 2, the line that should be indented on line 3."""
    reply, out = kernel.execute("%%distributed 2 --cpu --no-dashboard\nfor step in range(3):\nprint(step)\n")
    assert reply["status"] == "error", out
    assert "line 3: expected an indented block after 'for' statement on line 2" in out, out
