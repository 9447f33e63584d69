"""Runs on a shared GPU server take GPU leases: real kernels on a stand-in 4-GPU machine (docs/shared-servers.md).

The stand-in NVML (``helpers.fake_nvml``, in each kernel's process) only decides the GPU indices. This machine has no
GPU, so each kernel is told its PyTorch has no CUDA: the path of a CPU-only PyTorch on a GPU server, where the ranks
run on the CPU with gloo and hold the leases of the GPUs they were given.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import textwrap
import time

import pytest
from helpers import fake_nvml
from helpers.attacker import attacker, attacker_python, needs_root
from helpers.kernelhelp import Kernel

from nbtrain.gpu import leases

pytestmark = pytest.mark.slow

FOUR_GPUS = [{"uuid": f"GPU-{index}", "processes": []} for index in range(4)]
# A cell that holds its GPUs until the test removes its go-on file; `visible` is what its ranks were given.
HOLDING = ("%%distributed 2 --gpus auto --keep-alive 0\n"
           "import os, time\nvisible = os.environ['CUDA_VISIBLE_DEVICES']\n"
           "while os.path.exists({hold!r}):\n    time.sleep(0.02)\n")
NO_CUDA = "from nbtrain.kernel.request import config\nconfig._torch_has_cuda = lambda: False\n"
QUICK = ("%%distributed 2 --gpus auto --keep-alive 0{extra}\n"
         "import os, time\nvisible = os.environ['CUDA_VISIBLE_DEVICES']\nstarted = time.time()\n")


# Another user's run holding GPU argv[2] (standard library only, as that user has no nbtrain).
ANOTHER_USERS_LEASE = textwrap.dedent("""
    import fcntl, json, os, secrets, sys, time
    path = os.path.join(sys.argv[1], f"gpu-{sys.argv[2]}-{os.geteuid()}-{secrets.token_hex(8)}.lease")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"notebook": "notebooks/bob.ipynb", "since": time.time(), "state": "busy"}).encode())
    print("held", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def shared_machine(monkeypatch, tmp_path):
    """Kernels started in the test see four stand-in GPUs and a lease directory of their own."""
    directory = f"/tmp/nbtrain-leases-test-{secrets.token_hex(4)}"
    for name, value in fake_nvml.process_env(FOUR_GPUS).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NBTRAIN_LEASE_DIR", directory)
    monkeypatch.setenv("NBTRAIN_POLICY", str(tmp_path / "policy.toml"))  # none until a test writes it
    yield leases.lease_dir({"NBTRAIN_LEASE_DIR": directory})
    shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def kernels(*notebooks: str):
    started = []
    try:
        for notebook in notebooks:
            started.append(Kernel(notebook=notebook))
            started[-1].run("%load_ext nbtrain")
            started[-1].run(NO_CUDA)
        yield started
    finally:
        for kernel in started:
            with contextlib.suppress(Exception):
                kernel.shutdown()


def leased_by(directory: str, pid: int) -> list[int]:
    return [lease.gpu for lease in leases.held(directory) if lease.pid == pid]


def wait_for(condition, timeout: float = 60.0, poll: float = 0.01):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(poll)
    return found


def hold_file(tmp_path, name: str) -> str:
    path = str(tmp_path / name)
    open(path, "w").close()
    return path


def test_shared_server_two_kernels_get_disjoint_gpus_and_a_third_waits_in_turn(shared_machine, tmp_path):
    first_hold, second_hold = hold_file(tmp_path, "first"), hold_file(tmp_path, "second")
    with kernels("notebooks/llm.ipynb", "notebooks/vision.ipynb", "notebooks/third.ipynb") as (first, second, third):
        first_cell = first.start(HOLDING.format(hold=first_hold))
        first_gpus = wait_for(lambda: len(leased_by(shared_machine, first.pid())) == 2 and leased_by(shared_machine, first.pid()))
        second_cell = second.start(HOLDING.format(hold=second_hold))
        second_gpus = wait_for(lambda: len(leased_by(shared_machine, second.pid())) == 2 and leased_by(shared_machine, second.pid()))
        assert sorted(first_gpus + second_gpus) == [0, 1, 2, 3]
        held = {lease.gpu: lease for lease in leases.held(shared_machine)}
        assert held[first_gpus[0]].notebook == "notebooks/llm.ipynb"
        assert held[first_gpus[0]].state is leases.LeaseState.BUSY
        assert held[first_gpus[0]].kernel_id and held[first_gpus[0]].kernel_id in first.km.connection_file

        third_cell = third.start(QUICK.format(extra=""))
        _, said = third.collect(third_cell, 60, until=lambda text: "held by" in text and "\n" in text, poll=0.05)
        assert re.search(r"waiting for 2 GPUs \(0 free\): GPU 0\u20131 held by root \(notebooks/llm.ipynb, training "
                         r"since \d\d:\d\d\), GPU 2\u20133 held by root \(notebooks/vision.ipynb, training since", said), said
        assert leased_by(shared_machine, third.pid()) == []

        os.unlink(first_hold)  # the first cell ends; its pool stops (--keep-alive 0) and gives its GPUs back
        wait_for(lambda: leased_by(shared_machine, first.pid()) == [], poll=0.002)
        released, released_at = time.monotonic(), time.time()
        third_gpus = wait_for(lambda: len(leased_by(shared_machine, third.pid())) == 2  # taken a file at a time
                              and leased_by(shared_machine, third.pid()), poll=0.002)
        queue_s = time.monotonic() - released
        assert sorted(third_gpus) == sorted(first_gpus)
        assert queue_s < 2.0, queue_s
        reply, _ = third.collect(third_cell, 120)
        assert reply["status"] == "ok"
        assert third.run("print(visible)").strip() == ",".join(map(str, sorted(first_gpus)))
        cell_started_s = float(third.run("print(started)")) - released_at  # rank 0's first line of the cell
        print(f"release to the queued cell's first line: {cell_started_s * 1000:.0f} ms")
        assert first.collect(first_cell, 60)[0]["status"] == "ok"
        os.unlink(second_hold)
        assert second.collect(second_cell, 60)[0]["status"] == "ok"
        print(f"release to the next queued lease: {queue_s * 1000:.0f} ms")
    assert leases.held(shared_machine) == []


def test_shared_server_no_wait_fails_at_once_and_the_stop_button_leaves_the_queue(shared_machine, tmp_path):
    hold = hold_file(tmp_path, "hold")
    with kernels("notebooks/llm.ipynb", "notebooks/other.ipynb") as (holder, other):
        held_cell = holder.start(HOLDING.format(hold=hold).replace("%%distributed 2", "%%distributed 4"))
        wait_for(lambda: len(leased_by(shared_machine, holder.pid())) == 4)

        began = time.monotonic()
        reply, said = other.execute(QUICK.format(extra=" --no-wait"), timeout=60)
        assert reply["status"] == "error" and time.monotonic() - began < 10
        assert "waiting for 2 GPUs (0 free): GPU 0\u20133 held by root (notebooks/llm.ipynb, training since" in said
        assert "--no-wait: the cell did not wait" in said

        began = time.monotonic()
        reply, said = other.execute(QUICK.format(extra=" --gpu-timeout 1"), timeout=60)
        assert reply["status"] == "error" and 1.0 <= time.monotonic() - began < 10
        assert "Waited 1 s (--gpu-timeout); the cell did not run" in said

        cell = other.start(QUICK.format(extra=""))
        other.collect(cell, 60, until=lambda text: "held by" in text, poll=0.05)
        assert [name for name in os.listdir(shared_machine) if name.endswith(".ticket")]  # its place in the queue
        pressed = time.monotonic()
        other.km.interrupt_kernel()
        reply, said = other.collect(cell, 30)
        left_s = time.monotonic() - pressed
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", said
        assert left_s < 2.0, left_s
        assert not [name for name in os.listdir(shared_machine) if name.endswith(".ticket")]
        assert "NameError" in other.execute("visible")[1]  # the cell never ran
        os.unlink(hold)
        assert holder.collect(held_cell, 60)[0]["status"] == "ok"

        (tmp_path / "policy.toml").write_text("max_gpus_per_user = 1\n")  # the administrator's limit, read by each run
        reply, said = other.execute(QUICK.format(extra=""), timeout=60)
        assert reply["status"] == "error"
        assert "lets each user hold 1 GPU at once; this cell asks for 2. Ask for fewer." in said


def test_shared_server_a_sigkilled_kernels_gpu_lease_frees_itself(shared_machine, tmp_path):
    hold = hold_file(tmp_path, "hold")
    with kernels("notebooks/llm.ipynb", "notebooks/next.ipynb") as (doomed, survivor):
        doomed.run(QUICK.format(extra="").replace(" --keep-alive 0", ""))  # warm ranks keep their GPUs between cells
        assert [(lease.gpu, lease.state) for lease in leases.held(shared_machine)] == [
            (0, leases.LeaseState.IDLE_WARM), (1, leases.LeaseState.IDLE_WARM)]
        doomed.start(HOLDING.format(hold=hold).replace("%%distributed 2", "%%distributed 4"))
        wait_for(lambda: len(leased_by(shared_machine, doomed.pid())) == 4)
        os.kill(doomed.pid(), signal.SIGKILL)
        wait_for(lambda: leases.held(shared_machine) == [], timeout=10)
        reply, said = survivor.execute(QUICK.format(extra=" --no-wait"), timeout=120)
        assert reply["status"] == "ok", said


@needs_root
def test_shared_server_pinning_a_gpu_another_user_leases_is_refused_naming_them(shared_machine):
    who = attacker()
    other = subprocess.Popen([attacker_python(), "-I", "-c", ANOTHER_USERS_LEASE, shared_machine, "1"],
                             stdout=subprocess.PIPE, text=True, user=who.pw_uid, group=who.pw_gid, extra_groups=[],
                             cwd="/", env={"PATH": "/usr/bin"})
    try:
        assert other.stdout.readline().strip() == "held"
        with kernels("notebooks/llm.ipynb") as (kernel,):
            began = time.monotonic()
            reply, said = kernel.execute(QUICK.format(extra="").replace("--gpus auto", "--gpus 0,1"), timeout=60)
            assert reply["status"] == "error" and time.monotonic() - began < 10
            assert f"GPU 1 held by {who.pw_name} (notebooks/bob.ipynb, training since" in said
            assert "--gpus 0,1: another user leases one of these GPUs; ask them, or use --gpus auto" in said
            assert leases.held(shared_machine)[0].uid == who.pw_uid and len(leases.held(shared_machine)) == 1
            kernel.run(QUICK.format(extra=""))  # auto passes over the leased GPU
            assert kernel.run("print(visible)").strip() == "0,2"
            for _ in range(2):  # a session's next cell runs on the GPUs auto chose for its first
                kernel.run(QUICK.format(extra=" --session s"))
            assert kernel.run("print(visible)").strip() == "0,2"
            kernel.run("%distributed_close s")
    finally:
        other.kill()
        other.wait()


def _until(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)


def test_shared_server_idle_warm_ranks_give_their_gpus_back_and_the_next_cell_says_why(shared_machine, tmp_path):
    (tmp_path / "policy.toml").write_text("idle_release_s = 1\n")  # the administrator's --keep-alive default
    with kernels("notebooks/a.ipynb") as (kernel,):
        kernel.run("%%distributed 2 --gpus auto\nimport os\nvisible = os.environ['CUDA_VISIBLE_DEVICES']\n")
        assert leased_by(shared_machine, kernel.pid()) == [0, 1]
        _until(lambda: not leased_by(shared_machine, kernel.pid()))  # after 1 s without a cell
        again = kernel.run("%%distributed 2 --gpus auto\nimport os\nvisible = os.environ['CUDA_VISIBLE_DEVICES']\n")
        assert "nbtrain: the warm ranks were stopped after 1 s without a cell (--keep-alive), giving their GPUs " \
               "back; started fresh ranks" in again


def test_shared_server_an_idle_session_is_offered_then_closed_by_the_policy_not_silently(shared_machine, tmp_path):
    (tmp_path / "policy.toml").write_text("session_release_s = 4\n")
    with kernels("notebooks/a.ipynb") as (kernel,):
        ran = kernel.run("%%distributed 2 --gpus auto --session s1 --keep-alive 1\nweights = [1, 2, 3]\n")
        time.sleep(2.0)  # past --keep-alive: a plain cell's ranks would have gone
        assert leased_by(shared_machine, kernel.pid()) == [0, 1]  # a session is not released without its user
        offered = ran + "".join(_iopub_text(kernel, 3.0))  # on a loaded machine the offer may come with the cell's end
        assert "nbtrain: session s1 keeps GPU 0, 1 while idle; %distributed_close s1 gives them back; the server " \
               "closes idle sessions after 4 s" in offered
        _until(lambda: not leased_by(shared_machine, kernel.pid()))
        closed = "".join(_iopub_text(kernel, 1.0))
        assert "nbtrain: session s1 closed after 4 s without a cell (the administrator's session_release_s)" in offered + closed
        listed = kernel.run("%distributed_sessions")
        assert "s1" not in listed


def _iopub_text(kernel, seconds: float) -> list[str]:
    """What the kernel printed, whichever cell it is shown under, for ``seconds``."""
    from helpers.outputs import output_text

    texts, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.1)
        except Exception:
            continue
        texts.append(output_text(msg["msg_type"], msg["content"]))
    return texts


def test_shared_server_reserved_gpus_go_only_to_their_users(shared_machine, tmp_path):
    (tmp_path / "policy.toml").write_text('reserved_gpus = [0, 1]\nreserved_for = ["teacher"]\n')
    with kernels("notebooks/a.ipynb") as (kernel,):
        kernel.run(QUICK.format(extra=""))
        assert kernel.run("print(visible)").strip() == "2,3"  # auto passes over the teacher's GPUs
        reply, out = kernel.execute("%%distributed 2 --gpus 0,1 --keep-alive 0\nx = 1\n")
        assert reply["status"] == "error"
        assert "GPU 0, 1 are reserved for teacher by the administrator's policy" in out
