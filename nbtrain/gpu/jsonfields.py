"""Plain JSON values from a GPU reading and back, each value checked on the way in.

A node agent's heartbeat carries its GPUs as plain dicts and lists (:meth:`~nbtrain.gpu.devices.GpuStatus.to_json`,
:meth:`~nbtrain.gpu.health.GpuHealth.to_json`, :meth:`~nbtrain.gpu.fabric.MigDevice.to_json`): never objects of
ours, so the kernel builds every object itself. Reading one back, a value of the wrong type, out of range, too
long or nested where it should not be is ``None`` (shown as N/A), never an exception: the readers here return
``None`` for anything but what they expect, and a newer agent's unknown keys are never looked at.
"""

from __future__ import annotations

import math
from dataclasses import fields

MAX_TEXT = 400  # characters of one string (a GPU's name, a UUID, a reason a field reads N/A)
MAX_ITEMS = 64  # entries of one list (clock reasons, N/A reasons, a MIG instance's processes)
_INT_LIMIT = 2**63  # NVML's counters are 64 bits; a larger number is not a reading


def plain(record) -> dict:
    """A dataclass of plain values as a JSON-safe dict: every field, tuples as lists, None kept."""
    return {f.name: list(value) if isinstance(value := getattr(record, f.name), tuple) else value
            for f in fields(record)}


def whole(value) -> int | None:
    """An integer (not a bool) that fits 64 bits, else None."""
    return value if type(value) is int and -_INT_LIMIT <= value < _INT_LIMIT else None


def number(value) -> float | None:
    """A finite number (an integer that fits 64 bits, or a float), as a float, else None."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    count = whole(value)
    return None if count is None else float(count)


def text(value, limit: int = MAX_TEXT) -> str | None:
    return value if isinstance(value, str) and len(value) <= limit else None


def items(value, limit: int = MAX_ITEMS) -> list | None:
    """A list (or tuple) of at most ``limit`` entries, else None; its entries are the caller's to check."""
    return list(value) if isinstance(value, (list, tuple)) and len(value) <= limit else None


def texts(value, limit: int = MAX_ITEMS) -> tuple[str, ...] | None:
    """A list of short strings, else None (one entry of another kind spoils the whole list)."""
    entries = items(value, limit)
    if entries is None or any(text(entry) is None for entry in entries):
        return None
    return tuple(entries)


def wholes(value, limit: int = MAX_ITEMS) -> tuple[int, ...] | None:
    """A list of integers, else None (one entry of another kind spoils the whole list)."""
    entries = items(value, limit)
    if entries is None or any(whole(entry) is None for entry in entries):
        return None
    return tuple(entries)
