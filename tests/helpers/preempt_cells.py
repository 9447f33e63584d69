"""The preemption tests' training cell, and a way to signal its ranks at a step of the test's choosing.

:func:`training_cell` trains a small classifier for a few epochs with a shuffled prepared loader, a
checkpoint at each epoch's end, ``STEP_S`` of sleep per step (a step the test can land a signal in), and
each rank writing ``rank<k>`` in ``marks`` — its pid, its step and its parent's pid — after each step.
Rank 0 assigns ``steps`` (the training state's step at the end) and ``world`` (the world size).

:func:`signal_at_step` waits (in a thread) until a rank has written step ``step`` and sends its process (or
its parent, a node's agent) a signal: a preemption from outside, at a known point of the run. A notice that
comes while step k is in progress (k - 1 done) is saved at the end of step k + 1 at the latest: the first rank to
hear it proposes the step after its next boundary (rank/train/preempt_checkpoint.py), so ``after + 2`` bounds the saved step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

_CELL = """
import os, time
import torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn({samples}, 4), torch.randint(0, 2, ({samples},)))
net = {model}
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                     DataLoader(data, batch_size=4, shuffle=True, num_workers={workers}))
for epoch in nbtrain.epochs({epochs}):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        nbtrain.backward(loss)
        opt.step(); opt.zero_grad()
        nbtrain.log(loss=loss)
        with open(os.path.join({marks!r}, f"rank{{rank}}"), "w") as mark:
            mark.write(f"{{os.getpid()}} {{nbtrain.training_state().step}} {{os.getppid()}}")
        time.sleep({step_s})
{save}steps, world = nbtrain.training_state().step, world_size
"""


# The bit-for-bit reclaim: dropout's random state, a shuffled loader's position and SGD's momentum must all come back
# (2 ranks: 40 steps; the namespace gives MARKS, the folder each rank writes its progress to; STEP_S its pause)
RECLAIMED_CELL = """
import os, time, torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))
net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                     DataLoader(data, batch_size=4, shuffle=True))
for epoch in nbtrain.epochs(8):  # 5 steps an epoch per rank: 40 in all
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        nbtrain.backward(loss)
        opt.step(); opt.zero_grad()
        nbtrain.log(loss=loss)
        with open(os.path.join(MARKS, f"rank{rank}"), "w") as mark:
            mark.write(f"{os.getpid()} {nbtrain.training_state().step} {os.getppid()}")
        time.sleep(STEP_S)
final = [p.detach().clone() for p in model.module.parameters()]
"""


BLOCKS = "torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))"  # blocks to shard


def training_cell(marks: Path, epochs: int = 3, samples: int = 64, step_s: float = 0.05, save: bool = True,
                  extra: str = "", model: str = "torch.nn.Linear(4, 2)", workers: int = 0) -> str:
    """The cell (see the module docstring); ``extra`` goes into each epoch's end checkpoint's arguments."""
    marks.mkdir(parents=True, exist_ok=True)
    saving = f"    nbtrain.save_checkpoint({extra})\n" if save else ""
    return _CELL.format(samples=samples, epochs=epochs, marks=str(marks), step_s=step_s, save=saving, model=model,
                        workers=workers)


def progress(marks: Path, rank: int) -> tuple[int, int, int] | None:
    """``(pid, step, parent pid)`` rank ``rank`` last wrote, or None."""
    try:
        pid, step, parent = (int(v) for v in (marks / f"rank{rank}").read_text().split())
    except (OSError, ValueError):
        return None
    return pid, step, parent


def signal_at_step(marks: Path, rank: int, step: int, *, to_parent: bool = False, group: bool = False,
                   sig: int = signal.SIGTERM) -> dict:
    """From a thread: once ``rank`` reached ``step``, send ``sig`` to it (or its parent). The dict gets ``step``
    (the rank's step then), ``after`` (its step once the signal was sent) and ``at`` (time.time())."""
    sent: dict = {}

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen = progress(marks, rank)
            if seen is not None and seen[1] >= step:
                sent.update(step=seen[1], at=time.time())
                if group:  # the rank's process group — itself and its DataLoader workers, as Slurm signals a step —
                    # from a process of its own: this one is the kernel, whose SIGTERMs stop ranks
                    subprocess.run(["kill", "-s", signal.Signals(sig).name[3:], "--", f"-{os.getpgid(seen[0])}"],
                                   check=True)
                else:
                    os.kill(seen[2] if to_parent else seen[0], sig)
                sent["after"] = progress(marks, rank)[1]  # the steps done when it was sent, at most
                return
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()
    return sent
