"""Where a node agent gets its join token: a 0600 file, stdin or the environment — never its command line.

Every local user can read a process's command line (``ps``, ``/proc/<pid>/cmdline``), so a token given there
would let any of them join the pool and run code as the notebook's user. :func:`read_token` refuses it and
says what to use instead; it also refuses a token file that others can read, as ssh refuses such a key.
"""

from __future__ import annotations

import os
import stat

from ..wire.link import TOKEN_ENV


def read_token(argument: str | None, path: str | None, stdin) -> str:
    """The agent's token: from ``--token -`` (stdin), ``--token-file PATH`` or ``$NBTRAIN_JOIN_TOKEN``, in
    that order; :class:`ValueError` with what to do instead for a token in argv or a file others can read."""
    from_env = os.environ.pop(TOKEN_ENV, "")  # popped: the ranks inherit this process's environment
    if argument not in (None, "-"):
        raise ValueError("a join token in the command line is readable by every user of this machine (ps, "
                         "/proc/<pid>/cmdline): pass it with --token-file PATH (mode 0600), --token - (stdin) "
                         f"or the environment variable {TOKEN_ENV}")
    if argument == "-":
        return stdin.readline().strip()
    if path:
        return _read_private(path)
    if not from_env:
        raise ValueError("no join token: give --token-file PATH (the file the notebook printed), --token - "
                         f"(stdin) or the environment variable {TOKEN_ENV}")
    return from_env.strip()


def _read_private(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"{path} can be read by other users (mode {stat.S_IMODE(mode):04o}): the token is a "
                             f"secret; run chmod 600 {path}")
        with open(path) as f:
            return f.read().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the join token from {path} ({exc.strerror})") from None
