"""The join token, kept out of everything that is saved or shown to other users.

A token lets its holder join the pool — and so run code as the notebook's user on the ranks and, through the
results they send back, in the kernel. It is a password, so it never goes where others can read it:

* not into cell outputs (a notebook is saved, shared, committed): the kernel writes it to a file of mode 0600
  in the user's Jupyter runtime directory (:class:`TokenFile`), and the join command it prints names that
  file (``--token-file``); on another machine the file is copied there or piped in (``--token -``);
* not into a command line (``/proc/<pid>/cmdline`` is readable by every local user): agents read it from the
  file, stdin or the environment variable ``NBTRAIN_JOIN_TOKEN`` (:mod:`nbtrain.node.token`), never from argv;
* not for long: it admits nodes for :data:`DEFAULT_TTL_S` (``--token-ttl``), and ``%distributed_nodes
  --revoke`` replaces it at once (nodes already joined stay: they proved the secret when they joined).
"""

from __future__ import annotations

import contextlib
import os
import re

DEFAULT_TTL_S = 3600.0
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> float:
    """``90``, ``30m``, ``2h``, ``1d`` → seconds; :class:`ValueError` that says how to write it."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"--token-ttl {text!r}: give a duration such as 900, 30m, 2h or 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def token_dir() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return os.path.join(jupyter_runtime_dir(), "nbtrain", "tokens")


FILE_PATTERN = re.compile(r"pool-(\d+)-\w+\.token$")  # group 1: the kernel's pid (for the sweep of dead kernels')


class TokenFile:
    """``<jupyter runtime dir>/nbtrain/tokens/pool-<kernel pid>-<id>.token``, mode 0600 in a 0700 directory."""

    def __init__(self, pool_id: str, directory: str | None = None) -> None:
        self.directory = directory or token_dir()
        self.path = os.path.join(self.directory, f"pool-{os.getpid()}-{pool_id}.token")

    def write(self, token: str) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.replace(temporary, self.path)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def sweep_tokens() -> int:
    """The token files of kernels that are no longer running (killed: they could not remove them)."""
    from ...common.leftovers import sweep_dead

    return sweep_dead(token_dir(), FILE_PATTERN)
