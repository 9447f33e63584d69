#!/usr/bin/env bash
# Install nbtrain (cached virtualenv, see scripts/venv.sh) and execute notebooks/quickstart.ipynb headless
# through a real Jupyter kernel; print what it computed and save the executed copy next to it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$here/scripts/venv.sh")
cd "$here"
# This checkout's nbtrain, in this process and every kernel, rank and agent it starts (see scripts/venv.sh).
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" scripts/run_notebook.py notebooks/quickstart.ipynb "$@"
