"""The kernel ↔ zygote channel: JSON messages, and file descriptors beside them, on an inherited socketpair.

The zygote (:mod:`nbtrain.rank.zygote`, started by :mod:`nbtrain.kernel.ranks.zygote_handle`) reads requests from
one end of a ``SOCK_SEQPACKET`` UNIX socketpair that the kernel created and passed to it when it started it:
no address, so no other process can connect; JSON, so nothing received is ever unpickled. Each packet is one
message; a ``fork`` request carries the rank's stdin, stdout and stderr pipe ends (``SCM_RIGHTS``).

Messages (``op``):

* kernel → zygote: ``fork`` (``id``, ``env``, ``cwd``, ``modules``, ``sys_path``; fds stdin/stdout/stderr);
  ``store`` (``id``; fds: the store's listening socket and the read end of its lifeline pipe), answered as a
  ``fork``; ``close`` (the kernel ends the zygote and lives on; an end that closes without it is the kernel's death);
* zygote → kernel: ``ready`` (``pid``, ``imports_s``), ``forked`` (``id``, ``pid``, ``imports_s``), ``refused``
  (``id``, ``reason``), ``exited`` (``pid``, ``code``: as :attr:`subprocess.Popen.returncode`, negative for a
  signal), ``unsafe`` (``reason``: the zygote will fork no more).
"""

from __future__ import annotations

import json
import os
import socket

MAX_PACKET = 1 << 20  # the environment of a rank is a few KiB; a request is far below this
MAX_FDS = 3
ZYGOTE_FD_ENV = "NBTRAIN_ZYGOTE_FD"  # the zygote's end of the socketpair (a descriptor number, not a secret)
KERNEL_PID_ENV = "NBTRAIN_KERNEL_PID"  # the kernel that started the zygote: whose shared memory it removes if it dies


def pair() -> tuple[socket.socket, socket.socket]:
    """(the kernel's end, the zygote's end)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors that came with it; ``(None, [])`` once the other end is closed."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_PACKET, MAX_FDS)
    if not data:
        for fd in fds:
            _close(fd)
        return None, []
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a zygote message is a JSON object")
    return message, fds


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
