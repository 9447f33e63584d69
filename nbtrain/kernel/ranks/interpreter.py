"""What a rank's interpreter starts with, spawned or forked from the zygote (:mod:`.zygote`): the same for both."""

from __future__ import annotations

import os

# nbtrain/, whose parent directory goes first on the ranks' path: they import the same nbtrain as the notebook
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def interpreter_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the kernel's package path first and the ranks' matplotlib backend (the kernel's inline one
    needs IPython)."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["MPLBACKEND"] = "module://nbtrain.rank.figures"
    return env
