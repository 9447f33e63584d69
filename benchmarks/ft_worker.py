"""One worker of benchmarks/fault_tolerance.py: a replica group under torchft, or a rank under torchrun.

    python benchmarks/ft_worker.py ft       (settings as JSON on stdin: lighthouse, replica, secret, steps, out, width,
                                             groups)
    python benchmarks/ft_worker.py elastic  (under torchrun; settings as JSON in NBTRAIN_BENCH_SETTINGS: steps, out,
                                             width, every — a checkpoint every that many steps)

Both train the same MLP (4 layers of ``width``, SGD with momentum, a batch of 64 per worker) and append
``step time`` to ``out/<worker>.steps`` after each step they keep: under torchft each committed step, under
torchrun each step (a restarted group resumes from its last checkpoint, so steps after it come again).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import torch


def model(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    net = torch.nn.Sequential(*layers)
    return net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)


def batch(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(64, width), torch.randn(64, width)


def run_ft(settings: dict) -> None:
    from nbtrain.rank.train.ft import ReplicaConfig, ReplicaGroup, group_store

    torch.set_num_threads(1)
    net, optimizer = model(settings["width"])
    store = group_store("127.0.0.1")
    config = ReplicaConfig(lighthouse=settings["lighthouse"], replica_id=settings["replica"], host="127.0.0.1",
                           secret=bytes.fromhex(settings["secret"]), store_port=store.port, timeout_s=10)
    def load(state: dict) -> None:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    group = ReplicaGroup(config, lambda: {"model": net.state_dict(), "optim": optimizer.state_dict()}, load)
    ddp, opt = group.wrap_model(net), group.wrap_optimizer(optimizer)
    with open(Path(settings["out"]) / f"{settings['replica']}.steps", "a") as progress:
        # past the last step a worker goes on until every group stepped together: on a loaded machine the others
        # could finish before the replacement of a lost one has started, and it would wait alone for a quorum
        while group.manager.current_step() < settings["steps"] or group.manager.num_participants() < settings["groups"]:
            opt.zero_grad()
            x, y = batch(settings["width"])
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            for step in sorted(group.participation.steps):
                progress.write(f"{step} {time.time():.4f}\n")
            progress.flush()
            group.participation.steps.clear()
    group.shutdown()


def run_elastic(settings: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # the agent's store outlives a restart, and gloo's bootstrap keys from the first attempt would point the
    # restarted ranks at dead ones: each attempt's keys under a prefix of its own
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    attempt = dist.PrefixStore(f"attempt{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)
    dist.init_process_group("gloo", store=attempt, rank=rank, world_size=world)
    net, optimizer = model(settings["width"])
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    checkpoint, start = Path(settings["out"]) / "checkpoint.pt", 0
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=True)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optim"])
        start = saved["step"]
    with open(Path(settings["out"]) / f"{rank}.steps", "a") as progress:
        for step in range(start, settings["steps"]):
            optimizer.zero_grad()
            x, y = batch(settings["width"])
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
            if rank == 0 and (step + 1) % settings["every"] == 0:
                partial = checkpoint.with_suffix(f".{secrets.token_hex(4)}")
                torch.save({"model": net.state_dict(), "optim": optimizer.state_dict(), "step": step + 1}, partial)
                os.replace(partial, checkpoint)
            progress.write(f"{step} {time.time():.4f}\n")
            progress.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "ft":
        run_ft(json.loads(sys.stdin.readline()))
    else:
        run_elastic(json.loads(os.environ["NBTRAIN_BENCH_SETTINGS"]))
