"""A network peer of a pool's c10d store: another process that connects over TCP and writes keys, as anyone who
reaches the store's port can (it has no authentication). The tests learn the port from a rank (``STORE_PORT``, a
cell that assigns ``port``), where an attacker would scan the loopback's few listening ports."""

from __future__ import annotations

import json
import subprocess
import sys

STORE_PORT = "import os\nport = int(os.environ['MASTER_PORT'])\n"  # a cell: the store the ranks bootstrap from

_PEER = """
import datetime, json, sys
import torch.distributed as dist
port, items, repeat = json.loads(sys.argv[1])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5),
                      wait_for_workers=False)
accepted = 0
for n in range(repeat):
    for key, value in items:
        try:
            store.set(key.format(n=n), value if isinstance(value, str) else bytes(value))
        except Exception as exc:  # the store refused or went away
            print(json.dumps({"accepted": accepted, "error": repr(exc)}))
            sys.exit(0)
        accepted += 1
print(json.dumps({"accepted": accepted, "error": None}))
"""


def plant(port: int, items: list[tuple[str, str | int]], repeat: int = 1, timeout: float = 120) -> dict:
    """From another process: ``store.set(key, value)`` for each item (an int value: that many bytes), ``repeat``
    times (``{n}`` in a key: the round). Returns ``{"accepted": writes the store took, "error": why it stopped}``."""
    done = subprocess.run([sys.executable, "-c", _PEER, json.dumps([port, items, repeat])], capture_output=True,
                          text=True, timeout=timeout, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
