"""nbtrain's own collectives of checkpoint state unpickle nothing a peer in the process group sends.

The ranks' process group is bootstrapped through a store without authentication, and gloo's ports are on
loopback: another local process can pose as a peer (see docs/security.md, *Object collectives*). These tests
put such a peer in a real two-process gloo group, speaking the collectives' own protocol — a size, then bytes —
with a pickle that would create a file if it were unpickled. The control shows the attack is real: torch's
``all_gather_object`` runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VICTIM = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from nbtrain.rank.train.plain_gather import PeerValueError, all_gather_plain, gather_plain
    dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=2)
    mine = {"rng": torch.arange(3), "python": (3, (1, 2), None)}
    try:
        if sys.argv[2] == "torch":
            out = [None, None]
            dist.all_gather_object(out, mine)
        else:
            out = {"all": all_gather_plain, "gather": gather_plain}[sys.argv[2]](mine, torch.device("cpu"))
        print("GOT", out, flush=True)
    except PeerValueError as exc:
        print("REFUSED", exc, flush=True)
    os._exit(0)  # gloo's teardown aborts when the peer has gone first: not what is tested
""")

PEER = textwrap.dedent("""
    import os, pickle, sys, torch, torch.distributed as dist

    class Planted:
        def __reduce__(self):
            return (os.system, ("touch " + sys.argv[3],))

    dist.init_process_group("gloo", init_method=sys.argv[1], rank=1, world_size=2)
    data = pickle.dumps(Planted()) if sys.argv[2] != "honest" else None
    if sys.argv[2] == "honest":
        import io
        buffer = io.BytesIO()
        torch.save({"rng": torch.arange(5), "python": (3, (4,), None)}, buffer)
        data = buffer.getvalue()
    announced = 2 ** 40 if sys.argv[2] == "huge" else len(data)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(sizes, torch.tensor([announced]))
    if sys.argv[2] == "huge":
        os._exit(0)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if sys.argv[4] == "gather":
        dist.gather(padded, None, dst=0)
    else:
        dist.all_gather([torch.empty_like(padded) for _ in range(2)], padded)
    os._exit(0)
""")


def _exchange(victim_mode: str, peer_mode: str, marker: str) -> str:
    """Rank 0 runs ``victim_mode``'s collective while rank 1 sends ``peer_mode``'s bytes; rank 0's output."""
    init = f"file://{os.path.dirname(marker)}/store"
    env = {**os.environ, "PYTHONPATH": ROOT, "GLOO_SOCKET_IFNAME": "lo"}
    wire = "gather" if victim_mode == "gather" else "all"
    peer = subprocess.Popen([sys.executable, "-c", PEER, init, peer_mode, marker, wire], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = subprocess.run([sys.executable, "-c", VICTIM, init, victim_mode], env=env, capture_output=True,
                                text=True, timeout=120)
    finally:
        try:
            peer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            peer.kill()
            peer.wait()
    assert victim.returncode == 0, victim.stderr
    return victim.stdout


def test_the_control_torchs_all_gather_object_runs_a_peers_pickle(tmp_path):
    marker = tmp_path / "ran"
    out = _exchange("torch", "pickle", str(marker))
    assert "GOT" in out and marker.exists()  # the attack is real: this is what nbtrain must not do


@pytest.mark.parametrize("collective", ["all", "gather"])
def test_a_peers_pickle_in_nbtrains_checkpoint_gather_is_refused_and_runs_nothing(tmp_path, collective):
    marker = tmp_path / "ran"
    out = _exchange(collective, "pickle", str(marker))
    assert out.startswith("REFUSED rank 1 of the group sent nbtrain's checkpoint state that is not tensors")
    assert "nothing of it was run" in out
    assert not marker.exists()


def test_a_peer_announcing_a_terabyte_is_refused_before_anything_is_allocated(tmp_path):
    out = _exchange("all", "huge", str(tmp_path / "ran"))
    assert out.startswith(f"REFUSED rank 1 of the group announced {2 ** 40} bytes")


def test_honest_ranks_gather_their_tensors_and_plain_values(tmp_path):
    out = _exchange("all", "honest", str(tmp_path / "ran"))
    assert out.strip() == ("GOT [{'rng': tensor([0, 1, 2]), 'python': (3, (1, 2), None)}, "
                           "{'rng': tensor([0, 1, 2, 3, 4]), 'python': (3, (4,), None)}]")


def test_a_pickle_carried_in_a_ranks_dcp_plan_is_refused_and_runs_nothing(tmp_path):
    """Under --shard a sync save's per-rank parts reach rank 0 inside DCP's plans (rank/train/save_planner.py): DCP
    unpickles the plans, as torch does (docs/security.md), and nbtrain reads its part with weights_only=True."""
    import pickle

    import torch

    from nbtrain.rank.train.plain_gather import PeerValueError, plain_bytes
    from nbtrain.rank.train.save_gather import with_every_rank

    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    snapshot = {"step": 3, "ranks": [{"rng": torch.arange(3)}]}
    with pytest.raises(PeerValueError, match="rank 1 of the group sent nbtrain's checkpoint state that is not tensors"):
        with_every_rank(snapshot, [None, pickle.dumps(Planted(), protocol=2)])
    assert not marker.exists()
    honest = with_every_rank(snapshot, [None, plain_bytes({"rng": torch.arange(5)})])
    assert [entry["rng"].tolist() for entry in honest["ranks"]] == [[0, 1, 2], [0, 1, 2, 3, 4]]
