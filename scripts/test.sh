#!/usr/bin/env bash
# Install nbtrain with its test dependencies (cached virtualenv, see scripts/venv.sh) and run every test.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$here/scripts/venv.sh")
cd "$here"
# This checkout's nbtrain, in this process and every kernel, rank and agent it starts (see scripts/venv.sh).
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" -m pytest "$@"
