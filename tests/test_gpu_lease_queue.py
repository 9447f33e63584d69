"""The first-come queue of runs waiting for GPUs: ticket files, a real second Unix user (docs/shared-servers.md)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers.attacker import attacker, attacker_python, needs_root, plant, python_as_attacker

from nbtrain.gpu import leases
from nbtrain.gpu.leasequeue import WaitTicket, waiting
from nbtrain.kernel.lifecycle.gpulease import GpusNotFree, lease_gpus
from nbtrain.kernel.ranks.spec import PoolSpec

# The other user's lock on a file of theirs, held until killed (standard library only).
LOCK = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def shared_dir():
    path = f"/tmp/nbtrain-leases-test-{secrets.token_hex(4)}"
    yield leases.lease_dir({"NBTRAIN_LEASE_DIR": path})
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_gpu_lease_queue_is_first_come_and_counts_only_tickets_their_owner_holds(shared_dir):
    who = attacker()
    with WaitTicket(shared_dir) as first:
        assert first.ahead() == []
        with WaitTicket(shared_dir) as second:
            assert [ticket.name for ticket in second.ahead()] == [first.name]
        assert [ticket.name for ticket in waiting(shared_dir)] == [first.name]  # the second left the queue
        # Another user's ticket nobody holds, and one named as root's: neither is a place in the queue.
        plant(os.path.join(shared_dir, f"wait-{who.pw_uid}-{'a' * 16}.ticket"))
        forged = plant(os.path.join(shared_dir, f"wait-0-{'b' * 16}.ticket"))
        locker = subprocess.Popen([attacker_python(), "-I", "-c", LOCK, forged], stdout=subprocess.PIPE, text=True,
                                  user=who.pw_uid, group=who.pw_gid, extra_groups=[], cwd="/", env={"PATH": "/usr/bin"})
        try:
            assert locker.stdout.readline().strip() == "locked"
            with WaitTicket(shared_dir) as late:
                assert [ticket.name for ticket in late.ahead()] == [first.name]
        finally:
            locker.kill()
            locker.wait()
        # The other user's own ticket, held: a real place, after the first.
        theirs = plant(os.path.join(shared_dir, f"wait-{who.pw_uid}-{'c' * 16}.ticket"))
        locker = subprocess.Popen([attacker_python(), "-I", "-c", LOCK, theirs], stdout=subprocess.PIPE, text=True,
                                  user=who.pw_uid, group=who.pw_gid, extra_groups=[], cwd="/", env={"PATH": "/usr/bin"})
        try:
            assert locker.stdout.readline().strip() == "locked"
            with WaitTicket(shared_dir) as mine:
                assert [(ticket.uid, ticket.name) for ticket in mine.ahead()] == [
                    (0, first.name), (who.pw_uid, os.path.basename(theirs))]
        finally:
            locker.kill()
            locker.wait()
    assert waiting(shared_dir) == []
    assert leases.held(shared_dir) == []  # tickets are not leases, and are not reported as strangers either


@needs_root
def test_gpu_lease_directory_made_first_by_another_user_refuses_the_cell_naming_the_fix(monkeypatch):
    path = f"/tmp/nbtrain-leases-test-{secrets.token_hex(4)}"
    python_as_attacker("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o1777)", path)
    monkeypatch.setenv("NBTRAIN_LEASE_DIR", path)
    try:
        with pytest.raises(GpusNotFree, match=r"belongs to nbtrain-attacker, who could remove other users' leases; "
                                              r".*sudo install -d -m 1777 -o root .*The cell did not run"):
            lease_gpus(PoolSpec(nprocs=1, backend="gloo", device_type="cpu", gpu_ids=(0,), timeout_s=60.0), None, print)
        assert os.listdir(path) == []  # nothing of the user's was put in the other user's directory
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_gpu_lease_queue_a_sigkilled_waiter_leaves_it_and_its_ticket_is_swept(shared_dir):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, time\nfrom nbtrain.gpu.leasequeue import WaitTicket\nticket = WaitTicket(sys.argv[1])\n"
            "print(ticket.name, flush=True)\ntime.sleep(600)\n")
    waiter = subprocess.Popen([sys.executable, "-c", code, shared_dir], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    name = waiter.stdout.readline().strip()
    with WaitTicket(shared_dir) as mine:
        assert [ticket.name for ticket in mine.ahead()] == [name]
        waiter.kill()
        waiter.wait()
        assert mine.ahead() == []  # its lock went with it: this cell's turn
    with WaitTicket(shared_dir):
        assert name not in os.listdir(shared_dir)  # the next ticket of its user swept the file
