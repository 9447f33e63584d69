"""Writes the course notebooks in notebooks/: image_classifier.ipynb and monitoring.ipynb.

    python scripts/make_course_notebooks.py

Like scripts/make_notebooks.py (the quickstart, troubleshooting and from_script notebooks) and
scripts/make_interactive_notebook.py (the interactive one), the cells are kept here as code so they are
reviewed like code. Each notebook has one cell tagged ``parameters`` with
its sizes: tiny by default, so CI runs it on a CPU in seconds; ``scripts/run_notebook.py --param
NAME=VALUE`` runs it at full size on a GPU server. Both run top to bottom, unchanged, on a laptop CPU and
on a GPU server. tests/test_notebooks.py executes them through a real kernel.
"""

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebook_cells import parameters, write

# The training cell of the image classifier. It appears twice in the notebook: the second time shows what
# running the same cell again does when its --checkpoint directory holds a checkpoint (it resumes).
CLASSIFIER_TRAINING = (
    "%%distributed {RANKS or ''} --amp {AMP} --grad-accum 2 --checkpoint {checkpoint_dir} --out model,val_acc\n"
    "import torch.distributed as dist\n"
    "import torch.nn.functional as F\n"
    "from torch.utils.data import DataLoader\n"
    "import nbtrain\n\n"
    "torch.manual_seed(0)                      # the same initial weights on every rank\n"
    "model = make_model()\n"
    "opt = torch.optim.Adam(model.parameters(), lr=LR)\n"
    "train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True, num_workers=WORKERS)\n"
    "val_loader = DataLoader(val_set, batch_size=2 * BATCH, num_workers=WORKERS)\n"
    "# device, DDP, autocast (--amp), a DistributedSampler per loader; restores the checkpoint if there is one\n"
    "model, opt, train_loader, val_loader = nbtrain.prepare(model, opt, train_loader, val_loader)\n"
    "if rank == 0:\n"
    "    print(f\"{world_size} ranks on {device.type}; mixed precision: {nbtrain.training_state().amp_dtype or 'off'}\")\n\n"
    "for epoch in nbtrain.epochs(EPOCHS):      # range(EPOCHS), starting at the saved epoch on a resume\n"
    "    model.train()\n"
    "    for images, labels in train_loader:   # this rank's share of the images, a new order each epoch\n"
    "        images, labels = images.to(device), labels.to(device)\n"
    "        loss = F.cross_entropy(model(images), labels)\n"
    "        nbtrain.backward(loss)            # backward of loss / 2: two micro-batches per step\n"
    "        opt.step()                        # steps on every second micro-batch only\n"
    "        opt.zero_grad()\n"
    "        nbtrain.log(loss=loss)            # buffered: no GPU sync\n\n"
    "    # Validation: every rank scores its share of the images, then the sums are added up over ranks.\n"
    "    model.eval()\n"
    "    totals = torch.zeros(3, device=device)   # sum of losses, correct answers, images\n"
    "    with torch.no_grad():\n"
    "        for images, labels in val_loader:\n"
    "            images, labels = images.to(device), labels.to(device)\n"
    "            logits = model(images)\n"
    "            totals[0] += F.cross_entropy(logits, labels, reduction=\"sum\")\n"
    "            totals[1] += (logits.argmax(dim=1) == labels).sum()\n"
    "            totals[2] += len(labels)\n"
    "    dist.all_reduce(totals)\n"
    "    val_loss, val_acc = (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()\n"
    "    nbtrain.log(val_loss=val_loss, val_acc=val_acc, step=(epoch + 1) * len(train_loader))\n"
    "    if rank == 0:\n"
    "        print(f\"epoch {epoch + 1}/{EPOCHS}: training loss {loss.item():.3f}, \"\n"
    "              f\"validation loss {val_loss:.3f}, accuracy {val_acc:.1%}\")\n"
    "    nbtrain.save_checkpoint()             # every rank calls it; rank 0 writes checkpoint.pt"
)

classifier = [
    new_markdown_cell(
        "# An image classifier on several ranks\n\n"
        "A torchvision ResNet learns to classify 32×32 colour images (CIFAR-10's ten classes) with PyTorch DDP, "
        "from one `%%distributed` cell. Along the way:\n\n"
        "* `nbtrain.prepare()` puts the model on each rank's device, wraps it in DDP and gives each rank its "
        "share of the data;\n"
        "* `--amp` picks the mixed precision: bf16 on GPUs that support it (fp16 on older ones), off on a CPU;\n"
        "* `--grad-accum 2` adds the gradients of two micro-batches before each optimizer step;\n"
        "* `--checkpoint DIR` saves the training at the end of every epoch; running the cell again resumes it;\n"
        "* `nbtrain.log()` feeds the live dashboard under the cell, and `history` afterwards.\n\n"
        "CIFAR-10 is downloaded when the machine can reach it (170 MB, once). Without a network, torchvision's "
        "`FakeData` stands in: random images of the same shape, so every cell runs, but there is nothing to "
        "learn beyond memorising the training images (the validation accuracy stays near chance, 10 %)."),
    parameters(
        "# Sizes: tiny by default, so the notebook runs on a laptop CPU in seconds.\n"
        "# On a GPU server, for a real run: IMAGES = 50000, VAL_IMAGES = 10000, EPOCHS = 10, BLOCKS = 2, BATCH = 128\n"
        "RANKS = None          # None: one rank per GPU, or 2 on a machine without GPUs\n"
        "IMAGES = 512          # training images (CIFAR-10 has 50,000)\n"
        "VAL_IMAGES = 256      # validation images (CIFAR-10 has 10,000)\n"
        "EPOCHS = 2            # epochs of the first run; the resumed run adds MORE_EPOCHS\n"
        "MORE_EPOCHS = 1\n"
        "BLOCKS = 1            # residual blocks per stage: 1 is a ResNet-10, 2 is torchvision's resnet18\n"
        "BATCH = 32            # images per rank and micro-batch\n"
        "LR = 2e-3\n"
        "WORKERS = 0           # DataLoader worker processes per rank\n"
        "AMP = \"auto\"          # auto (bf16 on recent GPUs, fp16 on older ones, off on CPU), bf16, fp16 or off\n"
        "DATA_DIR = None       # where CIFAR-10 is kept; None: a folder in the temporary directory\n"
        "CHECKPOINT_DIR = None # None: a new temporary directory"),
    new_code_cell("%load_ext nbtrain"),
    new_markdown_cell(
        "## The data\n\n"
        "Ordinary notebook code. The download is tried with a short network timeout, so a machine without "
        "network access falls back to `FakeData` at once instead of hanging. Either way the rest of the "
        "notebook sees two `Dataset` objects, `train_set` and `val_set`; the ranks receive them with the cell "
        "(CIFAR-10's image array travels once, through shared memory, not once per rank)."),
    new_code_cell(
        "import os\n"
        "import socket\n"
        "import tempfile\n\n"
        "import torch\n"
        "import torchvision\n"
        "from torch.utils.data import Subset\n"
        "from torchvision import transforms\n\n"
        "to_tensor = transforms.Compose([\n"
        "    transforms.ToTensor(),\n"
        "    transforms.Normalize((0.49, 0.48, 0.45), (0.25, 0.24, 0.26)),   # CIFAR-10's channel statistics\n"
        "])\n\n"
        "def load_cifar10(root, timeout=5.0):\n"
        "    \"\"\"CIFAR-10's training and test sets, downloaded if needed; None when they cannot be had.\"\"\"\n"
        "    previous = socket.getdefaulttimeout()\n"
        "    socket.setdefaulttimeout(timeout)      # fail fast without a network instead of hanging\n"
        "    try:\n"
        "        train = torchvision.datasets.CIFAR10(root, train=True, download=True, transform=to_tensor)\n"
        "        test = torchvision.datasets.CIFAR10(root, train=False, download=True, transform=to_tensor)\n"
        "        return train, test\n"
        "    except Exception as exc:               # no network, a proxy, a broken download...\n"
        "        print(f\"CIFAR-10 could not be downloaded ({type(exc).__name__}: {exc})\")\n"
        "        return None\n"
        "    finally:\n"
        "        socket.setdefaulttimeout(previous)\n\n"
        "data_dir = DATA_DIR or os.path.join(tempfile.gettempdir(), \"cifar10\")\n"
        "cifar = load_cifar10(data_dir)\n"
        "if cifar is not None:\n"
        "    all_train, all_val = cifar\n"
        "    data_name = \"CIFAR-10\"\n"
        "else:\n"
        "    fake = dict(image_size=(3, 32, 32), num_classes=10, transform=to_tensor)\n"
        "    all_train = torchvision.datasets.FakeData(size=IMAGES, random_offset=0, **fake)\n"
        "    all_val = torchvision.datasets.FakeData(size=VAL_IMAGES, random_offset=IMAGES, **fake)\n"
        "    data_name = \"FakeData (random images; validation accuracy stays near 10 %)\"\n\n"
        "train_set = Subset(all_train, range(min(IMAGES, len(all_train))))\n"
        "val_set = Subset(all_val, range(min(VAL_IMAGES, len(all_val))))\n"
        "print(f\"data set: {data_name}: {len(train_set)} training and {len(val_set)} validation images\")"),
    new_markdown_cell(
        "## The model\n\n"
        "torchvision's `ResNet` with `BLOCKS` residual blocks per stage (`BLOCKS = 2` is exactly "
        "`torchvision.models.resnet18(num_classes=10)`). A function defined in the notebook travels to the "
        "ranks by value, so each rank builds its own copy."),
    new_code_cell(
        "from torchvision.models.resnet import BasicBlock, ResNet\n\n"
        "def make_model():\n"
        "    return ResNet(BasicBlock, [BLOCKS] * 4, num_classes=10)\n\n"
        "print(f\"{sum(p.numel() for p in make_model().parameters()) / 1e6:.1f} M parameters\")\n"
        "checkpoint_dir = CHECKPOINT_DIR or tempfile.mkdtemp(prefix=\"nbtrain-classifier-\")"),
    new_markdown_cell(
        "## Training\n\n"
        "Every rank runs this cell with `rank`, `world_size` and `device` set. `{...}` in the magic's line is "
        "IPython's variable expansion: `{RANKS or ''}` leaves the number of ranks out when `RANKS` is None, so "
        "nbtrain starts one rank per GPU. While it runs, the dashboard under the cell shows each rank's device "
        "load and the curves logged with `nbtrain.log`: `loss` and `val_loss` share a panel. When it ends, "
        "a picture of the run stays in the cell. `--out model,val_acc` brings these two names back from rank 0."),
    new_code_cell(CLASSIFIER_TRAINING),
    new_code_cell(
        "first_run, first_epochs = history, EPOCHS   # the next run replaces `history`\n"
        "print(f\"back in the notebook: a {type(model).__name__} on \"\n"
        "      f\"{next(model.parameters()).device}; validation accuracy {val_acc:.1%}\")\n"
        "print(f\"checkpoint: {sorted(os.listdir(checkpoint_dir))}\")"),
    new_markdown_cell(
        "## Resuming: run the same cell again\n\n"
        "Training was cut short, or you want more epochs? Raise `EPOCHS` and run the training cell again (in "
        "your own notebook, simply re-run the cell above; here it is repeated below). `checkpoint.pt` is "
        "there, so `prepare()` restores the model, the optimizer, the loaders' positions, the random number "
        "generators and the step counters, and `nbtrain.epochs()` starts at the saved epoch: the curves go on "
        "where they stopped. `--no-resume` would start from scratch instead."),
    new_code_cell("EPOCHS += MORE_EPOCHS"),
    new_code_cell(CLASSIFIER_TRAINING),
    new_markdown_cell(
        "## Afterwards\n\n"
        "`history` holds every logged value (rank 0's series; `history.series(name, rank=1)` for another "
        "rank's). The resumed run's steps continue the first run's. The model is an ordinary CPU module: "
        "use it in the notebook."),
    new_code_cell(
        "per_epoch = len(first_run[\"loss\"]) // first_epochs        # micro-batches per epoch on rank 0\n"
        "first = sum(first_run[\"loss\"].values[:per_epoch]) / per_epoch\n"
        "last = sum(history[\"loss\"].values[-per_epoch:]) / per_epoch\n"
        "print(f\"steps: first run {first_run['loss'].steps[0]}..{first_run['loss'].steps[-1]}, \"\n"
        "      f\"resumed run {history['loss'].steps[0]}..{history['loss'].steps[-1]}\")\n"
        "print(f\"training loss, mean of the first epoch -> the last epoch: {first:.3f} -> {last:.3f}\")\n"
        "assert last < first, \"the training loss should go down\"\n\n"
        "model.eval()\n"
        "with torch.no_grad():   # on the notebook's CPU: at most 1000 images\n"
        "    images, labels = next(iter(torch.utils.data.DataLoader(val_set, batch_size=1000)))\n"
        "    predicted = model(images).argmax(dim=1)\n"
        "classes = getattr(all_val, \"classes\", None) or [str(c) for c in range(10)]\n"
        "print(f\"accuracy of the returned model on {len(labels)} validation images: \"\n"
        "      f\"{(predicted == labels).float().mean().item():.1%}\")\n"
        "print(\"first predictions:\", \", \".join(classes[int(p)] for p in predicted[:8]))"),
    new_markdown_cell("Stop the warm ranks, and remove the checkpoint if it was written to a temporary directory "
                      "(keep it to resume later)."),
    new_code_cell("%distributed_shutdown\n"
                  "import shutil\n"
                  "if CHECKPOINT_DIR is None:\n"
                  "    shutil.rmtree(checkpoint_dir)"),
]
write(classifier, "image_classifier")


monitoring = [
    new_markdown_cell(
        "# Watching a run: GPUs, curves and `history`\n\n"
        "What nbtrain shows while you train, and what you can do with it afterwards:\n\n"
        "* `%gpus` — the machine's GPUs (utilisation, memory, temperature, power, processes), live or as a "
        "table; on a machine without an NVIDIA GPU, its CPU and RAM;\n"
        "* the dashboard under a `%%distributed` cell — each rank's device load beside the curves it logs, "
        "training and validation twins drawn together;\n"
        "* `history` — every logged value, in the notebook, to plot or analyse as you like;\n"
        "* `--no-dashboard` — for when you want the cell's output only."),
    parameters(
        "RANKS = None          # None: one rank per GPU, or 2 on a machine without GPUs\n"
        "STEPS = 300           # optimizer steps\n"
        "EVAL_EVERY = 25       # steps between validations\n"
        "SAMPLES = 4096        # training points (and a quarter as many validation points)\n"
        "MONITOR_SECONDS = 3   # how long the live %gpus view below runs"),
    new_code_cell("%load_ext nbtrain"),
    new_markdown_cell(
        "## The machine\n\n"
        "`%gpus --once` prints a table of what is there now. It asks the NVIDIA driver through NVML — never "
        "CUDA, so the notebook's own process stays free of CUDA and the ranks can use every GPU."),
    new_code_cell("%gpus --once"),
    new_markdown_cell(
        "`%gpus` shows the same panel live under the cell, with one-minute sparklines, until its Stop button, "
        "`%gpus --stop`, or `--for` seconds (ten minutes when left out). It runs in the background: the "
        "notebook stays free for other cells. `--interval` sets the seconds between samples."),
    new_code_cell("%gpus --for {MONITOR_SECONDS} --interval 0.5"),
    new_markdown_cell(
        "## Logging several metrics\n\n"
        "A small classifier of two interleaved spirals, trained with a cosine learning-rate schedule. The cell "
        "logs the training loss and accuracy every step, the validation loss and accuracy every `EVAL_EVERY` "
        "steps, and the learning rate. Names that differ only by a `train`/`val` prefix or suffix share a "
        "panel of the dashboard: `train_loss` with `val_loss`, `train_acc` with `val_acc`. "
        "`nbtrain.log(total_steps=...)` once lets the progress line show the time left.\n\n"
        "`reduce=\"mean\"` logs the mean over all ranks (every rank makes the same call; the all-reduce is "
        "asynchronous, so the loop does not wait for it). Without it, each rank's values are its own."),
    new_code_cell(
        "import math\n"
        "import torch\n"
        "from torch import nn\n\n"
        "def spirals(n, seed):\n"
        "    \"\"\"Two interleaved spirals in the plane; the label says which one a point is on.\"\"\"\n"
        "    g = torch.Generator().manual_seed(seed)\n"
        "    label = torch.randint(0, 2, (n,), generator=g)\n"
        "    t = torch.rand(n, generator=g) * 3 * math.pi\n"
        "    angle = t + label * math.pi\n"
        "    x = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], dim=1) / (3 * math.pi)\n"
        "    return x + 0.03 * torch.randn(n, 2, generator=g), label\n\n"
        "X, Y = spirals(SAMPLES, seed=0)\n"
        "X_val, Y_val = spirals(SAMPLES // 4, seed=1)\n\n"
        "def make_model(width=128):\n"
        "    return nn.Sequential(nn.Linear(2, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),\n"
        "                         nn.Linear(width, 2))"),
    new_code_cell(
        "%%distributed {RANKS or ''} --out model,final_train_loss\n"
        "import nbtrain\n"
        "import torch.nn.functional as F\n\n"
        "torch.manual_seed(0)\n"
        "model = make_model()\n"
        "opt = torch.optim.Adam(model.parameters(), lr=0.01)\n"
        "schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)\n"
        "model, opt, schedule = nbtrain.prepare(model, opt, schedule)\n"
        "x, y = X[rank::world_size].to(device), Y[rank::world_size].to(device)     # this rank's share\n"
        "x_val, y_val = X_val[rank::world_size].to(device), Y_val[rank::world_size].to(device)\n\n"
        "nbtrain.log(total_steps=STEPS)\n"
        "for step in range(STEPS):\n"
        "    batch = torch.randint(0, len(x), (256,), device=device)\n"
        "    logits = model(x[batch])\n"
        "    loss = F.cross_entropy(logits, y[batch])\n"
        "    nbtrain.backward(loss)\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "    schedule.step()\n"
        "    accuracy = (logits.argmax(dim=1) == y[batch]).float().mean()\n"
        "    nbtrain.log(train_loss=loss, train_acc=accuracy, lr=schedule.get_last_lr()[0], step=step)\n"
        "    if (step + 1) % EVAL_EVERY == 0:\n"
        "        with torch.no_grad():\n"
        "            val_logits = model(x_val)\n"
        "        nbtrain.log(val_loss=F.cross_entropy(val_logits, y_val),\n"
        "                    val_acc=(val_logits.argmax(dim=1) == y_val).float().mean(),\n"
        "                    step=step, reduce=\"mean\")\n"
        "final_train_loss = loss.item()"),
    new_markdown_cell(
        "## Reading `history`\n\n"
        "After the cell, `history` holds every value every rank logged, at full resolution (the dashboard "
        "thins long series for drawing; `history` never does):\n\n"
        "* `history.names` — the series; `history[\"train_loss\"]` — rank 0's, with `.steps`, `.values`, "
        "`.times`;\n"
        "* `history.series(\"train_loss\", rank=1)` — another rank's; `history.ranks(name)` — which ranks "
        "logged it;\n"
        "* `history.mean(\"train_loss\")` — the mean over ranks at each step; `history.to_dict()` — plain "
        "lists, for pandas or JSON."),
    new_code_cell(
        "print(history)\n"
        "print(\"ranks that logged train_loss:\", history.ranks(\"train_loss\"))\n"
        "mean_loss = history.mean(\"train_loss\")\n"
        "print(f\"train_loss, mean over ranks: {mean_loss.values[0]:.3f} -> {mean_loss.values[-1]:.3f}\")\n"
        "print(f\"val_acc: {history['val_acc'].values[0]:.1%} -> {history['val_acc'].values[-1]:.1%}\")\n"
        "print(f\"lr: {history['lr'].values[0]:.4f} -> {history['lr'].values[-1]:.6f}\")"),
    new_markdown_cell("Your own figure, drawn from `history` with matplotlib:"),
    new_code_cell(
        "import matplotlib.pyplot as plt\n\n"
        "fig, (ax_loss, ax_acc, ax_lr) = plt.subplots(1, 3, figsize=(12, 3.2))\n"
        "for r in history.ranks(\"train_loss\"):\n"
        "    series = history.series(\"train_loss\", rank=r)\n"
        "    ax_loss.plot(series.steps, series.values, alpha=0.4, label=f\"train_loss, rank {r}\")\n"
        "ax_loss.plot(history[\"val_loss\"].steps, history[\"val_loss\"].values, \"o-\", label=\"val_loss (mean)\")\n"
        "ax_loss.set_yscale(\"log\")\n"
        "train_acc = history.mean(\"train_acc\")\n"
        "ax_acc.plot(train_acc.steps, train_acc.values, alpha=0.5, label=\"train_acc (mean)\")\n"
        "ax_acc.plot(history[\"val_acc\"].steps, history[\"val_acc\"].values, \"o-\", label=\"val_acc\")\n"
        "ax_lr.plot(history[\"lr\"].steps, history[\"lr\"].values)\n"
        "for ax, title in ((ax_loss, \"loss\"), (ax_acc, \"accuracy\"), (ax_lr, \"learning rate\")):\n"
        "    ax.set_title(title)\n"
        "    ax.set_xlabel(\"step\")\n"
        "ax_loss.legend(fontsize=8)\n"
        "ax_acc.legend(fontsize=8)\n"
        "fig.tight_layout()\n"
        "plt.show()"),
    new_markdown_cell(
        "## Without the dashboard\n\n"
        "`--no-dashboard` leaves only the cell's own output and the one-line summary (`--quiet` removes that "
        "too). `history` is filled all the same. `NBTRAIN_DASHBOARD=off` in the environment turns the "
        "dashboard off for every cell; `text` prints a status line every 10 s instead of the widget."),
    new_code_cell(
        "%%distributed {RANKS or ''} --no-dashboard\n"
        "import nbtrain\n"
        "for step in range(5):\n"
        "    nbtrain.log(countdown=5 - step)\n"
        "if rank == 0:\n"
        "    print(\"no dashboard under this cell\")"),
    new_code_cell("print(history)\n%distributed_shutdown"),
]
write(monitoring, "monitoring")
