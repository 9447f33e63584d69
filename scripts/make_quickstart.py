"""Writes notebooks/quickstart.ipynb (kept as code so its cells are reviewed like code)."""

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# nbtrain quickstart: train on several ranks from one cell\n\n"
        "A model and data defined in ordinary notebook cells are trained with PyTorch DDP by a cell that starts "
        "with `%%distributed`. Each rank is its own process; the trained model comes back into the notebook. "
        "On a laptop this runs on the CPU (gloo); on a GPU server each rank gets a GPU (NCCL)."),
    new_code_cell("# Sizes: small by default so it runs anywhere in seconds.\nRANKS = 2\nEPOCHS = 20\nSAMPLES = 4096",
                  metadata={"tags": ["parameters"]}),
    new_code_cell("%load_ext nbtrain"),
    new_markdown_cell("Ordinary notebook code: a model class, a helper function and a data set."),
    new_code_cell(
        "import torch\nfrom torch import nn\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, width=64):\n"
        "        super().__init__()\n"
        "        self.layers = nn.Sequential(nn.Linear(2, width), nn.ReLU(), nn.Linear(width, 2))\n\n"
        "    def forward(self, x):\n"
        "        return self.layers(x)\n\n"
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
        "%%distributed {RANKS}\n"
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

nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
nbformat.write(nb, "notebooks/quickstart.ipynb")
