"""The administrator's most GPUs per user, kept by the run's lease (docs/shared-servers.md): real holder processes."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import textwrap

import pytest

from nbtrain.gpu import leases
from nbtrain.kernel.lifecycle.gpulease import GpusNotFree, lease_gpus
from nbtrain.kernel.ranks.spec import PoolSpec

HOLD = textwrap.dedent("""
    import sys, time
    from nbtrain.gpu import leases
    lease = leases.take([int(g) for g in sys.argv[1].split(",")], leases.LeaseInfo(notebook="notebooks/a.ipynb"))
    print("held", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def shared_dir(monkeypatch, tmp_path):
    path = f"/tmp/nbtrain-leases-test-{secrets.token_hex(4)}"
    monkeypatch.setenv("NBTRAIN_LEASE_DIR", path)
    monkeypatch.setenv("NBTRAIN_POLICY", str(tmp_path / "policy.toml"))
    yield leases.lease_dir()
    shutil.rmtree(path, ignore_errors=True)


def pinned(*gpus: int) -> PoolSpec:
    return PoolSpec(nprocs=len(gpus), backend="gloo", device_type="cpu", gpu_ids=gpus, timeout_s=60.0)


def test_gpu_lease_policy_limits_each_users_gpus_counting_their_other_runs(shared_dir, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _, lease = lease_gpus(pinned(0, 1, 2), 0, print)  # no policy file: no limit
    lease.release()
    (tmp_path / "policy.toml").write_text("max_gpus_per_user = 2\n")
    with pytest.raises(GpusNotFree, match=r"policy \(.*policy.toml\) lets each user hold 2 GPUs at once; this cell "
                                          r"asks for 3. Ask for fewer.$"):
        lease_gpus(pinned(0, 1, 2), 0, print)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, "3"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(GpusNotFree, match=r"you hold 1 GPU in other runs already and this cell asks for 2. Ask for "
                                              r"fewer, or stop another of your runs"):
            lease_gpus(pinned(0, 1), 0, print)
        _, lease = lease_gpus(pinned(0), 0, print)
        assert sorted(held.gpu for held in leases.held(shared_dir)) == [0, 3]
        lease.release()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("text, says", [
    ("max_gpus_per_user = 0\n", "must be a whole number, 1 or more (got 0)"),
    ("max_gpus_per_user = \"4\"\n", "must be a whole number, 1 or more (got '4')"),
    ("max_gpus = 4\n", "has keys nbtrain does not know (max_gpus); it knows max_gpus_per_user"),
    ("max_gpus_per_user 4\n", "cannot be read"),
])
def test_gpu_lease_policy_that_cannot_be_used_refuses_the_run_saying_why(shared_dir, tmp_path, text, says):
    (tmp_path / "policy.toml").write_text(text)
    with pytest.raises(GpusNotFree, match="Ask the administrator to fix it") as refused:
        lease_gpus(pinned(0), 0, print)
    assert says in str(refused.value)
    assert leases.held(shared_dir) == []


def test_gpu_lease_policy_may_hide_other_users_notebook_names_and_says_a_wrong_value(tmp_path):
    from nbtrain.gpu import leasepolicy

    path = tmp_path / "policy.toml"
    path.write_text("show_notebooks = false\n")
    assert leasepolicy.load({"NBTRAIN_POLICY": str(path)}).show_notebooks is False
    path.write_text("max_gpus_per_user = 2\n")
    assert leasepolicy.load({"NBTRAIN_POLICY": str(path)}).show_notebooks is True  # the default
    path.write_text('show_notebooks = "no"\n')
    with pytest.raises(leasepolicy.PolicyError, match="show_notebooks must be true or false"):
        leasepolicy.load({"NBTRAIN_POLICY": str(path)})
