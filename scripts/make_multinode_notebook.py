"""Writes notebooks/multinode.ipynb: one cell on several machines (``%%distributed --nodes``).

    python scripts/make_multinode_notebook.py

Kept as code, like scripts/make_notebooks.py. By default the notebook runs on two *emulated* nodes: node
agents that ``%distributed_nodes --emulate 2`` starts on 127.0.0.2 and 127.0.0.3 of this machine, so it runs
top to bottom on a laptop and in CI (tests/test_notebooks.py executes it). On a cluster, set ``EMULATE = 0``
and ``RDZV_HOST`` to the notebook machine's address, and paste the printed join command into Slurm, a
Kubernetes Job or ssh (docs/clusters.md).
"""

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from notebook_cells import KERNEL

TRAINING = (
    "%%distributed --nodes {NODES} --nproc-per-node {NPROC_PER_NODE} --rdzv-host {RDZV_HOST} {DEVICE_OPTION}\n"
    "import socket\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n\n"
    "print(f'rank {rank} of {world_size} (local rank {local_rank}) on {socket.gethostname()}, {device}')\n"
    "torch.manual_seed(0)                                   # the same initial weights on every rank\n"
    "model = DDP(Net().to(device))\n"
    "opt = torch.optim.Adam(model.parameters(), lr=0.01)\n"
    "x, y = X[rank::world_size].to(device), Y[rank::world_size].to(device)   # this rank's share\n"
    "for step in range(STEPS):\n"
    "    loss = nn.functional.cross_entropy(model(x), y)\n"
    "    opt.zero_grad()\n"
    "    loss.backward()                                    # gradients averaged over every rank on every node\n"
    "    opt.step()\n"
    "    if rank == 0 and step % 50 == 0:\n"
    "        print(f'step {step}: loss {loss.item():.3f}')\n"
    "final_loss = loss.item()")

EVALUATION = (
    "%%distributed --nodes {NODES} --nproc-per-node {NPROC_PER_NODE} --rdzv-host {RDZV_HOST} {DEVICE_OPTION}\n"
    "import torch.distributed as dist\n\n"
    "# The ranks are warm: no new processes, no new rendezvous. `model` (rank 0's, brought back above) goes out\n"
    "# again with the cell; each rank scores its share and the counts are added up over the nodes.\n"
    "x, y = X[rank::world_size], Y[rank::world_size]\n"
    "with torch.no_grad():\n"
    "    counts = torch.tensor([float((model(x).argmax(1) == y).sum()), float(len(y))])\n"
    "dist.all_reduce(counts)\n"
    "accuracy = (counts[0] / counts[1]).item()")

cells = [
    new_markdown_cell(
        "# One cell on several machines\n\n"
        "`%%distributed --nodes N --nproc-per-node M --rdzv-host ADDRESS` runs the cell as N × M ranks on N "
        "machines. Each machine runs a *node agent* (`python -m nbtrain.node --join … --token-file …`), torch "
        "elastic's agent underneath, as under `torchrun`; the kernel decides the group and hosts its store. "
        "Everything else is as on one machine: notebook names go in, names assigned on rank 0 come back, "
        "output is labelled with its node and rank, ranks stay warm for the next cell.\n\n"
        "**By default this notebook emulates two nodes on this machine** (agents on 127.0.0.2 and 127.0.0.3). "
        "On a cluster set `EMULATE = 0`, `RDZV_HOST` to this machine's address the nodes can reach, and run "
        "the printed join command on each node (`srun`, a Kubernetes Job, ssh: see docs/clusters.md)."),
    new_code_cell(
        "# Where the nodes come from, and sizes: small by default so it runs anywhere.\n"
        "RDZV_HOST = '127.0.0.1'   # this kernel's address, as the nodes reach it\n"
        "EMULATE = 2               # node agents started on this machine; 0 on a real cluster\n"
        "NODES = 2\n"
        "NPROC_PER_NODE = 1        # ranks on each node (GPUs per node on a GPU cluster)\n"
        "DEVICE_OPTION = '--cpu'   # '' on GPU nodes: NCCL, a GPU per rank\n"
        "STEPS = 200", metadata={"tags": ["parameters"]}),
    new_code_cell("%load_ext nbtrain"),
    new_markdown_cell("Ordinary notebook code: a model class and a data set, defined here, used on every node."),
    new_code_cell(
        "import torch\nfrom torch import nn\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, width=32):\n"
        "        super().__init__()\n"
        "        self.layers = nn.Sequential(nn.Linear(2, width), nn.ReLU(), nn.Linear(width, 2))\n\n"
        "    def forward(self, x):\n"
        "        return self.layers(x)\n\n"
        "g = torch.Generator().manual_seed(0)\n"
        "X = torch.randn(2048, 2, generator=g)\n"
        "Y = ((X[:, 0] ** 2 + X[:, 1] ** 2) < 1.0).long()   # inside the unit circle or not"),
    new_markdown_cell(
        "## The nodes join\n\n"
        "`%distributed_nodes --rdzv-host ADDRESS` makes the kernel listen for nodes now and prints the join "
        "command (a `%%distributed --nodes` cell would print it too, then wait). It names a file of mode "
        "0600 that holds the join token — the token itself is never printed, so this notebook, saved, does "
        "not hold it. The token is this pool's only: it pins the kernel's TLS certificate and authenticates "
        "both sides; treat it as a password (it expires after an hour; `--revoke` replaces it). With "
        "`--emulate N` the kernel starts N agents itself, from 127.0.0.2, 127.0.0.3, …, the token on their "
        "stdin."),
    new_code_cell("%distributed_nodes --rdzv-host {RDZV_HOST} --emulate {EMULATE}"),
    new_markdown_cell(
        "## Names in, results back\n\n"
        "The cell waits until `NODES` nodes have joined, then torch elastic starts `NPROC_PER_NODE` ranks on "
        "each. `Net`, `X`, `Y` and `STEPS` cross the network once per node; each node shares them with its "
        "ranks through its own /dev/shm. Output from other ranks is labelled `[node b rank 1]`."),
    new_code_cell(TRAINING),
    new_code_cell(
        "print(f'back in the notebook: {type(model).__name__}, final loss {final_loss:.3f}')\n"
        "assert final_loss < 0.5"),
    new_markdown_cell(
        "## A warm re-run\n\n"
        "The nodes and their ranks stay up between cells, like local ranks: the next cell starts in a "
        "fraction of a second (the summary says *warm*)."),
    new_code_cell(EVALUATION),
    new_code_cell("print(f'accuracy over every node: {accuracy:.1%}')"),
    new_markdown_cell(
        "## The nodes\n\n"
        "`%distributed_nodes` lists the joined nodes: their address, GPUs, CPUs, state, and the machine's load "
        "from the heartbeats each node sends every second (a node silent for 5 s is reported lost and the "
        "run stopped)."),
    new_code_cell("%distributed_nodes"),
    new_markdown_cell(
        "## The end\n\n"
        "`%distributed_shutdown` stops the warm ranks and releases the nodes: their agents exit (they also exit "
        "when the kernel does; an agent never outlives its pool)."),
    new_code_cell("%distributed_shutdown"),
]

for i, cell in enumerate(cells):
    cell.id = f"multinode-{i}"  # stable ids: regenerating changes nothing that did not change
nbformat.write(new_notebook(cells=cells, metadata=KERNEL), "notebooks/multinode.ipynb")
