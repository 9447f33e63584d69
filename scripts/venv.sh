#!/usr/bin/env bash
# Create (or reuse) the virtualenv nbtrain is developed and tested in, and print its path.
#
# The environment lives outside the clone, under ${NBTRAIN_VENV_ROOT:-~/.cache/nbtrain/venvs}, in a
# folder named by a hash of the dependency spec (pyproject.toml's requirements and the Python version), so a warm machine reuses it and a
# change of dependencies builds a fresh one. The same environment serves every checkout with the same
# dependencies: the scripts that run code put their own checkout first on PYTHONPATH (see the end of this file).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=${NBTRAIN_VENV_ROOT:-$HOME/.cache/nbtrain/venvs}
key=$(python3 - "$here/pyproject.toml" <<'PY'
import hashlib, json, sys, tomllib
spec = tomllib.load(open(sys.argv[1], "rb"))
deps = {"build": spec["build-system"], "deps": spec["project"]["dependencies"],
        "extras": spec["project"].get("optional-dependencies", {}), "python": sys.version.split()[0]}
print(hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()[:16])
PY
)
venv="$root/$key"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
    echo "nbtrain: building the environment in $venv (first time only; torch is a large download)" >&2
    rm -rf "$venv"
    mkdir -p "$root"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    "$venv/bin/python" -m pip install -q -e "$here[test]" >&2
    touch "$venv/.complete"
fi
# Build this checkout's JavaScript (the JupyterLab extension, the dashboard's chart) when its sources are newer
# than its last build, as the editable install's build hook does. The environment's own editable nbtrain is
# never re-pointed at this checkout: scripts/test.sh and scripts/quickstart.sh put the checkout first on
# PYTHONPATH, which the kernels, ranks and agents they start inherit, so two checkouts can share one environment
# at the same time and each runs its own code. The environment's bin/ goes first on PATH for the builder's jlpm.
PATH="$venv/bin:$PATH" "$venv/bin/python" - "$here" >&2 <<'PY'
import pathlib
import sys
import tomllib

from hatch_jupyter_builder import npm_builder

root = pathlib.Path(sys.argv[1])
hook = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["hooks"]["jupyter-builder"]
folders = ("path", "source_dir", "build_dir")
npm_builder("wheel", "editable", **{k: str(root / v) if k in folders else v for k, v in hook["build-kwargs"].items()})
PY
echo "$venv"
