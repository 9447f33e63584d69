"""Whether a process still exists, by PID: for files and records named after the process that wrote them.

Signal 0 checks existence without delivering anything. A process owned by another user answers
``PermissionError``: it exists. Anything that is not a PID is "not alive", so callers can pass what they read
from disk as it is: ``None`` from an old record, a stray string, and the numbers :func:`os.kill` reads as
something else or refuses — 0 and negatives name process groups (``kill(-1, 0)`` succeeds), a number past the
kernel's limit overflows — from a name another user planted.
"""

from __future__ import annotations

import os
import re

PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no process anywhere has a larger pid
_DIGITS = re.compile(r"[0-9]{1,10}")  # ASCII only: int() also reads other scripts' digits


def as_pid(value) -> int | None:
    """``value`` (an int, or a string of digits) as a process id, or None where it cannot be one."""
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= PID_MAX:
        return value
    return None


def pid_alive(pid) -> bool:
    number = as_pid(pid)
    if number is None:
        return False
    try:
        os.kill(number, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
