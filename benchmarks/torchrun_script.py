"""What the benchmarks share for their bare-torchrun reference: the script's first lines and running it.

:data:`PREAMBLE` sets up the process group, ``rank``, ``world_size`` and ``device`` as torchrun's environment
gives them (one GPU per local rank on NCCL, the CPU on gloo) — what a ``%%distributed`` cell finds ready;
it is filled with ``.format(backend=...)`` along with the rest of the script. :func:`run` runs a script under
``torch.distributed.run`` and returns what rank 0 printed on its ``RESULT <json>`` line.
"""

import json
import os
import subprocess
import sys
import tempfile

PREAMBLE = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("{backend}")
rank, world_size = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if "{backend}" == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
"""


def run(script: str, ranks: int, timeout: float):
    """Run ``script`` on ``ranks`` local processes under torchrun (intra-op threads split between them, as
    nbtrain splits them); the JSON value of its ``RESULT`` line, or a RuntimeError with torchrun's output."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // ranks)))
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), f.name],
                              capture_output=True, text=True, env=env, timeout=timeout)
    finally:
        os.unlink(f.name)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"torchrun failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
