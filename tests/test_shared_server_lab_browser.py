"""A shared server in the JupyterLab panel (real JupyterLab, headless Chromium): each GPU says who holds it — this
user's own lease and a real second Unix user's — and the queue says who waits, first in line first.

The server sees four stand-in GPUs (the stand-in NVML, as the GPU tests use) and a lease directory of the test's
own. The second user's lease is a file that user made and holds locked, as its kernel would; its notebook sits in
a folder the panel must not show to anyone else. Needs root (to act as the second user) and the system Chromium.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import textwrap
import time
import urllib.error

import pytest
from helpers.attacker import attacker, attacker_python, needs_root
from helpers.fake_nvml import process_env
from helpers.labhelp import lab_page
from nbtrain.gpu import leases
from nbtrain.gpu.leasequeue import WaitTicket

pytestmark = [needs_root, pytest.mark.slow, pytest.mark.timeout(240)]

# The second user's kernel holding GPU 2 (standard library only: the lease file format, made and locked).
THEIR_LEASE = textwrap.dedent("""
    import fcntl, json, os, secrets, sys, time
    path = os.path.join(sys.argv[1], f"gpu-2-{os.geteuid()}-{secrets.token_hex(8)}.lease")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"user": "x", "notebook": "secret-project/llm.ipynb", "kernel_id": "k", "pid": os.getpid(),
                             "since": time.time(), "state": "busy"}).encode())
    print("held", flush=True)
    time.sleep(600)
""")
BOARDS = [{"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{index}-lab"} for index in range(4)]


@pytest.fixture
def shared_dir():
    """A lease directory both users reach (the kernels' is /dev/shm/nbtrain-leases)."""
    path = f"/tmp/nbtrain-leases-lab-{secrets.token_hex(4)}"
    os.mkdir(path, 0o1777)
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _their_lease(directory: str) -> subprocess.Popen:
    who = attacker()
    holder = subprocess.Popen([attacker_python(), "-I", "-c", THEIR_LEASE, directory], stdout=subprocess.PIPE,
                              text=True, user=who.pw_uid, group=who.pw_gid, extra_groups=[], cwd="/",
                              env={"PATH": "/usr/bin"})
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_shared_server_panel_shows_each_gpus_holder_and_the_queue(tmp_path, shared_dir, monkeypatch):
    monkeypatch.setenv("NBTRAIN_LEASE_DIR", shared_dir)
    mine = leases.take([0, 1], leases.LeaseInfo(notebook="notebooks/mnist.ipynb", state=leases.LeaseState.IDLE_WARM),
                       directory=shared_dir)
    theirs = _their_lease(shared_dir)
    waiting = WaitTicket(shared_dir)
    try:
        with lab_page(tmp_path, "shared.ipynb", ["1 + 1"], {"width": 1400, "height": 900}) as (lab, page):
            answer = lab.api("GET", "nbtrain/gpus")
            assert [(lease["gpu"], lease["mine"]) for lease in answer["leases"]] == [(0, True), (1, True), (2, False)]
            assert answer["leases"][2]["notebook"] == "llm.ipynb"  # another user's: the file's name, not its folder
            for gpu, why in ((2, "GPU 2 holds no lease of yours (it is nbtrain-attacker's)"),
                             (0, "is leased by process")):  # another user's; and one of no kernel of this server
                with pytest.raises(urllib.error.HTTPError) as refused:
                    lab.api("POST", "nbtrain/leases/release", {"gpu": gpu})
                assert why in json.loads(refused.value.read())["message"]
            assert len(lab.api("GET", "nbtrain/gpus")["leases"]) == 3  # nothing given back
            assert len(answer["gpus"]) == 4, answer
            page.goto(f"{lab.url}/lab/tree/shared.ipynb?reset&token={lab.token}")
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
            page.locator("#nbtrain-status").click()
            panel = page.locator("#nbtrain-panel")
            devices = panel.locator(".nbtrain-Device")
            page.wait_for_function("document.querySelectorAll('#nbtrain-panel .nbtrain-Device').length == 4",
                                   timeout=30_000)
            held = [devices.nth(i).locator(".nbtrain-Device-lease") for i in range(4)]
            mine_text = re.compile(r"^leased: you · notebooks/mnist\.ipynb · warm since \d\d:\d\d$")
            for row in held[:2]:
                assert mine_text.match(row.inner_text()), row.inner_text()
            assert re.match(r"^leased: nbtrain-attacker · llm\.ipynb · training since \d\d:\d\d$", held[2].inner_text())
            assert "secret-project" not in panel.inner_text()
            assert not held[3].is_visible()  # a free GPU says nothing
            note = panel.locator(".nbtrain-Devices .nbtrain-Note")
            assert re.match(r"^1 run waits for GPUs: you \(since \d\d:\d\d\)$", note.inner_text()), note.inner_text()
            waiting.leave()  # its turn came: the line goes at the next refresh
            deadline = time.monotonic() + 15
            while note.is_visible() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not note.is_visible()
    finally:
        waiting.leave()
        mine.release()
        theirs.kill()
        theirs.wait()


@pytest.fixture(autouse=True)
def _stand_in_gpus_for_the_lab(monkeypatch):
    """The lab's server process gets the stand-in NVML over four boards (its ``import pynvml``)."""
    for name, value in process_env(BOARDS).items():
        monkeypatch.setenv(name, value)


WARM_CELLS = ["%load_ext nbtrain",
              "from nbtrain.kernel.request import config\nconfig._torch_has_cuda = lambda: False  # ranks on the CPU",
              "%%distributed 2 --gpus auto\nx = 1"]


def test_shared_server_panel_gives_back_the_gpus_of_this_users_idle_warm_ranks(tmp_path, shared_dir, monkeypatch):
    monkeypatch.setenv("NBTRAIN_LEASE_DIR", shared_dir)
    with lab_page(tmp_path, "warm.ipynb", WARM_CELLS, {"width": 1400, "height": 900}) as (lab, page):
        page.goto(f"{lab.url}/lab/tree/warm.ipynb?reset&token={lab.token}")
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
        for _ in WARM_CELLS:
            page.keyboard.press("Shift+Enter")
        deadline = time.monotonic() + 90
        while [(lease["gpu"], lease["state"]) for lease in lab.api("GET", "nbtrain/gpus")["leases"]] != \
                [(0, "idle-warm"), (1, "idle-warm")]:
            assert time.monotonic() < deadline, lab.api("GET", "nbtrain/gpus")["leases"]
            time.sleep(0.5)
        page.locator("#nbtrain-status").click()
        give_back = page.locator("#nbtrain-panel .nbtrain-Device").nth(0).locator(".nbtrain-Release")
        give_back.wait_for(state="visible", timeout=30_000)
        assert not page.locator("#nbtrain-panel .nbtrain-Device").nth(2).locator(".nbtrain-Release").is_visible()
        give_back.click()
        deadline = time.monotonic() + 30
        while lab.api("GET", "nbtrain/gpus")["leases"]:  # the kernel's warm ranks stopped: both leases gone
            assert time.monotonic() < deadline, "the GPUs were not given back"
            time.sleep(0.3)
        give_back.wait_for(state="hidden", timeout=15_000)
