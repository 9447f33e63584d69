"""Writes notebooks/interactive.ipynb: working step by step with a model that stays on the ranks.

    python scripts/make_interactive_notebook.py

Like scripts/make_notebooks.py and scripts/make_course_notebooks.py, the cells are kept here as code so they
are reviewed like code. One cell is tagged ``parameters`` (small by default: 2 ranks on a laptop CPU, a few
seconds a cell; one rank per GPU on a GPU server). The notebook runs headless: no ``input()``, no debugger.
tests/test_notebooks.py executes it through a real kernel.
"""

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebook_cells import NET_CLASS, parameters, write

interactive = [
    new_markdown_cell(
        "# Working interactively: a model that stays on the ranks\n\n"
        "A plain `%%distributed` cell starts from a fresh namespace every time: what it builds is gone when it "
        "ends (except what comes back to the notebook). That makes a cell repeatable, but when you explore — "
        "build a model, train a little, look at the loss, evaluate, train some more — you want the model, its "
        "optimizer and the data loader to *stay* on the ranks between cells, the way variables stay in a "
        "notebook.\n\n"
        "A **session** does that: every cell with `--session s1` runs in the same namespace on the same rank "
        "processes, with the process group kept up. This notebook builds a model in one cell, trains it in the "
        "next (drawing the loss with matplotlib on rank 0), evaluates it, lists the session, brings the model "
        "into the notebook, profiles a few training steps, and closes the session."),
    parameters(
        "RANKS = None             # None: one rank per GPU, or 2 on a machine without GPUs\n"
        "SAMPLES = 4096           # training points (and a quarter as many for evaluation)\n"
        "BATCH = 32               # points per rank per step\n"
        "PROFILE_STEPS = 3        # optimizer steps the profiler records\n"
        "LOG_DIR = 'runs/interactive'   # where the profiler's traces go (LOG_DIR/profile)"),
    new_code_cell("%load_ext nbtrain"),
    new_markdown_cell(
        "## Ordinary notebook code\n\n"
        "A small network and a toy data set: points in the plane, labelled by whether they lie inside the "
        "unit circle. The ranks read `Net`, `X`, `Y`, ... from the notebook when a cell uses them."),
    new_code_cell(
        NET_CLASS +
        "def circle(n, seed):\n"
        "    g = torch.Generator().manual_seed(seed)\n"
        "    x = torch.randn(n, 2, generator=g)\n"
        "    return x, ((x ** 2).sum(dim=1) < 1.0).long()   # 1: inside the unit circle\n\n"
        "X, Y = circle(SAMPLES, seed=0)\n"
        "X_test, Y_test = circle(SAMPLES // 4, seed=1)"),
    new_markdown_cell(
        "## Cell 1: build the model and the loader in session `s1`\n\n"
        "`--session s1` starts the session (its ranks, and an empty namespace on each). Everything the cell "
        "assigns stays there. `--out -` brings nothing back to the notebook: the model lives on the ranks.\n\n"
        "The `DistributedSampler` gives each rank its own share of the data (it asks the process group for "
        "the rank and the number of ranks)."),
    new_code_cell(
        "%%distributed {RANKS or ''} --session s1 --out -\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "from torch.utils.data import DataLoader, DistributedSampler, TensorDataset\n\n"
        "torch.manual_seed(0)                       # the same initial weights on every rank\n"
        "model = DDP(Net().to(device))\n"
        "opt = torch.optim.Adam(model.parameters(), lr=0.01)\n"
        "train_set = TensorDataset(X, Y)\n"
        "sampler = DistributedSampler(train_set, shuffle=True, seed=0)\n"
        "loader = DataLoader(train_set, batch_size=BATCH, sampler=sampler)\n"
        "epochs_done = 0\n"
        "if rank == 0:\n"
        "    print(f\"built on {world_size} ranks: {len(loader)} batches of {BATCH} per rank and epoch\")"),
    new_markdown_cell(
        "The notebook itself has no `model`: it is on the ranks."),
    new_code_cell("print('model' in globals())"),
    new_markdown_cell(
        "## Cell 2: train an epoch, and plot its loss\n\n"
        "This cell uses `model`, `opt`, `sampler` and `loader` from cell 1 — the session kept them. Run it "
        "again and it trains a further epoch of the same model (the epoch counter goes up, the loss goes "
        "on down).\n\n"
        "Only rank 0 draws: `plt.show()` on rank 0 shows the figure in this cell, as in a notebook. "
        "(On the other ranks nbtrain would close figures without drawing them, so as not to show N copies.)"),
    new_code_cell(
        "%%distributed {RANKS or ''} --session s1 --out epoch_loss\n"
        "import matplotlib.pyplot as plt\n"
        "import torch.nn.functional as F\n\n"
        "sampler.set_epoch(epochs_done)            # a new order of the data each epoch\n"
        "model.train()\n"
        "losses = []\n"
        "for x, y in loader:\n"
        "    loss = F.cross_entropy(model(x.to(device)), y.to(device))\n"
        "    opt.zero_grad()\n"
        "    loss.backward()                        # DDP averages the gradients over the ranks here\n"
        "    opt.step()\n"
        "    losses.append(loss.item())\n"
        "epochs_done += 1\n"
        "epoch_loss = sum(losses) / len(losses)\n\n"
        "if rank == 0:\n"
        "    print(f\"epoch {epochs_done}: mean loss {epoch_loss:.3f} (first batch {losses[0]:.3f}, \"\n"
        "          f\"last {losses[-1]:.3f})\")\n"
        "    fig, ax = plt.subplots(figsize=(6, 3))\n"
        "    ax.plot(losses)\n"
        "    ax.set_xlabel('step')\n"
        "    ax.set_ylabel('loss (rank 0)')\n"
        "    ax.set_title(f'epoch {epochs_done}')\n"
        "    plt.show()"),
    new_markdown_cell(
        "## Cell 3: evaluate\n\n"
        "Each rank scores its share of the test points; `all_reduce` adds the counts up over the ranks. "
        "`model.eval()` and `torch.no_grad()` as in any PyTorch evaluation."),
    new_code_cell(
        "%%distributed {RANKS or ''} --session s1 --out test_acc\n"
        "import torch.distributed as dist\n\n"
        "model.eval()\n"
        "x, y = X_test[rank::world_size].to(device), Y_test[rank::world_size].to(device)\n"
        "with torch.no_grad():\n"
        "    counts = torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)], device=device)\n"
        "dist.all_reduce(counts)\n"
        "test_acc = (counts[0] / counts[1]).item()\n"
        "if rank == 0:\n"
        "    print(f\"test accuracy after {epochs_done} epoch(s): {test_acc:.1%}\")"),
    new_markdown_cell(
        "## What the session holds\n\n"
        "`%distributed_sessions` lists the sessions: their ranks, devices, how many cells they ran, each "
        "rank's memory, and the names the session holds on rank 0: what its cells assigned (`model`, `opt`, "
        "`loader`, `epochs_done`, ...) and the notebook names they read (`Net`, `X`, ...), which were sent "
        "once and are not sent again unless you assign them anew in the notebook."),
    new_code_cell("%distributed_sessions"),
    new_markdown_cell(
        "## Bring the model into the notebook\n\n"
        "`%distributed_pull s1 model` copies rank 0's `model` here: unwrapped from DDP and on the CPU, an "
        "ordinary `Net`. The session keeps its own. Here it scores the test points the same as cell 3 did."),
    new_code_cell("%distributed_pull s1 model"),
    new_code_cell(
        "with torch.no_grad():\n"
        "    notebook_acc = (model(X_test).argmax(dim=1) == Y_test).float().mean().item()\n"
        "print(f\"pulled: {type(model).__name__}; test accuracy in the notebook {notebook_acc:.1%}, \"\n"
        "      f\"on the ranks {test_acc:.1%}\")"),
    new_markdown_cell(
        "## Where the time goes: `--profile`\n\n"
        "`--profile 3` runs the cell under `torch.profiler` on every rank and records 3 optimizer steps "
        "(after skipping one and warming up on one). Under the cell, a table of the operators that took the "
        "most time on each rank, and how much of it was communication (the gradient all-reduce of DDP). "
        "The traces go to `LOG_DIR/profile` (with `--tensorboard LOG_DIR`), for Perfetto or TensorBoard. "
        "The cell trains a few more steps of the session's model."),
    new_code_cell(
        "%%distributed {RANKS or ''} --session s1 --profile {PROFILE_STEPS} --tensorboard {LOG_DIR} --out -\n"
        "import torch.nn.functional as F\n\n"
        "model.train()\n"
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = F.cross_entropy(model(x.to(device)), y.to(device))\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    if step == PROFILE_STEPS + 4:          # enough steps for the profiler's schedule\n"
        "        break"),
    new_markdown_cell(
        "## Close the session\n\n"
        "`%distributed_close s1` ends the session: its processes stop and give the memory back. "
        "(The model pulled into the notebook stays.) A later `--session s1` cell would start a new, empty one."),
    new_code_cell("%distributed_close s1\n%distributed_sessions"),
]
write(interactive, "interactive")
