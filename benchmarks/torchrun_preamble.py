"""The first lines of every script a benchmark runs under bare torchrun: the process group, ``rank``,
``world_size`` and ``device`` as torchrun's environment gives them (one GPU per local rank on NCCL, the CPU on
gloo) — what a ``%%distributed`` cell finds ready. Filled with ``.format(backend=...)`` along with the rest of
the script."""

PREAMBLE = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("{backend}")
rank, world_size = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if "{backend}" == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
"""
