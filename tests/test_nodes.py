"""Several machines, emulated on loopback: node agents on 127.0.0.2 and 127.0.0.3 join a real kernel.

The link is checked at the socket level first (no kernel): a peer without the token's secret, or with another
pool's token, is refused before anything it sent is unpickled; a node refuses a kernel whose certificate is not
the one the token pins, and an expired token. Then one kernel and two real node agents (``python -m
nbtrain.node``, torch elastic's agent, ranks on gloo) go through a notebook's life: the join command printed
once, names in (a large tensor through each node's /dev/shm), results back from global rank 0, output labelled
``[node b rank 3]``, a warm re-run, ``%distributed_nodes``, a rank failing on the second node with its
traceback mapped to the cell, the stop button, a node that goes silent (a frozen agent: no heartbeat for 5 s), a node agent SIGKILLed mid-run, and the
kernel's death, which ends every node and its ranks.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import struct
import subprocess
import time

import psutil
import pytest
from helpers.kernelhelp import Kernel
from helpers.nodehelp import Boom, join_command, start_agent, until
from helpers.workers import assert_no_workers, nbtrain_workers

from nbtrain.kernel.cluster.hub import Hub
from nbtrain.wire.link import JoinToken, LinkError, connect, open_tls
from nbtrain.wire.nodes import Heartbeat, NodeHello

NODE_ADDRESSES = ("127.0.0.2", "127.0.0.3")
HELLO = NodeHello("tester", os.getpid(), 0, 1)
CELL = "%%distributed --nodes 2 --nproc-per-node 2 --rdzv-host 127.0.0.1 --cpu --start-timeout 120\n"


# --------------------------------------------------------------------------------- the link itself
@pytest.fixture
def hub():
    hub = Hub("127.0.0.1")
    yield hub
    hub.close()


def _raw_tls(hub: Hub):
    return open_tls("127.0.0.1", hub.port, timeout=5)


def test_a_peer_without_the_secret_is_refused_before_anything_is_unpickled(hub, tmp_path):
    marker = str(tmp_path / "unpickled")
    sock = _raw_tls(hub)
    pool = hub.pool_id.encode()
    sock.sendall(struct.pack("!H", len(pool)) + pool + os.urandom(32))
    sock.recv(32)  # the kernel's nonce
    sock.sendall(b"\0" * 32)  # a proof made without the secret
    payload = pickle.dumps(Boom(marker))
    with pytest.raises(OSError):  # the kernel hangs up; whatever was sent after is never read
        sock.sendall(struct.pack("!Q", len(payload)) + payload)
        assert sock.recv(1) == b""
        raise ConnectionResetError
    until(lambda: hub.refused == 1, 5, "the refusal")
    assert not os.path.exists(marker) and hub.nodes == []


def test_another_pools_token_and_an_expired_token_are_refused(hub):
    other = Hub("127.0.0.1")
    try:  # the right address and certificate, but the other pool's id and secret
        forged = JoinToken(hub.host, hub.port, other.pool_id, other.token.secret, hub.token.fingerprint,
                           hub.token.expires)
        with pytest.raises((LinkError, OSError)):
            connect(forged, HELLO)
    finally:
        other.close()
    until(lambda: hub.refused == 1, 5, "the refusal")
    expired = JoinToken(hub.host, hub.port, hub.pool_id, hub.token.secret, hub.token.fingerprint, time.time() - 1)
    with pytest.raises(LinkError, match="expired"):
        connect(expired, HELLO)
    assert hub.nodes == []


def test_a_node_refuses_a_kernel_whose_certificate_is_not_pinned(hub):
    wrong = JoinToken(hub.host, hub.port, hub.pool_id, hub.token.secret, "00" * 32, hub.token.expires)
    with pytest.raises(LinkError, match="certificate"):
        connect(wrong, HELLO)
    assert hub.nodes == []


def _heard(hub: Hub, link, telemetry: dict):
    """``telemetry`` sent as a heartbeat over ``link``: the joined node's info once the hub has it."""
    sent = time.time()
    link.send(Heartbeat(sent, telemetry))
    [node] = until(hub.live_nodes, 10, "the node to join")
    until(lambda: getattr(node.link.last_heartbeat, "time", None) == sent, 10, "the heartbeat")
    return node.info((0,), lost=False)


HOSTILE_GPU = {
    "index": 0, "name": 7, "utilization": "97", "memory_used": 2**70, "memory_total": [1], "temperature": {"x": 1},
    "power": float("nan"), "power_limit": True, "mig": "yes", "future_field": [[[]]],
    "health": {"sm_clock": "1980", "clock_reasons": ["power cap", {"x": 1}], "unread": ["N/A"] * 100_000,
               "nvlinks": 18, "xid_errors": 10**400, "ecc_uncorrected": -0.5, "pcie_width": None, "later": {}},
    "mig_devices": [{"index": "0", "uuid": "MIG-a"}, {"index": 1, "uuid": "MIG-b", "pids": [1, "2"], "x": 1}, 5],
}


def test_a_hostile_heartbeat_is_read_field_by_field_and_never_raises(hub):
    from nbtrain.kernel.dashboard.devices_view import devices_html
    from nbtrain.kernel.diagnostics.advisor import Evidence, advise

    link, _ = connect(hub.token, HELLO)
    try:
        junk = [{"index": "1"}, {"no": "index"}, [0, 50, None], "junk", None, 12, [[[]]], {"index": 2, "health": [1]}]
        info = _heard(hub, link, {"cpu_percent": "lots", "ram_percent": float("inf"), "gpus": [HOSTILE_GPU, *junk]})
        assert (info.cpu_percent, info.ram_percent) == (None, None)
        [gpu, plain] = [g.status for g in info.gpus]
        assert (gpu.index, gpu.name, gpu.utilization, gpu.memory_used, gpu.memory_total) == (0, "", None, None, None)
        assert (gpu.temperature, gpu.power, gpu.power_limit, gpu.mig, gpu.processes) == (None, None, None, False, None)
        h = gpu.health
        assert (h.sm_clock, h.clock_reasons, h.unread, h.nvlinks, h.xid_errors, h.ecc_uncorrected) == \
            (None, None, (), 18, None, None)
        assert [(d.index, d.uuid, d.pids) for d in gpu.mig_devices] == [(1, "MIG-b", ())]
        assert plain.index == 2 and plain.health is None and plain.mig_devices == ()
        shown = devices_html(None, None, (info,))  # drawn, listed, judged: N/A where a field did not read
        assert "NVLink 18 up" in shown and "SM N/A/N/A MHz" in shown and "MIG 1 MIG-b" in shown
        assert "CPU N/A, RAM N/A, GPU 0 N/A memory N/A" in hub.describe()[0]
        json.dumps(info.record(), allow_nan=False)
        evidence = Evidence()
        evidence.add_nodes((info,))
        assert advise(evidence) == []
        flood = _heard(hub, link, {"gpus": [{"index": i} for i in range(100_000)]})
        assert flood.gpus == ()  # more GPUs than a machine has: not read
    finally:
        link.close()


def test_an_older_agents_heartbeat_with_gpus_as_tuples_and_a_health_line_still_reads(hub):
    from nbtrain.kernel.dashboard.devices_view import devices_html

    line = "SM 1410/1980 MHz · PCIe 5 x16/16 · no NVLink · ECC 0 corrected, 0 uncorrected · slowed by power cap"
    link, _ = connect(hub.token, HELLO)
    try:
        info = _heard(hub, link, {"cpu_percent": 12.0, "ram_percent": 40.0,
                                  "gpus": [(0, 97, 2**30, 80 * 2**30, line), (1, None, None, 80 * 2**30)]})
        first, second = info.gpus
        assert (first.status.index, first.status.utilization, first.status.memory_used) == (0, 97, 2**30)
        assert first.status.health is None and first.health_text == line and second.health_text == ""
        assert info.record()["gpus"][0] == {"index": 0, "utilization": 97, "memory_used": 2**30,
                                            "memory_total": 80 * 2**30, "health": line}
        shown = devices_html(None, None, (info,))
        assert line in shown and "<b>GPU 1</b>" in shown and "97%" in shown
        assert "CPU 12%, RAM 40%, GPU 0 97% 1.0/80 GiB, GPU 1 N/A memory N/A" in hub.describe()[0]
    finally:
        link.close()


# ---------------------------------------------------------------------------- a kernel and two nodes
class Cluster:
    """A kernel, and node agents started from the join command its first --nodes cell prints."""

    def __init__(self) -> None:
        self.kernel = Kernel()
        self.nodes: list[subprocess.Popen] = []
        self.command = ""

    def start_nodes(self, command: str, addresses=NODE_ADDRESSES) -> None:
        self.command = command
        self.nodes += [start_agent(command, address) for address in addresses]

    def close(self) -> None:
        self.kernel.shutdown()
        for node in self.nodes:  # the kernel's death ends them (their link breaks); SIGKILL is only a fallback
            try:
                node.wait(15)
            except subprocess.TimeoutExpired:
                node.kill()
                raise


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    c.kernel.run("%load_ext nbtrain\nimport torch\nscale = 3\nT = torch.arange(200_000.0)")
    yield c
    c.close()
    assert_no_workers(10)


def _first_run(c: Cluster) -> str:
    msg_id = c.kernel.start(CELL + "print(f'hello from {rank} of {world_size}')\n"
                                   "total = scale * float(T.sum()) + rank\n")
    _, seen = c.kernel.collect(msg_id, 60, until=lambda text: "--token" in text)
    c.start_nodes(join_command(seen))
    reply, out = c.kernel.collect(msg_id, 240)
    assert reply["status"] == "ok", seen + out
    return seen + out


def test_names_in_results_back_output_labelled_by_node(cluster):
    text = _first_run(cluster)
    assert text.count("python -m nbtrain.node --join") == 1
    assert "hello from 0 of 4" in text
    labels = set(re.findall(r"\[node ([ab]) rank (\d)\] hello from (\d) of 4", text))
    assert {(rank, same) for _, rank, same in labels} == {("1", "1"), ("2", "2"), ("3", "3")}, text
    assert {node for node, _, _ in labels} == {"a", "b"}  # ranks on both nodes
    assert "4 ranks · gloo" in text
    out = cluster.kernel.run("print('total', total == 3 * float(T.sum()))")
    assert "total True" in out


def test_warm_rerun_and_node_list(cluster):
    out = cluster.kernel.run(CELL + "again = world_size * 10\n", timeout=60)
    assert "(warm)" in out and "python -m nbtrain.node" not in out
    listing = cluster.kernel.run("%distributed_nodes\nprint(again)")
    assert "node a: " in listing and "node b: " in listing and "40" in listing
    assert "127.0.0.2" in listing and "127.0.0.3" in listing
    assert re.search(r"CPU \d+%, RAM \d+%", listing), listing  # each node's heartbeats carry its machine's load


def test_a_priced_run_on_nodes_counts_every_nodes_cores(cluster):
    """--price-per-gpu-hour on --nodes --cpu: the core-hours of every node's ranks' cores, as each agent reported
    its cores when it joined (here 2 emulated nodes of this machine's cores, 2 ranks each)."""
    out = cluster.kernel.run(CELL.replace("--cpu", "--cpu --price-per-gpu-hour 3600")  # 2 s: the summary's 0.1 s
                             + "import time\ntime.sleep(2.0)\nx = 1\n", timeout=60)  # rounding stays small
    cpus = os.cpu_count() or 1
    cores = 2 * min(cpus, 2 * max(1, cpus // 2))
    seconds = float(re.search(r"· ([\d.]+) s", out).group(1))
    shown = re.search(r"· [\d.]+ core-hours · cost ([\d.,]+)", out)
    assert shown and float(shown.group(1).replace(",", "")) == pytest.approx(cores * seconds, rel=0.06), out
    row = cluster.kernel.run("import nbtrain\nrow = nbtrain.runs().to_dicts()[-1]\n"
                             "print('row', row['core_hours'] * 3600 / row['seconds'], row['gpu_hours'])")
    held, gpu_hours = re.search(r"row (\S+) (\S+)", row).groups()
    assert float(held) == pytest.approx(cores) and gpu_hours == "None", row


def test_input_on_a_rank_of_the_second_node_is_answered_in_the_notebook(cluster):
    reply, out, prompts = cluster.kernel.execute_answering(
        CELL + "answer = input('your name? ') if rank == 3 else None\nif rank == 3:\n    print('got', answer)\n",
        ["Ada"], timeout=90)
    assert reply["status"] == "ok", out
    assert prompts == ["[rank 3] your name? "], prompts
    assert re.search(r"\[node [ab] rank 3\] got Ada", out), out


def test_a_rank_failing_on_the_second_node(cluster):
    reply, out = cluster.kernel.execute(CELL + "x = 1\nif rank == 3:\n    raise ValueError('boom on the second node')\n"
                                               "import time\ntime.sleep(60)\n", timeout=120)
    assert reply["status"] == "error"
    # where the others were: their stacks, dumped on their nodes (rank 2 shares the failing rank's node)
    assert "Where the other ranks were:" in out and all(f"rank {r}: at cell line 6" in out for r in (0, 1, 2)), out
    assert re.search(r"node [ab] rank 3 raised ValueError: boom on the second node", out), out
    assert "Traceback on node" in out and "Cell line 4, in <module>" in out, out


def test_stop_button_ends_every_rank_on_every_node(cluster):
    msg_id = cluster.kernel.start(CELL + "import time\nprint('spinning', flush=True)\nwhile True:\n    time.sleep(0.05)\n")
    cluster.kernel.collect(msg_id, 180, until=lambda text: text.count("spinning") >= 4)
    assert len(nbtrain_workers()) == 4
    pressed = time.monotonic()
    cluster.kernel.km.interrupt_kernel()
    reply, out = cluster.kernel.collect(msg_id, 30)
    assert reply["status"] == "error" and "KeyboardInterrupt" in out
    assert "Where each rank was" in out and "rank 3: at cell line 5" in out, out
    until(lambda: not nbtrain_workers(), 10, "the ranks to end")
    assert time.monotonic() - pressed < 6  # the kernel's 3 s, plus this loaded machine's slack


def test_a_silent_node_is_reported_after_5_s_without_heartbeats(cluster):
    """A frozen agent keeps its connection open (no FIN, as when a link goes down): only the heartbeats tell."""
    msg_id = cluster.kernel.start(CELL + "import time\nprint('spinning', flush=True)\nwhile True:\n    time.sleep(0.05)\n")
    cluster.kernel.collect(msg_id, 180, until=lambda text: text.count("spinning") >= 4)
    frozen = cluster.nodes[1]
    frozen_ranks = [p for p in psutil.Process(frozen.pid).children(recursive=True) if "nbtrain.rank" in p.cmdline()]
    stopped = time.monotonic()
    frozen.send_signal(signal.SIGSTOP)
    try:
        reply, out = cluster.kernel.collect(msg_id, 30)
        silent = time.monotonic() - stopped
    finally:
        frozen.kill()  # a stopped process still takes SIGKILL; its ranks follow their agent
        frozen.wait(5)
    assert reply["status"] == "error"
    assert re.search(r"node [a-z] \(ranks \d–\d\) lost: no heartbeat for 5 s", out), out
    assert 5 <= silent < 12
    psutil.wait_procs(frozen_ranks, timeout=5)
    cluster.nodes.remove(frozen)
    cluster.start_nodes(cluster.command, addresses=NODE_ADDRESSES[1:])  # a replacement for the next tests


def test_a_node_agent_killed_mid_run_is_reported(cluster):
    msg_id = cluster.kernel.start(CELL + "import time\nprint('spinning', flush=True)\nwhile True:\n    time.sleep(0.05)\n")
    cluster.kernel.collect(msg_id, 180, until=lambda text: text.count("spinning") >= 4)
    victim = cluster.nodes[-1]
    victim_ranks = [p for p in psutil.Process(victim.pid).children(recursive=True) if "nbtrain.rank" in p.cmdline()]
    killed = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    reply, out = cluster.kernel.collect(msg_id, 30)
    reported = time.monotonic() - killed
    assert reply["status"] == "error"
    assert re.search(r"node [a-z] \(ranks \d–\d\) lost: (no heartbeat for 5 s|its connection broke)", out), out
    assert reported < 10
    psutil.wait_procs(victim_ranks, timeout=5)  # its orphaned ranks follow their agent
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in victim_ranks)


def test_kernel_death_ends_every_node_and_its_ranks(cluster):
    cluster.start_nodes(cluster.command, addresses=NODE_ADDRESSES[1:])  # a node in place of the one killed above
    msg_id = cluster.kernel.start(CELL + "import time\nprint('spinning', flush=True)\nwhile True:\n    time.sleep(0.05)\n")
    cluster.kernel.collect(msg_id, 180, until=lambda text: text.count("spinning") >= 4)
    ranks = nbtrain_workers()
    assert len(ranks) == 4
    agents = [psutil.Process(n.pid) for n in cluster.nodes if n.poll() is None]
    died = time.monotonic()
    os.kill(cluster.kernel.pid(), signal.SIGKILL)
    psutil.wait_procs(ranks + agents, timeout=15)
    assert not [p for p in ranks + agents if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert time.monotonic() - died < 12  # 10 s promised; the ranks follow their agent within a second
