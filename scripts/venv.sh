#!/usr/bin/env bash
# Create (or reuse) the virtualenv nbtrain is developed and tested in, and print its path.
#
# The environment lives outside the clone, under ${NBTRAIN_VENV_ROOT:-~/.cache/nbtrain/venvs}, in a
# folder named by a hash of the dependency spec (pyproject.toml's requirements and the Python version), so a warm machine reuses it and a
# change of dependencies builds a fresh one. nbtrain itself is installed editable, so the same
# environment serves every checkout with the same dependencies.
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
# Point the environment's editable install at this checkout (a cached env may come from another clone).
# The environment's bin/ goes first on PATH: the build hook runs its jlpm to build the JupyterLab extension.
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$here" >&2 2>/dev/null \
    || "$venv/bin/python" -m pip install -q --no-deps -e "$here" >&2
echo "$venv"
