"""Writes the teaching notebooks in notebooks/ (kept as code so their cells are reviewed like code).

    python scripts/make_notebooks.py

Each notebook has one cell tagged ``parameters`` with its sizes, so CI runs it small on a CPU and a GPU
server runs it at full size (``scripts/run_notebook.py --param NAME=VALUE``). Cells that show an error on
purpose are tagged ``raises-exception``, so the notebook still runs top to bottom.
"""

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from notebook_cells import KERNEL, NET_CLASS, parameters


def failing(source):
    return new_code_cell(source, metadata={"tags": ["raises-exception"]})


cells = [
    new_markdown_cell(
        "# nbtrain quickstart: train on several ranks from one cell\n\n"
        "A model and data defined in ordinary notebook cells are trained with PyTorch DDP by a cell that starts "
        "with `%%distributed`. Each rank is its own process; the trained model comes back into the notebook. "
        "On a laptop this runs on the CPU (gloo); on a GPU server each rank gets a GPU (NCCL)."),
    parameters("# Sizes: small by default so it runs anywhere in seconds.\n"
               "RANKS = None   # None: one rank per GPU, or 2 on a machine without GPUs\nEPOCHS = 20\nSAMPLES = 4096"),
    new_code_cell("%load_ext nbtrain"),
    new_markdown_cell("Ordinary notebook code: a model class, a helper function and a data set."),
    new_code_cell(
        NET_CLASS +
        "def make_data(n, seed=0):\n"
        "    g = torch.Generator().manual_seed(seed)\n"
        "    x = torch.randn(n, 2, generator=g)\n"
        "    y = ((x[:, 0] ** 2 + x[:, 1] ** 2) < 1.0).long()   # inside the unit circle or not\n"
        "    return x, y\n\n"
        "X, Y = make_data(SAMPLES)\nX.shape, Y.float().mean().item()"),
    new_markdown_cell(
        "The distributed cell. Every rank runs it with `rank`, `world_size` and `device` set and the process "
        "group ready; it reads `Net`, `X`, `Y` and `EPOCHS` from the notebook. `nbtrain.log` records the loss "
        "without slowing the loop. Names assigned on rank 0 (`model`, `final_loss`, ...) come back."),
    new_code_cell(
        "%%distributed {RANKS or ''}\n"
        "import nbtrain\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "torch.manual_seed(0)\n"
        "model = DDP(Net().to(device))\n"
        "opt = torch.optim.Adam(model.parameters(), lr=0.01)\n"
        "x, y = X[rank::world_size].to(device), Y[rank::world_size].to(device)   # this rank's share\n"
        "for epoch in range(EPOCHS):\n"
        "    for i in range(0, len(x), 256):\n"
        "        loss = nn.functional.cross_entropy(model(x[i:i + 256]), y[i:i + 256])\n"
        "        opt.zero_grad()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "        nbtrain.log(loss=loss)\n"
        "    if rank == 0 and epoch % 5 == 0:\n"
        "        print(f\"epoch {epoch}: loss {loss.item():.3f}\")\n"
        "final_loss = loss.item()"),
    new_markdown_cell("Back in the notebook: the trained model is an ordinary `Net` on the CPU, and `history` holds "
                      "every logged value."),
    new_code_cell(
        "with torch.no_grad():\n"
        "    accuracy = (model(X).argmax(1) == Y).float().mean().item()\n"
        "first, last = history['loss'].values[0], history['loss'].values[-1]\n"
        "print(f\"model: {type(model).__name__}, loss {first:.3f} -> {last:.3f}, accuracy {accuracy:.1%}\")\n"
        "assert last < first, 'the loss should go down'"),
]

nbformat.write(new_notebook(cells=cells, metadata=KERNEL), "notebooks/quickstart.ipynb")

troubleshooting = [
    new_markdown_cell(
        "# When things go wrong\n\n"
        "Distributed code fails in ways single-process code does not: one rank raises while the others wait, "
        "a rank never reaches a collective, the machine kills a process, a notebook object cannot be sent. "
        "This notebook causes each on purpose and shows what nbtrain tells you, and how to fix it."),
    parameters("RANKS = 2\nHANG_TIMEOUT = 5   # seconds a collective may wait before it gives up"),
    new_code_cell("%load_ext nbtrain\nimport torch"),
    new_markdown_cell(
        "## An exception on one rank\n\n"
        "Rank 1 divides by zero; rank 0 is already waiting for it in `all_reduce`. nbtrain shows the failing "
        "rank's traceback with the line numbers of *this* cell, says where the other rank was, and stops "
        "it at once (not after the collective timeout). Nothing is assigned in the notebook."),
    failing(
        "%%distributed {RANKS} --cpu\n"
        "import torch.distributed as dist\n"
        "scale = 1 / (rank - 1)      # rank 1 divides by zero\n"
        "t = torch.ones(1) * scale\n"
        "dist.all_reduce(t)"),
    new_markdown_cell(
        "## A hang: a rank that never reaches a collective\n\n"
        "Here rank 1 is stuck in a loop while rank 0 waits for it. After `--timeout` seconds the waiting rank "
        "gives up, and nbtrain shows where every other rank was at that moment: the stuck rank, and its line. "
        "(Pressing the stop button does the same at once: every rank's position, then everything is ended.)"),
    failing(
        "%%distributed {RANKS} --cpu --timeout {HANG_TIMEOUT}\n"
        "import time\n"
        "import torch.distributed as dist\n"
        "if rank == 1:\n"
        "    while True:              # stuck: never reaches the barrier\n"
        "        time.sleep(0.1)\n"
        "dist.barrier()"),
    new_markdown_cell(
        "## A rank killed by the system\n\n"
        "When the out-of-memory killer (or anything else) kills a rank, there is no Python exception to show. "
        "nbtrain names the rank, the signal and the usual cause, and quotes the rank's last output."),
    failing(
        "%%distributed {RANKS} --cpu\n"
        "import os, signal\n"
        "print('allocating a very large batch...')\n"
        "if rank == 1:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)   # what the OOM killer does\n"
        "import torch.distributed as dist\n"
        "dist.barrier()"),
    new_markdown_cell(
        "## A notebook variable that cannot be sent\n\n"
        "Ranks are separate processes, so the variables a cell reads are pickled. A lock, an open file or a "
        "database connection cannot be; nbtrain names the variable and its type before starting anything. "
        "The fix: create such objects inside the `%%distributed` cell."),
    new_code_cell("import threading\nlock = threading.Lock()\nsteps = 3"),
    failing("%%distributed {RANKS} --cpu\nwith lock:\n    total = steps * world_size"),
    new_code_cell("%%distributed {RANKS} --cpu\nimport threading\nlock = threading.Lock()   # made inside the cell: fine\n"
                  "with lock:\n    total = steps * world_size"),
    new_code_cell("print('total =', total)   # the kernel survived every failure above, and results still come back"),
    new_markdown_cell(
        "## Stopping a run\n\n"
        "The stop button (or *Kernel → Interrupt*) ends every rank and its DataLoader workers within 3 seconds "
        "and raises `KeyboardInterrupt` here, after listing where each rank was. Below, a timer presses it "
        "for us after 3 seconds."),
    failing(
        "import os, signal, threading\n"
        "threading.Timer(3, os.kill, (os.getpid(), signal.SIGINT)).start()   # 'press stop' in 3 s"),
    failing(
        "%%distributed {RANKS} --cpu\n"
        "import time\n"
        "for step in range(10**9):\n"
        "    time.sleep(0.05)"),
    new_code_cell("%distributed_shutdown"),
]
nbformat.write(new_notebook(cells=troubleshooting, metadata=KERNEL), "notebooks/troubleshooting.ipynb")

from_script = [
    new_markdown_cell(
        "# An existing torchrun script, run unchanged in a cell\n\n"
        "A training script written for `torchrun --nproc-per-node N rank/train.py` reads RANK/LOCAL_RANK/WORLD_SIZE "
        "from the environment, calls `dist.init_process_group()` itself and guards its entry point with "
        "`if __name__ == \"__main__\":`. Paste it into a `%%distributed N` cell and it runs as is: the "
        "environment is the one torchrun sets, the process group it asks for is already there, and its "
        "`destroy_process_group()` keeps the warm ranks for the next cell. Its variables come back."),
    parameters("RANKS = 2\nSTEPS = 200"),
    new_code_cell("%load_ext nbtrain"),
    new_code_cell(
        "%%distributed {RANKS} --cpu\n"
        "# ---- rank/train.py, unchanged ----\n"
        "import os\n"
        "import torch\n"
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "def main(steps):\n"
        "    dist.init_process_group(backend=\"gloo\")\n"
        "    rank, world = int(os.environ[\"RANK\"]), int(os.environ[\"WORLD_SIZE\"])\n"
        "    torch.manual_seed(0)\n"
        "    model = DDP(torch.nn.Linear(10, 1))\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        "    x = torch.randn(512, 10)\n"
        "    y = x.sum(dim=1, keepdim=True)\n"
        "    x, y = x[rank::world], y[rank::world]\n"
        "    for step in range(steps):\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        if rank == 0 and step % 50 == 0:\n"
        "            print(f\"step {step}: loss {loss.item():.4f}\")\n"
        "    dist.destroy_process_group()\n"
        "    return model.module, loss.item()\n\n"
        "if __name__ == \"__main__\":\n"
        "    model, final_loss = main(int(os.environ.get(\"STEPS\", \"200\")))"),
    new_markdown_cell("The script's `model` and `final_loss` are now notebook variables:"),
    new_code_cell("print(f\"final loss {final_loss:.4f}; learned weights {model.weight.data.flatten()[:3].tolist()}\")\n"
                  "assert final_loss < 0.1"),
    new_markdown_cell("Options the script reads from its environment can be set with `--env`:"),
    new_code_cell("%%distributed {RANKS} --cpu --env STEPS={STEPS} --out final_loss\n"
                  "import os\nfinal_loss = float(os.environ['STEPS'])"),
    new_code_cell("print(final_loss)\n%distributed_shutdown"),
]
nbformat.write(new_notebook(cells=from_script, metadata=KERNEL), "notebooks/from_script.ipynb")
