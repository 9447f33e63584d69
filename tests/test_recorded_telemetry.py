"""A detached run's load samples as its run folder keeps them: a Snapshot to plain JSON and back, each value
checked on the way in (the agent's side and the attach are in tests/test_detach.py)."""

from __future__ import annotations

import json
import os

from nbtrain.gpu.devices import GpuStatus
from nbtrain.gpu.processes import HostStatus
from nbtrain.gpu.snapshot_json import snapshot_from_json, snapshot_to_json
from nbtrain.gpu.telemetry import RankUsage, Snapshot, Telemetry


def test_a_sample_comes_back_from_its_json_as_it_was_taken_but_for_the_gpus_processes():
    gpu = GpuStatus(index=1, name="NVIDIA H200", uuid="GPU-1", utilization=87, memory_used=60 << 30,
                    memory_total=141 << 30, temperature=61, power=512.5, power_limit=700.0, processes=())
    usage = RankUsage(rank=0, pid=4242, device="cuda:0", gpu_index=1, gpu_memory=59 << 30, cpu_percent=101.5,
                      rss=3 << 30)
    snap = Snapshot(1795770000.25, (gpu,), (usage,), HostStatus(12.5, 16, 40 << 30, 128 << 30), None, ("a note",))
    back = snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap))))
    assert back == Snapshot(snap.time, (GpuStatus.from_json(gpu.to_json()),), (usage,), snap.host, None, ("a note",))
    assert back.gpus[0].processes is None  # not known where the sample is read: their PIDs are the agent's machine's


def test_a_live_sample_of_this_process_survives_the_trip():
    telemetry = Telemetry([(0, os.getpid(), "cpu", None)])
    telemetry.snapshot()
    snap = telemetry.snapshot()
    assert snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap)))) == snap


def test_a_value_of_the_wrong_kind_reads_na_and_a_sample_without_its_time_is_none():
    assert snapshot_from_json({"gpus": []}) is None and snapshot_from_json([1, 2]) is None
    hostile = {"time": 5, "gpus": [{"index": "0"}, {"index": 2, "utilization": "lots"}] + [{}] * 100,
               "ranks": [{"rank": 0, "pid": "x", "rss": 1e300, "cpu_percent": float("nan")}, {"pid": 7}],
               "host": "up", "nvml_error": ["no"], "notes": "one"}
    snap = snapshot_from_json(hostile)
    assert snap is not None and snap.time == 5.0
    assert snap.gpus == ()  # more GPUs than any machine has: none read rather than a guess
    assert snap.ranks == (RankUsage(0, 0, None, None, None, None, None),)
    assert snap.host == HostStatus(None, 1, None, None) and snap.nvml_error is None and snap.notes == ()
    fewer = snapshot_from_json({**hostile, "gpus": hostile["gpus"][:2]})
    assert [(g.index, g.utilization) for g in fewer.gpus] == [(2, None)]
