"""Execute a notebook through a real kernel (nbclient), print its outputs, save the executed copy.

    python scripts/run_notebook.py notebooks/quickstart.ipynb [--out executed.ipynb] [--param NAME=VALUE ...]

``--param`` overrides assignments in the cell tagged ``parameters`` (so CI runs small, a GPU runs big).
The kernel is this interpreter's own (ipykernel), so the notebook sees the same installation.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import nbformat
from nbclient import NotebookClient


def apply_parameters(nb, params: dict[str, str]) -> None:
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            for name, value in params.items():
                pattern = re.compile(rf"^{re.escape(name)}\s*=.*$", re.M)
                if not pattern.search(cell.source):
                    raise SystemExit(f"parameter {name!r} is not set in the notebook's parameters cell")
                cell.source = pattern.sub(f"{name} = {value}", cell.source)


def show_outputs(nb) -> None:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            if text:
                print(f"[cell {i}] {text.rstrip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--out", help="where to save the executed notebook (default: <name>.executed.ipynb in build/)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args()

    nb = nbformat.read(args.notebook, as_version=4)
    apply_parameters(nb, dict(p.split("=", 1) for p in args.param))
    started = time.monotonic()
    client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(os.path.abspath(args.notebook))}})
    client.execute()
    show_outputs(nb)
    out = args.out or os.path.join("build", os.path.basename(args.notebook).replace(".ipynb", ".executed.ipynb"))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    nbformat.write(nb, out)
    print(f"executed {args.notebook} in {time.monotonic() - started:.1f} s; saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
