"""Writes the gpu-*.json fixtures: GPU runs in the Recorder's format (tests/helpers/telemetry_record.py).

No GPU was at hand when they were made, so they are built, not recorded: each follows a run reported in
the project's GPU notes (H100 80 GB; ResNet-50 at 64×64 fed from a CPU TensorDataset kept the GPU 6–12 %
busy; 224×224 batch 128 on data already on the GPU kept it busy), with a little deterministic jitter.
Record real ones on a GPU with Recorder + save() and they replace these file for file.
"""

import json
import os
import random

GiB = 2**30
TOTAL = 80 * GiB
HERE = os.path.dirname(os.path.abspath(__file__))


def run(name, description, ranks, busy, cpu, memory_gib, setup, start_samples=30, samples=40, steps_per_s=None):
    rng = random.Random(name)
    t0, out, metrics = 1_795_000_000.0, [], {str(r): [] for r in range(ranks)}
    for i in range(start_samples + samples):
        when = t0 + i
        training = i >= start_samples
        gpus = [{"index": r, "utilization": round(busy[r] + rng.uniform(-3, 3)) if training else 0,
                 "memory_used": int((memory_gib[r] if training else 1.5) * GiB), "memory_total": TOTAL}
                for r in range(ranks)]
        ranks_ = [{"rank": r, "gpu_index": r, "cpu_percent": round(cpu[r] + rng.uniform(-5, 5), 1), "alive": True}
                  for r in range(ranks)]
        out.append({"time": when, "gpus": gpus, "ranks": ranks_})
    for r in range(ranks):
        rate = (steps_per_s or [10.0] * ranks)[r]
        n = int(rate * samples)
        metrics[str(r)] = [[s, t0 + start_samples + 0.5 + s / rate] for s in range(n)]
    record = {"description": description, "samples": out, "metrics": metrics,
              "setup": {str(r): [setup | {"device": f"cuda:{r}", "model": 0}] for r in range(ranks)}}
    with open(os.path.join(HERE, f"{name}.json"), "w") as f:
        json.dump(record, f)
        f.write("\n")


BF16 = {"amp": "bf16", "bf16_supported": True, "channels_last": True, "compile": None}
FP32 = {"amp": "off", "bf16_supported": True, "channels_last": False, "compile": None}
run("gpu-input-bound", "Built (not recorded): 1 H100, ResNet-50 64x64 from a CPU TensorDataset, GPU 6-12 % busy, "
    "rank at ~120 % CPU, 6 GiB of 80 GiB.", 1, [9], [120], [6.0], BF16)
run("gpu-fp32", "Built (not recorded): 2 H100s, fp32 (--amp off), both GPUs ~97 % busy, 60 GiB of 80 GiB each.",
    2, [97, 96], [100, 100], [60.0, 61.0], FP32)
run("gpu-straggler", "Built (not recorded): 2 H100s in step under DDP; rank 0 does extra work, its GPU ~97 % busy, "
    "rank 1's ~55 % (waiting at each all-reduce).", 2, [97, 55], [100, 100], [50.0, 50.0], BF16)
run("gpu-healthy", "Built (not recorded): 2 H100s, bf16 + channels_last, both ~97 % busy, 70 GiB of 80 GiB; 60 s of "
    "start-up (GPU idle, CPU busy) before the first step.", 2, [97, 98], [100, 100], [70.0, 70.0], BF16,
    start_samples=60)
