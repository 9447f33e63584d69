"""What killed kernels and agents leave behind is swept — only this user's, and one stuck entry stops nothing.

``/dev/shm`` and ``/tmp`` are shared by every user of a machine: a file named like nbtrain's but owned by
someone else (planted, or theirs) must be left alone, and an entry that cannot be removed must not stop the
sweep (before, either made every node agent of the machine die right after joining). A kernel that JupyterLab
shuts down while it holds emulated nodes leaves nothing: its agents, their logs, its run record, its token.

Any user can create any name in ``/tmp`` and ``/dev/shm`` — a file, a folder, a symlink, a FIFO, with a pid in
its name that is no pid (``99999999999999999999`` once made ``%load_ext nbtrain`` raise ``OverflowError``, and
every later cell said the magic was not found). Such names are planted here by a second Unix user and by this
user, and ``%load_ext``, a node agent's join and a checkpoint's save must go on, remove only this user's
leftovers, and follow no link.
"""

from __future__ import annotations

import glob
import os
import re
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
from helpers.attacker import needs_root as needs_attacker
from helpers.attacker import python_as_attacker
from helpers.kernelhelp import Kernel
from helpers.nodehelp import Nodes
from helpers.workers import assert_no_workers

from nbtrain.kernel.cluster.tokens import sweep_tokens, token_dir
from nbtrain.kernel.observers.registry import read_runs, runs_dir, sweep_records
from nbtrain.common.leftovers import sweep_temp
from nbtrain.rank.train.checkpoint_write import write_atomic
from nbtrain.wire.shm import sweep_orphans

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _make(path: str, folder: bool = False, owner: int | None = None) -> str:
    if folder:
        os.mkdir(path)
    else:
        open(path, "w").close()
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def _remove(*paths: str) -> None:
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.unlink(path)


@needs_root
def test_the_shared_memory_sweep_skips_other_users_files_and_what_it_cannot_remove():
    dead = _dead_pid()
    mine, foreign, stuck = (f"/dev/shm/nbtrain-{dead}-{name}" for name in ("mine", "foreign", "stuck"))
    _make(mine), _make(foreign, owner=NOBODY), _make(stuck, folder=True)
    try:
        sweep_orphans()  # no error, whatever it met
        assert not os.path.exists(mine)
        assert os.path.exists(foreign) and os.path.exists(stuck)
    finally:
        _remove(mine, foreign, stuck)


@pytest.mark.slow  # a real kernel
@needs_root
def test_load_ext_sweeps_what_dead_agents_and_kernels_left_and_nothing_else():
    dead, tmp = _dead_pid(), tempfile.gettempdir()
    swept = [_make(os.path.join(tmp, f"nbtrain-{kind}-{dead}-x"), folder=True) for kind in ("node", "emulated", "ssh")]
    os.makedirs(runs_dir(), exist_ok=True)
    swept.append(_make(os.path.join(runs_dir(), f"kernel-{dead}.json")))
    kept = [_make(os.path.join(tmp, f"nbtrain-node-{dead}-theirs"), folder=True, owner=NOBODY),
            _make(os.path.join(tmp, f"nbtrain-node-{os.getpid()}-alive"), folder=True)]
    kernel = Kernel()
    try:
        kernel.run("%load_ext nbtrain")
        assert not [path for path in swept if os.path.exists(path)]
        assert all(os.path.exists(path) for path in kept)
    finally:
        kernel.shutdown()
        _remove(*swept, *kept)


def _agents_of(join: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if f"--join {join}" in " ".join(p.info["cmdline"] or ())]


@pytest.mark.slow  # a real kernel
def test_what_a_kernel_shut_down_with_emulated_nodes_leaves_is_gone_after_the_next_load_ext():
    """JupyterLab's shutdown gives a kernel 2.5 s before SIGTERM, which runs no cleanup: the agents leave on
    their own (their link breaks) and the next kernel's ``%load_ext nbtrain`` sweeps the rest."""
    kernel = Kernel()
    out = kernel.run("%load_ext nbtrain\n%distributed_nodes --rdzv-host 127.0.0.1 --emulate 2")
    token_file, join = re.search(r"--token-file (\S+)", out).group(1), re.search(r"--join (\S+)", out).group(1)
    deadline = time.monotonic() + 120
    while kernel.run("%distributed_nodes").count("idle") < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    kernel.run("%%distributed --nodes 2 --nproc-per-node 1 --rdzv-host 127.0.0.1 --cpu\nx = 1", timeout=240)
    pid = kernel.pid()
    left = [os.path.join(runs_dir(), f"kernel-{pid}.json"), token_file,
            *glob.glob(os.path.join(tempfile.gettempdir(), f"nbtrain-emulated-{pid}-*"))]
    assert len(left) == 3 and all(os.path.exists(path) for path in left)
    kernel.kc.stop_channels()
    kernel.km.shutdown_kernel(now=False)  # as JupyterLab's "Shut Down Kernel" does
    after = Kernel()
    try:
        after.run("%load_ext nbtrain")
        assert not [path for path in left if os.path.exists(path)]
    finally:
        after.shutdown()
    deadline = time.monotonic() + 15
    while _agents_of(join) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _agents_of(join)
    assert_no_workers(10)


# ------------------------------------------------------------------------------ names anyone can plant

# Creates each "kind|path|target" given: the same code for the attacker (the system's Python, no venv) and this user.
PLANT = """import os, sys
for spec in sys.argv[1:]:
    kind, path, target = spec.split('|')
    if kind == 'file':
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    elif kind == 'folder':
        os.mkdir(path)
    elif kind == 'fifo':
        os.mkfifo(path)
    else:
        os.symlink(target, path)
"""
NOT_PIDS = ("99999999999999999999", "4294967296", "0", "\u0661\u0662\u0663")  # overflows, past any pid, a group, Arabic digits


def _plant(specs: list[tuple[str, str, str]], as_attacker: bool) -> None:
    args = ["|".join(spec) for spec in specs]
    if as_attacker:
        done = python_as_attacker(PLANT, *args)
    else:
        done = subprocess.run([sys.executable, "-I", "-c", PLANT, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


class Planted:
    """Under nbtrain's names in ``folder`` (``name(pid, tag)``): files whose pid is no pid, a FIFO, a folder and a
    symlink to ``victim`` named after a dead process — planted by the attacker and by this user — and one of
    this user's named after a live process."""

    def __init__(self, folder: str, name, victim: str, dead: int, attacker: bool = True) -> None:
        token = secrets.token_hex(3)

        def specs(who: str) -> list[tuple[str, str, str]]:
            entry = lambda pid, tag: os.path.join(folder, name(pid, f"{token}{who}-{tag}"))  # noqa: E731
            return [*(("file", entry(pid, "file"), "") for pid in NOT_PIDS), ("fifo", entry(dead, "fifo"), ""),
                    ("folder", entry(dead, "folder"), ""), ("link", entry(dead, "link"), victim)]

        self.theirs = specs("t") if attacker else []
        self.mine = specs("m")
        self.alive = os.path.join(folder, name(os.getpid(), f"{token}m-alive"))
        self.other_name = os.path.join(folder, f"nbtrain-{token}m-abc")  # no pid where one goes: not nbtrain's
        _plant(self.theirs, as_attacker=True)
        _plant([*self.mine, ("file", self.alive, ""), ("file", self.other_name, "")], as_attacker=False)

    def left(self, specs) -> list[str]:
        return [path for _kind, path, _target in specs if os.path.lexists(path)]

    def remove(self) -> None:
        for _kind, path, _target in [*self.theirs, *self.mine, ("", self.alive, ""), ("", self.other_name, "")]:
            _remove_any(path)


def _remove_any(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


@pytest.fixture
def victim(tmp_path):
    """A file of this user's that planted links point at: a sweep must remove the link, never this."""
    path = tmp_path / "victim"
    path.write_text("mine")
    return str(path)


def _temp_name(pid, tag) -> str:
    return f"nbtrain-node-{pid}-{tag}"


def _shm_name(pid, tag) -> str:
    return f"nbtrain-{pid}-{tag}"


def _assert_swept(planted: Planted, victim: str, folders_stay: bool = False) -> None:
    assert planted.left(planted.theirs) == [p for _k, p, _t in planted.theirs], "another user's entries are theirs"
    kept = [path for kind, path, _t in planted.mine if kind == "folder" and folders_stay]
    assert planted.left(planted.mine) == kept, "this user's entries of no live process go"
    assert os.path.exists(planted.alive) and os.path.exists(planted.other_name)
    assert open(victim).read() == "mine"


@needs_attacker
def test_the_sweeps_pass_over_any_name_planted_in_tmp_and_dev_shm_and_follow_no_link(victim):
    dead = _dead_pid()
    temp = Planted(tempfile.gettempdir(), _temp_name, victim, dead)
    shm = Planted("/dev/shm", _shm_name, victim, dead)
    try:
        assert sweep_temp() >= len(temp.mine)
        sweep_orphans()
        _assert_swept(temp, victim)
        _assert_swept(shm, victim, folders_stay=True)  # shared memory is files: a folder there is not nbtrain's
    finally:
        temp.remove(), shm.remove()


def test_run_records_and_tokens_of_no_pid_are_swept_and_never_listed(victim):
    """The runtime directory is this user's own: only this user puts names there, but a pid in a name or in a
    record is only text (a record's ``-1`` once listed a dead run as live: ``kill(-1, 0)`` succeeds)."""
    dead, token = _dead_pid(), secrets.token_hex(3)
    os.makedirs(runs_dir(), mode=0o700, exist_ok=True)
    tokens = Planted(token_dir(), lambda pid, tag: f"pool-{pid}-{tag.replace('-', '')}.token", victim, dead,
                     attacker=False)
    records = [os.path.join(runs_dir(), f"kernel-{pid}.json") for pid in NOT_PIDS]
    _plant([*(("file", path, "") for path in records), ("link", os.path.join(runs_dir(), f"kernel-{dead}.json"),
                                                           victim)], as_attacker=False)
    forged = os.path.join(runs_dir(), f"forged-{token}.json")
    try:
        for pid in (-1, 0, 99999999999999999999, True):
            with open(forged, "w") as record:
                json.dump({"version": 1, "kernel_pid": pid, "updated": time.time(), "marker": token}, record)
            assert not [run for run in read_runs() if run.get("marker") == token], f"kernel_pid {pid!r} listed"
        sweep_records()
        sweep_tokens()
        assert not [path for path in [*records, f"{runs_dir()}/kernel-{dead}.json"] if os.path.lexists(path)]
        assert tokens.left(tokens.mine) == [] and os.path.exists(tokens.alive)
        assert open(victim).read() == "mine"
    finally:
        tokens.remove()
        for path in (*records, forged, os.path.join(runs_dir(), f"kernel-{dead}.json")):
            _remove_any(path)


@pytest.mark.slow  # a real kernel and its ranks
@needs_attacker
def test_load_ext_and_a_cell_work_whatever_was_planted_in_tmp_and_dev_shm(victim):
    dead = _dead_pid()
    temp = Planted(tempfile.gettempdir(), _temp_name, victim, dead)
    shm = Planted("/dev/shm", _shm_name, victim, dead)
    kernel = Kernel()
    try:
        kernel.run("%load_ext nbtrain")
        assert "total 6" in kernel.run("%%distributed 2 --cpu --keep-alive 0\nimport torch\n"
                                       "print('total', int(torch.tensor(3.0) * world_size))", timeout=240)
        _assert_swept(temp, victim)
        _assert_swept(shm, victim, folders_stay=True)
    finally:
        kernel.shutdown()
        temp.remove(), shm.remove()


@pytest.mark.slow  # a node agent
@needs_attacker
def test_a_node_agent_joins_and_stays_whatever_was_planted_in_tmp_and_dev_shm(victim):
    dead = _dead_pid()
    temp = Planted(tempfile.gettempdir(), _temp_name, victim, dead)
    shm = Planted("/dev/shm", _shm_name, victim, dead)
    nodes = Nodes()
    try:
        agent = nodes.start("127.0.0.1")
        nodes.wait_joined(1)
        time.sleep(3)  # an agent serves once joined: its sweep comes first
        assert agent.poll() is None, nodes.consoles()
        assert len(nodes.hub.live_nodes()) == 1
        _assert_swept(temp, victim)
        _assert_swept(shm, victim, folders_stay=True)
    finally:
        nodes.close()
        temp.remove(), shm.remove()


@needs_attacker
def test_a_save_into_a_shared_folder_neither_fails_nor_hands_the_checkpoint_to_whoever_planted_a_temporary(victim):
    """``--checkpoint /tmp/run`` in a folder others can write: names the save clears or writes are predictable."""
    shared = tempfile.mkdtemp(prefix="nbtrain-test-shared-")
    os.chmod(shared, 0o1777)
    dead, path = _dead_pid(), os.path.join(shared, "checkpoint.pt")
    stale = lambda pid: os.path.join(shared, f".checkpoint.pt.tmp-{pid}")  # noqa: E731  a save's temporary
    theirs = [("file", stale(os.getpid()), ""), ("file", stale(NOT_PIDS[0]), ""), ("link", stale(dead), victim)]
    mine = [("file", stale(NOT_PIDS[0] + "0"), ""), ("file", stale(_dead_pid()), ""),
            ("file", stale(f"0badc0de-{_dead_pid()}"), "")]
    try:
        _plant(theirs, as_attacker=True)
        _plant(mine, as_attacker=False)
        write_atomic({"weights": [1.0, 2.0]}, path)
        assert os.stat(path).st_uid == os.geteuid(), "the checkpoint is this user's file"
        assert torch_load(path) == {"weights": [1.0, 2.0]}
        assert all(os.path.lexists(p) for _k, p, _t in theirs) and os.path.getsize(stale(os.getpid())) == 0
        assert open(victim).read() == "mine"
        assert not [p for _k, p, _t in mine if os.path.lexists(p)], "this user's temporaries of no live save go"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@needs_attacker
def test_a_save_into_a_shared_folder_removes_only_this_users_older_shard_folders_and_history_files(victim):
    """A save clears the shard folders and history files the checkpoint no longer names: in a folder others can
    write, another user's folder under such a name (world-writable, with their shard inside), their history file and
    a link to this user's folder are left; this user's older folder and history file go."""
    from nbtrain.rank.train.superseded import remove, superseded

    shared = tempfile.mkdtemp(prefix="nbtrain-test-shared-")
    os.chmod(shared, 0o1777)
    path = os.path.join(shared, "checkpoint.pt")
    mine_before = tempfile.mkdtemp(prefix="nbtrain-test-mine-")
    theirs = os.path.join(shared, "checkpoint.pt.shards-theirs")
    try:
        done = python_as_attacker(
            "import os, sys\nos.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)\n"
            "open(os.path.join(sys.argv[1], '__0_0.distcp'), 'w').write('their shard')\n"
            "os.symlink(sys.argv[2], sys.argv[3])\n"
            "open(sys.argv[4], 'w').write('their history')\n", theirs, mine_before, path + ".shards-link",
            path + ".history-theirs")
        assert done.returncode == 0, done.stderr
        open(os.path.join(mine_before, "keep"), "w").close()
        os.mkdir(path + ".shards-old")
        os.mkdir(path + ".shards-new")
        for name in (".history-old", ".history-new"):
            open(path + name, "w").close()
        remove(superseded(path, {"checkpoint.pt.shards-new", "checkpoint.pt.history-new"}))
        assert open(os.path.join(theirs, "__0_0.distcp")).read() == "their shard"
        assert open(path + ".history-theirs").read() == "their history"
        assert os.path.islink(path + ".shards-link") and os.path.exists(os.path.join(mine_before, "keep"))
        assert not os.path.exists(path + ".shards-old") and os.path.isdir(path + ".shards-new")
        assert not os.path.exists(path + ".history-old") and os.path.exists(path + ".history-new")
    finally:
        subprocess.run(["rm", "-rf", shared, mine_before])


def torch_load(path: str):
    import torch

    return torch.load(path, weights_only=False)
