"""GPU leases on a shared server: real holder processes, a real second Unix user, planted files (docs/shared-servers.md)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from nbtrain.gpu import leases, nvml
from nbtrain.gpu.devices import DeviceReader
from nbtrain.gpu.leasechoice import Ticket, choose, queue_order
from tests.helpers import fake_nvml
from tests.helpers.attacker import attacker, attacker_python, needs_root, plant, python_as_attacker

HOLD = textwrap.dedent("""
    import sys, time
    from nbtrain.gpu import leases
    lease = leases.take([int(g) for g in sys.argv[1].split(",")], leases.LeaseInfo(notebook="notebooks/llm.ipynb"),
                        directory=sys.argv[2])
    print("held", flush=True)
    time.sleep(600)
""")

# The attacker's lock on a file of its choosing, held until killed (standard library only).
ATTACKER_LOCK = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def shared_dir():
    """A lease directory in /tmp that a second user can reach (the test's tmp_path is private to this user)."""
    path = f"/tmp/nbtrain-leases-test-{secrets.token_hex(4)}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_holder(gpus: str, directory: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, gpus, directory], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    return holder


def start_attacker_lock(path: str) -> subprocess.Popen:
    who = attacker()
    locker = subprocess.Popen([attacker_python(), "-I", "-c", ATTACKER_LOCK, path], stdout=subprocess.PIPE, text=True,
                              user=who.pw_uid, group=who.pw_gid, extra_groups=[], cwd="/", env={"PATH": "/usr/bin"})
    assert locker.stdout.readline().strip() == "locked"
    return locker


def test_gpu_lease_of_a_sigkilled_holder_frees_itself(shared_dir):
    directory = leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    holder = start_holder("0,1", directory)
    try:
        held = leases.held(directory)
        assert [(lease.gpu, lease.pid, lease.notebook, lease.state) for lease in held] == [
            (0, holder.pid, "notebooks/llm.ipynb", leases.LeaseState.BUSY),
            (1, holder.pid, "notebooks/llm.ipynb", leases.LeaseState.BUSY)]
        assert leases.free_gpus([0, 1, 2, 3], directory) == [2, 3]
        with pytest.raises(leases.LeaseBusy, match=r"GPU 1 held by root \(notebooks/llm.ipynb, training since"):
            leases.take([1, 2], directory=directory)
        assert leases.free_gpus([0, 1, 2, 3], directory) == [2, 3]  # the refused take left nothing behind
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert leases.held(directory) == []
    with leases.take([0, 1], directory=directory):
        assert [held.gpu for held in leases.held(directory)] == [0, 1]
        assert len(os.listdir(directory)) == 2  # the killed holder's files were swept by this user's take
    assert leases.held(directory) == [] and os.listdir(directory) == []


def test_gpu_lease_directory_is_sticky_and_world_writable(shared_dir):
    directory = leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    assert oct(os.stat(directory).st_mode & 0o7777) == oct(0o1777)


@needs_root
def test_gpu_lease_another_user_can_neither_remove_nor_forge_a_lease(shared_dir, capsys):
    directory = leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    with leases.take([0], directory=directory):
        (path,) = [lease.path for lease in leases.held(directory)]
        removed = python_as_attacker("import os, sys; os.unlink(sys.argv[1])", path)
        assert "PermissionError" in removed.stderr
        overwritten = python_as_attacker("import sys; open(sys.argv[1], 'w').write('{}')", path)
        assert "PermissionError" in overwritten.stderr
        assert [lease.path for lease in leases.held(directory)] == [path]
    # A file named as root's lease on GPU 1, made and locked by the attacker: not a lease of root's.
    forged = plant(os.path.join(directory, f"gpu-1-0-{secrets.token_hex(8)}.lease"), b'{"user": "root"}')
    # root's own stale lease on GPU 2 (its holder died), locked again by the attacker: not held by root.
    stale = os.path.join(directory, f"gpu-2-0-{secrets.token_hex(8)}.lease")
    with open(stale, "w") as file:
        file.write('{"user": "root"}')
    lockers = [start_attacker_lock(forged), start_attacker_lock(stale)]
    try:
        assert leases.held(directory) == []
        assert leases.free_gpus([0, 1, 2], directory) == [0, 1, 2]
        assert f"{forged} in the GPU lease directory: its name says uid 0 but nbtrain-attacker owns it" in capsys.readouterr().err
    finally:
        for locker in lockers:
            locker.kill()
            locker.wait()


@needs_root
def test_gpu_lease_files_planted_by_another_user_are_passed_over_and_reported_once(shared_dir, capsys):
    directory = leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    uid = attacker().pw_uid
    plant(os.path.join(directory, "gpu-0-notalease"))
    plant(os.path.join(directory, f"gpu-99999999999999999999-{uid}-{secrets.token_hex(8)}.lease"))
    garbage = plant(os.path.join(directory, f"gpu-3-{uid}-{secrets.token_hex(8)}.lease"), b"\xff{[" * 5000)
    link = os.path.join(directory, f"gpu-4-{uid}-{secrets.token_hex(8)}.lease")
    fifo = os.path.join(directory, f"gpu-5-{uid}-{secrets.token_hex(8)}.lease")
    made = python_as_attacker("import os, sys; os.symlink('/etc/shadow', sys.argv[1]); os.mkfifo(sys.argv[2])", link, fifo)
    assert made.returncode == 0, made.stderr
    locker = start_attacker_lock(garbage)
    try:
        with leases.take([1], directory=directory):
            for _ in range(2):
                held = leases.held(directory)
                assert [(lease.gpu, lease.user, lease.notebook, lease.since) for lease in held] == [
                    (1, "root", None, held[0].since), (3, "nbtrain-attacker", None, None)]  # garbage: shown bare
        assert leases.free_gpus([0, 1, 2, 3, 4, 5], directory) == [0, 1, 2, 4, 5]
    finally:
        locker.kill()
        locker.wait()
    err = capsys.readouterr().err
    for name, why in [("gpu-0-notalease", "its name is not a lease's"), (os.path.basename(link), "cannot be opened"),
                      (os.path.basename(fifo), "not a plain file")]:
        assert err.count(f"{name} in the GPU lease directory") == 1 and why in err, err


@needs_root
def test_gpu_lease_directory_made_first_by_another_user_is_refused_naming_the_fix(shared_dir):
    python_as_attacker("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o1777)", shared_dir)
    with pytest.raises(leases.LeaseDirError, match=r"belongs to nbtrain-attacker, who could remove other users' "
                                                   r"leases; .*sudo install -d -m 1777 -o root"):
        leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    os.rmdir(shared_dir)
    os.mkdir(shared_dir, 0o777)
    os.chmod(shared_dir, 0o777)  # not sticky: anyone could remove anyone's lease
    with pytest.raises(leases.LeaseDirError, match="has mode 777, not 1777"):
        leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    os.rmdir(shared_dir)
    os.symlink("/tmp", shared_dir)
    with pytest.raises(leases.LeaseDirError, match="is not a directory"):
        leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    os.unlink(shared_dir)


def test_shared_server_auto_choice_picks_free_close_gpus_or_says_who_holds_the_rest(shared_dir, monkeypatch):
    gib = 2**30
    boards = [fake_nvml.FakeGpu(processes=[]) for _ in range(8)]
    boards[5] = fake_nvml.FakeGpu(processes=[(4242, 38 * gib)])  # carol's plain script
    boards[6] = fake_nvml.FakeGpu(processes=[(7777, 30 * gib)])  # a rank of a run nbtrain knows
    fake_nvml.install(monkeypatch, boards)
    gpus = DeviceReader().read()
    directory = leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    holder = start_holder("0,1,2,3,4,7", directory)
    try:
        held = leases.held(directory)
        owner = {4242: ("carol", "python rank/train.py")}.get
        choice = choose(1, gpus, held, known_pids={7777}, owner_of=owner)
        assert choice.gpus == (6,) and choice.account == ""
        waiting = choose(4, gpus, held, known_pids={7777}, owner_of=owner)
        assert waiting.gpus == ()
        assert waiting.account.startswith("waiting for 4 GPUs (1 free): GPU 0\u20134 held by root "
                                          "(notebooks/llm.ipynb, training since ")
        assert ", GPU 7 held by root (notebooks/llm.ipynb, training since " in waiting.account
        assert waiting.account.endswith("GPU 5 by a process of carol's (python rank/train.py, 38 GiB)")
    finally:
        holder.kill()
        holder.wait()
    # The leases freed with their holder: of the free GPUs, the two close in topology are preferred to the lowest.
    near = {frozenset((6, 7)): 1}
    choice = choose(2, gpus, leases.held(directory), known_pids={7777}, owner_of=owner,
                    distance=lambda a, b: near.get(frozenset((a, b)), 3))
    assert choice.gpus == (6, 7)
    assert nvml.library() is not None


def test_shared_server_queue_lets_each_users_first_request_go_before_anyones_second():
    alice1, alice2, alice3 = Ticket(1000, 1.0, "a1"), Ticket(1000, 2.0, "a2"), Ticket(1000, 3.0, "a3")
    bob1, carol1, bob2 = Ticket(1001, 4.0, "b1"), Ticket(1002, 5.0, "c1"), Ticket(1001, 6.0, "b2")
    order = queue_order([bob2, alice3, carol1, alice1, bob1, alice2])
    assert [ticket.name for ticket in order] == ["a1", "b1", "c1", "a2", "b2", "a3"]


@pytest.mark.slow
def test_gpu_lease_shows_in_gpus_under_a_real_kernel(shared_dir, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec_dir = tmp_path / "jupyter" / "kernels" / "nbtrain-leases-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "nbtrain test", "language": "python",
        "env": {"PYTHONPATH": root, "NBTRAIN_LEASE_DIR": shared_dir}}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    directory = leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    holder = start_holder("2,3", directory)
    try:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("%load_ext nbtrain"), nbformat.v4.new_code_cell("%gpus --once")]
        nbclient.NotebookClient(nb, kernel_name="nbtrain-leases-test", timeout=120).execute()
    finally:
        holder.kill()
        holder.wait()
    shown = "".join(output.get("text", "") for output in nb.cells[1].outputs if output.output_type == "stream")
    assert re.search(r"^GPU 2 leased by root \(llm\.ipynb, since \d\d:\d\d, busy\)$", shown, re.M), shown
    assert re.search(r"^GPU 3 leased by root \(llm\.ipynb, since \d\d:\d\d, busy\)$", shown, re.M), shown


@pytest.mark.parametrize("gpus", [[], [-1], [10_000], [0, 0], ["0"], [True]])
def test_gpu_lease_of_no_gpu_index_is_refused_saying_what_to_pass(shared_dir, gpus):
    directory = leases.lease_dir({"NBTRAIN_LEASE_DIR": shared_dir})
    with pytest.raises(ValueError, match=r"GPUs to lease must be distinct indices from 0 to 9999, as nvidia-smi "
                                         r"numbers them \(got .*\): pass e.g. \[0, 1\]"):
        leases.take(gpus, directory=directory)
    assert os.listdir(directory) == []


def test_shared_server_auto_choice_counts_used_memory_where_nvml_lists_no_processes(monkeypatch):
    gib = 2**30
    fake_nvml.install(monkeypatch, [fake_nvml.FakeGpu(processes=None, used=38 * gib),  # a container hides them
                                    fake_nvml.FakeGpu(processes=None, used=gib // 4),
                                    fake_nvml.FakeGpu(processes=[])])
    gpus = DeviceReader().read()
    assert choose(2, gpus, [], known_pids=set(), owner_of=lambda pid: ("?", "?")).gpus == (1, 2)
    waiting = choose(3, gpus, [], known_pids=set(), owner_of=lambda pid: ("?", "?"))
    assert waiting.account == "waiting for 3 GPUs (2 free): GPU 0 by processes NVML does not list (38 GiB used)"


def test_shared_server_gpus_auto_takes_gpus_close_in_nvml_topology_before_the_lowest(shared_dir, monkeypatch):
    """Two ranks asking for any two GPUs get two under one PCIe switch, or joined by NVLink, as NVML tells."""
    from nbtrain.kernel.lifecycle.gpulease import lease_gpus
    from nbtrain.kernel.ranks.spec import PoolSpec

    monkeypatch.setenv("NBTRAIN_LEASE_DIR", shared_dir)
    boards = [fake_nvml.FakeGpu(processes=[], uuid=f"GPU-{i}", switch=i % 2) for i in range(4)]  # 0, 2 | 1, 3
    fake_nvml.install(monkeypatch, boards)
    spec = PoolSpec(nprocs=2, backend="nccl", device_type="cuda", gpu_ids=(), timeout_s=60.0, gpu_count=2)
    leased, lease = lease_gpus(spec, 0, print)
    try:
        assert leased.gpu_ids == (0, 2)  # not (0, 1): those two are under different switches
    finally:
        lease.release()
    boards[1].nvlink_peers, boards[3].nvlink_peers = (3,), (1,)  # 1 and 3 joined by NVLink: nearer still
    fake_nvml.install(monkeypatch, boards)
    leased, lease = lease_gpus(spec, 0, print)
    lease.release()
    assert leased.gpu_ids == (1, 3)
