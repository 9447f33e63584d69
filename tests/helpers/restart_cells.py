"""The restart tests' training cell: three checkpointed epochs of a small classifier in which rank 1 dies once.

:func:`killed_rank_cell` kills rank 1's own process mid-epoch (a crashed rank); :func:`lost_node_cell` kills
rank 1's node agent after an epoch's checkpoint (a preempted machine: the rank's parent is its agent). A marker
file makes the death happen once: the restarted ranks find it and train on. Rank 0 assigns ``steps`` (the
training state's step at the end), ``world`` (the world size), ``batches`` (the loader's length in each epoch)
and ``restart_count`` (``TORCHELASTIC_RESTART_COUNT``).
"""

from __future__ import annotations

from pathlib import Path

_CELL = """
import os, signal, time
import torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
restart_count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
torch.manual_seed(0)
data = TensorDataset(torch.randn({samples}, 4), torch.randint(0, 2, ({samples},)))
net = torch.nn.Linear(4, 2)
model, opt, loader = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(data, batch_size=4))
batches = []
for epoch in nbtrain.epochs(3):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        nbtrain.backward(loss)
        opt.step(); opt.zero_grad()
        nbtrain.log(loss=loss)
{mid_epoch}    batches.append(len(loader))
    nbtrain.save_checkpoint()
{after_checkpoint}steps, world = nbtrain.training_state().step, world_size
"""

def _once(epoch: int, marker: Path, kill: str, spaces: int) -> str:
    """Rank 1 runs ``kill`` in ``epoch`` unless ``marker`` exists, which it first creates."""
    lines = (f"if rank == 1 and epoch == {epoch} and not os.path.exists({str(marker)!r}):",
             f'    open({str(marker)!r}, "w").close()', *("    " + line for line in kill.splitlines()))
    return "".join(" " * spaces + line + "\n" for line in lines)


def killed_rank_cell(marker: Path, epoch: int, samples: int = 32) -> str:
    """Rank 1 SIGKILLs itself in epoch ``epoch`` (after its first step there), once."""
    kill = _once(epoch, marker, "os.kill(os.getpid(), signal.SIGKILL)", 8)
    return _CELL.format(samples=samples, mid_epoch=kill, after_checkpoint="")


def lost_node_cell(marker: Path, samples: int = 16) -> str:
    """Rank 1's node agent is SIGKILLed after epoch 0's checkpoint, once; the rank waits to be ended with it."""
    kill = _once(0, marker, "os.kill(os.getppid(), signal.SIGKILL)  # the machine is gone\ntime.sleep(30)", 4)
    return _CELL.format(samples=samples, mid_epoch="", after_checkpoint=kill)


def held_node_cell(marker: Path, samples: int = 16) -> str:
    """Rank 1 prints ``held`` after epoch 0's checkpoint and sleeps, once: the test then ends its machine from
    outside (a Slurm job's time limit)."""
    hold = _once(0, marker, "print('held', flush=True)\ntime.sleep(300)", 4)
    return _CELL.format(samples=samples, mid_epoch="", after_checkpoint=hold)


def gated_killed_rank_cell(marker: Path, go: Path, epoch: int = 1, samples: int = 16) -> str:
    """As :func:`killed_rank_cell`, but rank 1 waits for the file ``go`` before it dies: the test first ends what
    must be gone by then (the kernel of a detached run)."""
    kill = _once(epoch, marker, f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
                                "os.kill(os.getpid(), signal.SIGKILL)", 8)
    return _CELL.format(samples=samples, mid_epoch=kill, after_checkpoint="")
