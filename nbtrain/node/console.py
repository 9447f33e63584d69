"""The agent's terminal and its log file: a line per event on the one, torch's full traces in the other.

An elastic group re-forms and loses nodes as a matter of course, and each time torch prints C++ stack traces
(a TCPStore read on a store the kernel has dropped) and Python tracebacks (the exit barrier) to stderr. On
the terminal of a node agent that is a screenful per event, hiding what happened. So the agent points its
file descriptor 2 — where C++ and torch's own logging write — at a log file of its own (mode 0600, kept after
it exits, under ``~/.cache/nbtrain/logs``), and its terminal gets nbtrain's lines (stdout) plus one line
per warning or error torch elastic logs, ending with where the details are.
"""

from __future__ import annotations

import logging
import os
import socket
import sys

_LOG_DIR = os.path.join("~", ".cache", "nbtrain", "logs")


class _OneLine(logging.Handler):
    """The first line of a torch elastic warning or error, on the terminal; the record itself goes on to the log."""

    def __init__(self, console, log_path: str) -> None:
        super().__init__(logging.WARNING)
        self.console, self.log_path = console, log_path

    def emit(self, record: logging.LogRecord) -> None:
        try:
            first = record.getMessage().strip().splitlines()[0][:200] if record.getMessage().strip() else ""
            self.console.write(f"nbtrain.node: torch elastic: {first} (details: {self.log_path})\n")
            self.console.flush()
        except Exception:  # a terminal gone away must not stop the agent
            pass


def route_output(directory: str | None = None) -> str:
    """Send file descriptor 2 to this agent's log file; torch elastic's warnings also as one line on stdout.
    Returns the log file's path."""
    directory = os.path.expanduser(directory or os.environ.get("NBTRAIN_LOG_DIR") or _LOG_DIR)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, f"node-{socket.gethostname()}-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stderr.flush()
    os.dup2(fd, 2)  # C++ (c10d) and Python writes to stderr alike
    os.close(fd)
    logging.getLogger("torch.distributed.elastic").addHandler(_OneLine(sys.stdout, path))
    return path


def say(text: str) -> None:
    """A line on the agent's terminal (stdout: stderr is the log file)."""
    print(f"nbtrain.node: {text}", flush=True)
