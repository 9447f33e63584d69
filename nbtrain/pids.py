"""Whether a process still exists, by PID: for files and records named after the process that wrote them.

Signal 0 checks existence without delivering anything. A process owned by another user answers
``PermissionError``: it exists. Anything that is not a PID (``None`` from an old record, a stray
string) is "not alive", so callers can pass what they read from disk as it is.
"""

from __future__ import annotations

import os


def pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
