"""Save the dashboard's final picture that a run left in an executed notebook (how docs/dashboard.png is made).

    python scripts/run_notebook.py notebooks/monitoring.ipynb
    python scripts/dashboard_png.py build/monitoring.executed.ipynb docs/dashboard.png

The picture is the ``image/png`` output of the first ``%%distributed`` cell that has one: what the
dashboard leaves in the cell when the run ends, exactly as a reader of the saved notebook sees it.
"""

from __future__ import annotations

import argparse
import base64
import sys

import nbformat


def dashboard_png(nb) -> bytes:
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("%%distributed"):
            for output in cell.get("outputs", []):
                if "image/png" in output.get("data", {}):
                    return base64.b64decode(output["data"]["image/png"])
    raise SystemExit("no %%distributed cell with a dashboard picture: was the notebook executed, with the dashboard on?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", help="an executed notebook, such as build/monitoring.executed.ipynb")
    parser.add_argument("png", help="where to write the picture")
    args = parser.parse_args()
    image = dashboard_png(nbformat.read(args.notebook, as_version=4))
    with open(args.png, "wb") as f:
        f.write(image)
    print(f"saved the dashboard picture of {args.notebook} ({len(image) // 1024} KiB) to {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
