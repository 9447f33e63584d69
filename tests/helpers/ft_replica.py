"""One replica group of one rank, training under torchft through nbtrain's ReplicaGroup (a test's process).

Reads its settings as JSON on stdin (the secret among them: never in argv): ``lighthouse``, ``replica``,
``secret`` (hex), ``steps``, ``out`` (a folder), ``step_s``. Trains a small model with SGD and momentum on
batches that depend only on (replica, step) — so a reference run can redo any sequence of quorums — and appends
one line per committed step to ``out/<replica>.steps`` (``step groups took_part time``). At the end it writes
``out/<replica>.pt``: the parameters, and the step it healed at (None if it never copied a peer's state).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from nbtrain.rank.train.ft import ReplicaConfig, ReplicaGroup, group_store


def batch(replica: str, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(int(replica) * 100_003 + step)
    return torch.randn(8, 4, generator=generator), torch.randint(0, 2, (8,), generator=generator)


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


def main() -> None:
    settings = json.loads(sys.stdin.readline())
    replica, out = settings["replica"], Path(settings["out"])
    store = group_store("127.0.0.1")
    net, optimizer = model_and_optimizer()

    def state() -> dict:
        return {"model": net.state_dict(), "optim": optimizer.state_dict()}

    def load(loaded: dict) -> None:
        net.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optim"])

    group = ReplicaGroup(ReplicaConfig(lighthouse=settings["lighthouse"], replica_id=replica, host="127.0.0.1",
                                       secret=bytes.fromhex(settings["secret"]), store_port=store.port, timeout_s=10),
                         state, load)
    model, opt = group.wrap_model(net), group.wrap_optimizer(optimizer)
    with open(out / f"{replica}.steps", "a") as progress:
        while group.manager.current_step() < settings["steps"]:
            opt.zero_grad()
            x, y = batch(replica, group.manager.current_step())
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            for step, (groups, took_part) in sorted(group.participation.steps.items()):
                progress.write(f"{step} {groups} {int(took_part)} {time.time():.3f}\n")
            progress.flush()
            group.participation.steps.clear()
            time.sleep(settings["step_s"])
    torch.save({"params": [p.detach().clone() for p in net.parameters()], "healed_at": group.participation.healed_at},
               out / f"{replica}.pt")
    group.shutdown()


if __name__ == "__main__":
    main()
