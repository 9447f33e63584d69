"""Sessions (``%%distributed N --session NAME``) through a real kernel: variables that stay on the ranks.

A notebook run by nbclient: a model built in one session cell is trained and evaluated by the next ones
without travelling; names still come in from the notebook (when the notebook rebound them) and go back
(what the cell assigns, or --out); %distributed_pull fetches a held name; a failed cell leaves the
session as it was; a crashed rank, or a rank stuck in a collective after another failed, ends the session
and the error says so. The option checks need no process.
"""

from __future__ import annotations

import re

import pytest
from helpers.outputs import cell_text
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.lifecycle.pools import PoolManager
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve

pytestmark = pytest.mark.usefixtures("no_leftover_workers")

S1 = "%%distributed 2 --cpu --no-dashboard --session s1"


def run_notebook(cells: list[str]) -> list[str]:
    nb = new_notebook(cells=[new_code_cell(c) for c in ["%load_ext nbtrain", *cells, "%distributed_shutdown"]])
    NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True).execute()
    return [cell_text(c) for c in nb.cells[1:]]


def test_a_session_keeps_a_model_on_the_ranks_across_cells():
    text = run_notebook([
        "width = 4",
        # 1: build; nothing comes back (--out -)
        f"{S1} --out -\nimport torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(width, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nX = torch.randn(64, width)\nY = X.sum(1, keepdim=True)\n"
        "built = id(model)",
        "print('model in notebook:', 'model' in dir())",
        # 2: train an epoch on the same object; the loss comes back
        f"{S1} --out first_loss,last_loss\nassert id(model) == built, 'a new model'\n"
        "losses = []\nfor i in range(0, 64, 8):\n    opt.zero_grad()\n"
        "    loss = torch.nn.functional.mse_loss(model(X[i:i+8]), Y[i:i+8])\n    loss.backward(); opt.step()\n"
        "    losses.append(loss.item())\nfirst_loss, last_loss = losses[0], losses[-1]",
        "print('trained', last_loss < first_loss)",
        # 3: evaluate; the model comes back too (a copy)
        f"{S1} --out same,err,model\nsame = id(model) == built\nerr = torch.nn.functional.mse_loss(model(X), Y).item()",
        "print('same', same, 'err', err < first_loss, type(model).__name__)",
        # 4: the copy that came back does not replace the ranks' model; a rebound name does come in
        "width = 99",
        f"{S1} --out seen\nseen = (id(model) == built, width)",
        "print('seen', seen)",
        # 5: a failed cell leaves the session as it was
        f"{S1}\nwidth = -1\nbroken = True\nraise ValueError('bad step')",
        f"{S1} --out after\nafter = (width, 'broken' in globals(), id(model) == built)",
        "print('after', after)",
        "%distributed_sessions",
        "del model\n%distributed_pull s1 model opt",
        "print('pulled', type(model).__name__, tuple(model.weight.shape), type(opt).__name__)",
        "%distributed_pull s1 nothing_here",
        # plain cells share the warm ranks and see nothing of the session
        "%%distributed 2 --cpu --no-dashboard\nprint('plain sees model:', 'model' in globals())",
        "%%distributed 3 --cpu --session s1\npass",
        f"{S1} --env NBTRAIN_PROBE=1 --timeout 60\npass",
        # a plain cell with other options gets ranks of its own; the session's stay, and serve plain cells again
        "%%distributed 1 --cpu --no-dashboard\none = world_size",
        f"{S1} --out -\nprint('still there:', id(model) == built)",
        "%%distributed 2 --cpu --no-dashboard\ntwo = world_size",
        "%distributed_close s1",
        "import psutil\nprint('ranks after close:', sum('nbtrain.rank' in p.cmdline() for p in "
        "psutil.Process().children(recursive=True)))",
        f"{S1}\nprint('after close:', 'model' in globals())",
    ])
    (_, build, in_notebook, train, trained, evaluate, evaluated, _, rebound, seen, failed, after_failure, after,
     listing, _, pulled, not_held, plain, other_ranks, other_options, one_rank, still, plain_again, closed, ranks_left,
     reopened, _) = text
    assert "model in notebook: False" in in_notebook
    assert "trained True" in trained, train
    assert "same True err True Linear" in evaluated, evaluate
    assert "seen (True, 99)" in seen, rebound
    # both ranks raise: whichever reports first is named, the other "raised the same error"
    assert re.search(r"rank [01] raised ValueError: bad step", failed), failed
    assert "Session 's1' keeps the names it held" in failed
    assert "after (99, False, True)" in after, after_failure
    assert "s1: 2 ranks · gloo · cpu · " in listing and "model (Linear)" in listing and "opt (SGD)" in listing
    assert "pulled Linear (1, 4) SGD" in pulled
    assert "Session 's1' holds no 'nothing_here'" in not_held and "model" in not_held
    assert "plain sees model: False" in plain and "(warm)" in plain
    assert "Session 's1' runs on 2 ranks (gloo, cpu), with other options than this cell's: the number of ranks: " \
           "the session's 2, this cell's 3." in other_ranks, other_ranks
    assert "--timeout: the session's 600 s, this cell's 60 s; --env: the session's none, this cell's NBTRAIN_PROBE=1." \
        in other_options, other_options  # each option that differs, by name, with both values
    assert "1 rank · gloo" in one_rank and "(warm)" not in one_rank
    assert "still there: True" in still and "(warm)" in still
    assert "(warm)" in plain_again, plain_again
    assert "session 's1' ended" in closed
    assert "ranks after close: 0" in ranks_left, ranks_left  # its processes stopped with it
    assert "after close: False" in reopened and "(warm)" not in reopened


def test_a_sessions_cells_log_one_curve():
    log = f"{S1}\nimport nbtrain\nfor i in range(3):\n    nbtrain.log(loss=float(rank + i))\n"
    text = run_notebook([
        log, "print('first', history['loss'].steps)",
        log, "print('second', history['loss'].steps, history.series('loss', rank=1).steps[-1])",
        "%%distributed 2 --cpu --no-dashboard\nimport nbtrain\nnbtrain.log(loss=1.0)",  # a plain cell: its own curve
        "print('plain', history['loss'].steps)",
    ])
    assert "first [0, 1, 2]" in text[1], text
    assert "second [0, 1, 2, 3, 4, 5] 5" in text[3], text  # the second cell goes on at step 3, on every rank
    assert "plain [0]" in text[5], text


def test_a_crashed_rank_or_a_stuck_collective_ends_the_session_and_says_so():
    text = run_notebook([
        f"{S1}\nkept = 1",
        f"{S1}\nimport os\nif rank == 1:\n    os._exit(3)",
        f"{S1}\nprint('kept' in globals())",
        f"{S1}\nimport torch.distributed as dist\nif rank == 0:\n    raise RuntimeError('only rank 0')\ndist.barrier()",
        f"{S1}\nprint('kept again' if 'kept' in globals() else 'empty')",
    ])
    _, crashed, restarted, stuck, restarted_again, _ = text
    assert "rank 1 exited with code 3" in crashed and "Session 's1' ended with the ranks" in crashed, crashed
    assert "session 's1' ended earlier (rank 1 exited with code 3" in restarted, restarted
    assert "it starts again, empty\n" in restarted and "False\n" in restarted, restarted
    assert "RuntimeError: only rank 0" in stuck and "Session 's1' ended with the ranks" in stuck, stuck
    assert "Rank 1 was still in the cell 3 s after rank 0 raised — waiting in a collective" in stuck, stuck
    assert "cannot be aborted on gloo without ending its process" in stuck, stuck  # why it could not be kept
    assert "session 's1' ended earlier" in restarted_again and "empty" in restarted_again


@pytest.mark.parametrize("request_, message", [
    (LaunchRequest(session="two words"), "--session takes a short name"),
    (LaunchRequest(session="s1", checkpoint="ck", max_restarts=1), "use one of --session and --max-restarts"),
])
def test_bad_session_options_are_config_errors(request_, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        resolve(request_)


def test_a_session_needs_a_manager_kept_between_calls():
    with pytest.raises(ConfigError, match="pass the same manager="):
        run_source("x = 1", LaunchRequest(nprocs=2, cpu=True, session="s1"), {})
    assert not PoolManager().sessions.live


def test_a_pull_without_names_says_what_the_sessions_hold(shell):
    from IPython.core.error import UsageError

    shell.run_cell("%%distributed 2 --cpu --no-dashboard --session s9 --out -\nnet = 3\nsteps = 10").raise_error()
    try:
        with pytest.raises(UsageError, match=re.escape("takes the session first: %distributed_pull s9 net")):
            shell.run_line_magic("distributed_pull", "net")
        with pytest.raises(UsageError, match=re.escape("Say which names of session 's9' to bring back: "
                                                       "%distributed_pull s9 NAME …; it holds: net, steps.")):
            shell.run_line_magic("distributed_pull", "s9")
        with pytest.raises(UsageError, match=re.escape("'model' is neither a session nor a name one holds. "
                                                       "Sessions: s9 holds net, steps.")):
            shell.run_line_magic("distributed_pull", "model")
    finally:
        shell.run_line_magic("distributed_close", "s9")
