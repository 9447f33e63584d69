"""What every notebook generator in scripts/ shares: the kernel spec, the papermill-style parameters cell, and
writing a notebook whose cell ids stay the same from one generation to the next (so a regenerated notebook
differs from the committed one only where its cells changed)."""

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

# The small classifier of the teaching notebooks, as the first lines of their model cell.
NET_CLASS = (
    "import torch\nfrom torch import nn\n\n"
    "class Net(nn.Module):\n"
    "    def __init__(self, width=64):\n"
    "        super().__init__()\n"
    "        self.layers = nn.Sequential(nn.Linear(2, width), nn.ReLU(), nn.Linear(width, 2))\n\n"
    "    def forward(self, x):\n"
    "        return self.layers(x)\n\n"
)

KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}


def parameters(source):
    return new_code_cell(source, metadata={"tags": ["parameters"]})


def write(cells, name):
    """Write notebooks/NAME.ipynb with cell ids that stay the same from one generation to the next."""
    for i, cell in enumerate(cells):
        cell.id = f"{name}-{i}"
    nbformat.write(new_notebook(cells=cells, metadata=KERNEL), f"notebooks/{name}.ipynb")
