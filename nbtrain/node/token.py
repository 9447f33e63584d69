"""Where a node agent gets its join token: a 0600 file, stdin or the environment — never its command line.

Every local user can read a process's command line (``ps``, ``/proc/<pid>/cmdline``), so a token given there
would let any of them join the pool and run code as the notebook's user. :func:`read_token` refuses it and
says what to use instead; it also refuses a token file that others can read, as ssh refuses such a key.

A token in ``$NBTRAIN_JOIN_TOKEN`` is taken out of the process's environment as well as ``os.environ``: the
kernel keeps a process's first environment, readable (by the same user and root) in ``/proc/<pid>/environ``,
whatever the program later unsets. So :func:`reexec_without_token` runs the agent again in the same process
(``execve``: the same pid) without the variable, handing the token to the new program on an inherited pipe.
"""

from __future__ import annotations

import os
import stat
import sys

from ..wire.link import TOKEN_ENV

TOKEN_FD_ENV = "NBTRAIN_JOIN_TOKEN_FD"  # the pipe a re-executed agent reads its token from (a number, no secret)
_MAX_TOKEN = 4096  # a join token is a few hundred bytes; a pipe holds this much without a reader


def reexec_without_token() -> None:
    """With ``$NBTRAIN_JOIN_TOKEN`` set: exec this same program again without it, the token on a pipe
    (:data:`TOKEN_FD_ENV`), so that ``/proc/<pid>/environ`` no longer holds it. Returns only when the variable is
    not set; :class:`ValueError` if it cannot be a token."""
    token = os.environ.get(TOKEN_ENV)
    if token is None:
        return
    if len(token.encode()) > _MAX_TOKEN:
        raise ValueError(f"{TOKEN_ENV} holds {len(token)} characters: not a join token (copy the token's file's "
                         "contents, or give --token-file PATH)")
    read, write = os.pipe()
    os.write(write, token.encode())
    os.close(write)
    os.set_inheritable(read, True)
    env = {name: value for name, value in os.environ.items() if name != TOKEN_ENV}
    env[TOKEN_FD_ENV] = str(read)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # the interpreter's own options too


def _from_pipe() -> str:
    """The token :func:`reexec_without_token` handed on, or "" in an agent not re-executed."""
    fd = os.environ.pop(TOKEN_FD_ENV, "")
    if not fd.isdigit():
        return ""
    try:
        with os.fdopen(int(fd), "rb") as pipe:
            return pipe.read(_MAX_TOKEN).decode("utf-8", "replace")
    except OSError:
        return ""


def read_token(argument: str | None, path: str | None, stdin) -> str:
    """The agent's token: from ``--token -`` (stdin), ``--token-file PATH`` or ``$NBTRAIN_JOIN_TOKEN``, in
    that order; :class:`ValueError` with what to do instead for a token in argv or a file others can read."""
    from_env = os.environ.pop(TOKEN_ENV, "") or _from_pipe()  # popped: the ranks inherit this process's environment
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
