"""input(), sys.stdin and pdb in a rank, answered through a real kernel's stdin (jupyter_client, allow_stdin)."""

from __future__ import annotations

import time

import pytest
from helpers.kernelhelp import nbtrain_kernel
from helpers.outputs import cell_text
from helpers.runhelp import Captured
from helpers.storepeer import STORE_PORT, plant
from helpers.workers import assert_no_workers
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from nbtrain.kernel.relay.output import AtMarks, OutputRelay
from nbtrain.kernel.relay.stdin import PendingPrompts
from nbtrain.wire import protocol as P


@pytest.fixture(scope="module")
def kernel():
    with nbtrain_kernel() as k:
        yield k
    assert_no_workers()  # nor those of the notebook run by nbclient below


TIMEOUT_S = 6  # short, but long enough for two ranks that start on a busy machine to join the process group


def by_prompt(prompt: str) -> str:
    """Both ranks ask at once: which request comes first is a race, so the answer follows the prompt."""
    return "Ada" if "name" in prompt else "from stdin"


def test_input_on_rank_0_is_answered_in_the_notebook(kernel):
    reply, out, prompts = kernel.execute_answering(
        "%%distributed 2 --cpu --no-dashboard --out name\n"
        "import sys\n"
        "print('before the prompt')\n"
        "name = input('your name? ') if rank == 0 else None\n"
        "line = sys.stdin.readline() if rank == 1 else None\n"
        "print(f'rank {rank} got', repr(name or line))\n", [by_prompt, by_prompt])
    assert reply["status"] == "ok", out
    assert sorted(prompts) == ["[rank 0] your name? ", "[rank 1] "], prompts
    assert "rank 0 got 'Ada'" in out and "[rank 1] rank 1 got 'from stdin\\n'" in out
    assert out.index("before the prompt") < out.index("rank 0 got")
    assert kernel.run("print(name)").strip() == "Ada"


def test_a_breakpoint_on_rank_0_is_stepped_with_n_and_continued_with_c(kernel):
    reply, out, prompts = kernel.execute_answering(
        "%%distributed 2 --cpu --no-dashboard\n"
        "x = 1\n"
        "if rank == 0:\n"
        "    breakpoint()\n"
        "    x = 2\n"
        "    x = 3\n"
        "print(f'rank {rank} x={x}')\n", ["n", "p x", "c"])
    assert reply["status"] == "ok", out
    assert prompts == ["[rank 0] (Pdb) "] * 3
    listing = out[:out.index("rank 0 x=")]
    assert "-> x = 2" in listing and "-> x = 3" in listing, out  # pdb stopped at the next line, then stepped
    assert listing.index("-> x = 2") < listing.index("-> x = 3") < listing.index("\n2\n")  # `p x` after `n`
    assert "rank 0 x=3" in out and "[rank 1] rank 1 x=1" in out


def test_stepping_off_the_end_of_the_cell_ends_the_debugger(kernel):
    reply, out, prompts = kernel.execute_answering(
        "%%distributed 2 --cpu --no-dashboard --out y\nif rank == 0:\n    breakpoint()\ny = 5\n", ["n", "n"])
    assert reply["status"] == "ok", out
    assert prompts == ["[rank 0] (Pdb) "] * 2, out  # at `y = 5`, then at the cell's return: no stop after the cell
    assert "--Return--" in out and kernel.run("print(y)").strip() == "5"


def test_nbtrain_breakpoint_holds_the_other_ranks_past_the_collective_timeout(kernel):
    """Rank 1 is hidden (--output rank0), its prompt still comes; rank 0 waits longer than --timeout (a slow
    human), outside any collective, and the broadcast after the breakpoint carries what was typed in pdb."""
    started = time.monotonic()

    def slow_human(prompt: str) -> str:
        time.sleep(TIMEOUT_S + 1)  # longer than the process group's timeout: a human reading the listing
        return "value = 42"

    reply, out, prompts = kernel.execute_answering(
        f"%%distributed 2 --cpu --no-dashboard --timeout {TIMEOUT_S} --output rank0\n"
        "import nbtrain, torch, torch.distributed as dist\n"
        "value = 0\n"
        "nbtrain.breakpoint(rank=1)\n"
        "t = torch.tensor([value])\n"
        "dist.broadcast(t, src=1)\n"
        "result = int(t)\n", [slow_human, "c"])
    assert reply["status"] == "ok", out
    assert prompts == ["[rank 1] (Pdb) "] * 2
    assert time.monotonic() - started > TIMEOUT_S + 1
    assert kernel.run("print(result)").strip() == "42"


def test_a_release_planted_in_the_store_lets_no_rank_past_nbtrain_breakpoint(kernel):
    """The store has no authentication: keys planted there for the next cells' breakpoints (a network peer's) must
    not let rank 0 run on into the broadcast — where it would time out while rank 1 is still in pdb."""
    cell_options = f"%%distributed 2 --cpu --no-dashboard --timeout {TIMEOUT_S} --output rank0"
    kernel.run(f"{cell_options} --out port\n{STORE_PORT}", timeout=120)  # the same warm pool as the cell below
    port = int(kernel.run("print(port)"))
    keys = ("default_pg/0//nbtrain/breakpoint/{job}/{call}", "nbtrain/breakpoint/{job}/{call}")
    assert plant(port, [(k.format(job=job, call=call), "1") for k in keys for job in range(1, 31) for call in (1, 2)])[
        "error"] is None

    def slow_human(prompt: str) -> str:
        time.sleep(TIMEOUT_S + 1)
        return "value = 7"

    reply, out, _prompts = kernel.execute_answering(
        f"{cell_options}\n"
        "import nbtrain, torch, torch.distributed as dist\n"
        "value = 0\n"
        "nbtrain.breakpoint(rank=1)\n"
        "t = torch.tensor([value])\n"
        "dist.broadcast(t, src=1)\n"
        "result = int(t)\n", [slow_human, "c"])
    assert reply["status"] == "ok", out
    assert kernel.run("print(result)").strip() == "7"


def test_a_front_end_without_stdin_gives_the_rank_an_eof_error_that_says_so(kernel):
    nb = new_notebook(cells=[new_code_cell(c) for c in [
        "%load_ext nbtrain",
        "%%distributed 2 --cpu --no-dashboard\nanswer = input('continue? ') if rank == 0 else ''",
        "%distributed_shutdown",
    ]])
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()  # allow_stdin is off
    text = cell_text(nb.cells[1])
    assert "rank 0 asked for input ('continue?'), but this front end does not take input" in text
    assert "EOFError: input() on rank 0: this notebook front end does not take input" in text


def test_the_prompt_waits_for_the_text_printed_before_it():
    """Socket and pipe race: a request that arrives after its mark is asked once it arrives, after the text."""
    text, asked, replies = Captured(), [], []
    prompts = PendingPrompts(lambda rank, reply: replies.append((rank, reply)), text, 2,
                             ask=lambda prompt: asked.append((len(text.text()), prompt)) or "yes")
    relay = OutputRelay(text, 2, at_marks=AtMarks(answer_prompt=prompts.answer))
    relay.feed(1, "stdout", f"listing\n{P.INPUT_MARK}1\nafter\n")
    assert text.text() == "[rank 1] listing\n" and not asked
    prompts.add(P.InputRequest(5, 1, 1, "(Pdb) "), relay)
    assert asked == [(len("[rank 1] listing\n"), "[rank 1] (Pdb) ")]
    assert replies == [(1, P.InputReply(1, "yes", ""))] and text.text().endswith("[rank 1] after\n")


def test_the_stop_button_at_a_prompt_stops_the_run(kernel):
    msg_id = kernel.kc.execute("%%distributed 2 --cpu --no-dashboard\n"
                               "answer = input('waiting for you: ') if rank == 0 else None",
                               allow_stdin=True)
    request = kernel.kc.get_stdin_msg(timeout=120)
    assert request["content"]["prompt"] == "[rank 0] waiting for you: "
    kernel.km.interrupt_kernel()
    reply, out = kernel.collect(msg_id, 30)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", out
    assert "every rank and its child processes were ended" in out
    assert_no_workers()
