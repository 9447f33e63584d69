"""torchft's Lighthouse for one run: the quorum keeper of per-step fault tolerance, on one address only.

Each replica group's Manager asks the Lighthouse, at every step, which groups are alive; it answers with a quorum
once enough have asked (``min_replicas``) or the stragglers' wait (``join_timeout_ms``) is over. The Lighthouse has
no authentication (docs/security.md says what a peer that reaches it can do), so nbtrain binds it to the run's
rendezvous address only — torchft's default is every interface — and starts it in a child process of its own:
the kernel never imports torch, and the child exits when the kernel's end of its stdin closes, so a kernel that
dies leaves no Lighthouse behind.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import select
import subprocess
import sys
import tempfile
import time

START_S = 60.0  # a fresh process on a loaded machine (importing torch, where the server is imported with torchft)
JOIN_TIMEOUT_MS = 1000  # a dead group's heartbeat stops; the others' next quorum waits this long, at most, for it
# A group whose heartbeats stopped this long is dead to the Lighthouse (torchft's default: 5 s). Until then it still
# counts among the live groups, and torchft forms no quorum of half of them or fewer (its guard against a split
# brain): with 2 groups the survivor would wait out the whole timeout. The heartbeats come from the Manager's own
# native threads every 100 ms, whatever the cell's Python is doing, so 1.5 s of silence is a lost group.
HEARTBEAT_TIMEOUT_MS = 1500

# The server is torchft's Rust extension alone: loaded from its file it needs neither torch nor the rest of torchft,
# and starts in milliseconds instead of the seconds torch's import takes (argv[4]: the file, or "" to import it)
_SERVE = """
import importlib.util, sys
if sys.argv[4]:
    spec = importlib.util.spec_from_file_location("_torchft", sys.argv[4])
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    LighthouseServer = native.LighthouseServer
else:
    from torchft._torchft import LighthouseServer
server = LighthouseServer(bind=sys.argv[1], min_replicas=int(sys.argv[2]), join_timeout_ms=int(sys.argv[3]),
                          heartbeat_timeout_ms=int(sys.argv[5]))
print(server.address().rsplit(":", 1)[1], flush=True)
sys.stdin.read()  # until the kernel goes
server.shutdown()
"""


def _extension_file() -> str:
    """torchft's compiled extension, found without importing torchft (which imports torch); "" if not found."""
    spec = importlib.util.find_spec("torchft")
    folder = os.path.dirname(spec.origin) if spec is not None and spec.origin else ""
    found = sorted(glob.glob(os.path.join(glob.escape(folder), "_torchft*.so"))) if folder else []
    return found[0] if found else ""


class LighthouseError(RuntimeError):
    """The Lighthouse did not start; the message says why."""


class Lighthouse:
    """A running Lighthouse on ``host``. ``address`` is what each replica group's Manager is given."""

    def __init__(self, host: str, min_replicas: int, join_timeout_ms: int = JOIN_TIMEOUT_MS) -> None:
        if importlib.util.find_spec("torchft") is None:
            raise LighthouseError("per-step fault tolerance needs torchft, which is not installed here: "
                                  "pip install 'nbtrain[ft]'")
        bind = f"[{host}]:0" if ":" in host else f"{host}:0"
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, bind, str(min_replicas), str(join_timeout_ms), _extension_file(),
             str(HEARTBEAT_TIMEOUT_MS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)
        port = self._read_port()
        self.address = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def _read_port(self) -> int:
        assert self._process.stdout is not None
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and self._process.poll() is None:
            if select.select([self._process.stdout], [], [], 0.2)[0]:
                line = self._process.stdout.readline().strip()
                if line.isdigit():
                    return int(line)
                break
        self.close()
        raise LighthouseError(f"torchft's Lighthouse did not start: {self._said() or 'no word from it'}")

    def _said(self) -> str:
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else ""

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()
