"""The file that holds a checkpoint's logged series, which each save only appends to.

A run logs points all along, and a checkpoint holds every one of them, so that a resumed run's ``history`` is the
whole curve. Written into the checkpoint file itself, every save would copy, gather and write all of them again — a
save of a long run cost O(points logged). Instead the series go to ``PATH.history-<id>`` beside ``PATH``: each save
appends only what was logged since the last save, and the checkpoint file records how many bytes of the history file
are its own (:mod:`.history_saves` keeps that account).

The file is a sequence of chunks, each one series of one rank::

    header  "NBH1", rank (int32), start (int64), count (int64), name's length (int32)   little-endian
    name    UTF-8
    points  count steps (int64), then count times (float64), then count values (float64)

A chunk replaces its series from the point ``start`` on: a save that sends again what an earlier, failed save sent
leaves a series as it should be, and so does one that sends a series from its start. Reading parses these bytes and
nothing else: no pickle, no code, and a damaged file is an error that names it (:class:`HistoryFileError`), never a
crash or a wrong curve.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
from array import array
from collections.abc import Collection

MAGIC = b"NBH1"
HEADER = struct.Struct("<4siqqi")
MAX_NAME_BYTES = 4096
_COLUMNS = ("q", "d", "d")  # steps, times, values: 8 bytes each

Series = dict[str, tuple[array, array, array]]  # name: (steps, times, values)
Delta = dict[str, tuple[int, array, array, array]]  # name: (start, steps, times, values) — the points from start on


class HistoryFileError(ValueError):
    """A history file (or chunks a rank sent) that is not what nbtrain writes: says which and where."""


def encode(rank: int, delta: Delta) -> bytes:
    """One chunk per series of ``delta`` (the points logged since ``start``), for ``rank``."""
    parts: list[bytes] = []
    for name, (start, *columns) in delta.items():
        raw = name.encode("utf-8")
        parts.append(HEADER.pack(MAGIC, rank, start, len(columns[0]), len(raw)))
        parts.append(raw)
        parts.extend(_little_endian(column) for column in columns)
    return b"".join(parts)


def check(data: bytes, rank: int) -> None:
    """Chunks received from ``rank``: whole, well-formed and all of that rank's, or :class:`HistoryFileError`."""
    offset = 0
    while offset < len(data):
        chunk_rank, _, count, name, offset = _header(memoryview(data), offset, f"rank {rank}'s history")
        offset += 24 * count
        if chunk_rank != rank or offset > len(data):
            raise HistoryFileError(f"rank {rank} sent history that is not its own or is cut short ({name!r})")


def append(path: str, keep: int, chunks: list[bytes]) -> int:
    """Write ``chunks`` to ``path`` after its first ``keep`` bytes (what the last checkpoint names; anything after
    them is a failed save's), flushed and fsynced; returns the file's length. Only a regular file of this user's is
    written, never through a link, and it is left writable by this user alone. Nothing to keep or write makes no
    file (a run that logs nothing has none)."""
    if keep == 0 and not any(chunks) and not os.path.lexists(path):
        return 0
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size < keep:
            raise HistoryFileError(f"{path} is not the history file this run wrote (another user's, or shorter than "
                                   f"the {keep} bytes its checkpoint names)")
        if stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            os.fchmod(descriptor, stat.S_IMODE(info.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
        os.ftruncate(descriptor, keep)
        os.lseek(descriptor, keep, os.SEEK_SET)
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(descriptor, view):]
        os.fsync(descriptor)
        return os.lseek(descriptor, 0, os.SEEK_CUR)
    finally:
        os.close(descriptor)


def intact(path: str, length: int) -> bool:
    """Whether ``path`` is still this user's regular file of at least ``length`` bytes (``length`` 0: always)."""
    if length == 0:
        return True
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_size >= length


def read_rank(path: str, length: int, rank: int, known: Collection[str] = ()) -> Series:
    """``rank``'s series from the first ``length`` bytes of ``path``, less those named in ``known``: the other
    ranks' chunks, and those series, are skipped unread."""
    if length == 0:
        return {}  # nothing was logged: there may be no file
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise HistoryFileError(f"the history file {path} cannot be opened ({exc.strerror})") from None
    series: Series = {}
    with os.fdopen(descriptor, "rb") as file:
        if os.fstat(file.fileno()).st_size < length:
            raise HistoryFileError(f"the history file {path} is shorter than the {length} bytes its checkpoint names")
        offset = 0
        while offset < length:
            head = file.read(min(HEADER.size + MAX_NAME_BYTES, length - offset))
            chunk_rank, start, count, name, used = _header(memoryview(head), 0, f"the history file {path}")
            offset += used
            if offset + 24 * count > length:
                raise HistoryFileError(f"the history file {path} ends inside the series {name!r}")
            if chunk_rank == rank and name not in known:
                file.seek(offset)
                points = file.read(24 * count)
                if len(points) != 24 * count:
                    raise HistoryFileError(f"the history file {path} ends inside the series {name!r}")
                view = memoryview(points)
                columns = [_column(kind, view[8 * count * i:8 * count * (i + 1)]) for i, kind in enumerate(_COLUMNS)]
                _replace_from(series, name, start, columns, path)
            offset += 24 * count
            file.seek(offset)
    return series


def _header(data: memoryview, offset: int, where: str) -> tuple[int, int, int, str, int]:
    """(rank, start, count, name, offset after the name) of the chunk at ``offset``."""
    if offset + HEADER.size > len(data):
        raise HistoryFileError(f"{where} ends inside a chunk's header")
    magic, rank, start, count, name_bytes = HEADER.unpack_from(data, offset)
    offset += HEADER.size
    if magic != MAGIC or start < 0 or count < 0 or not 0 < name_bytes <= MAX_NAME_BYTES or offset + name_bytes > len(data):
        raise HistoryFileError(f"{where} holds something other than nbtrain's history chunks")
    try:
        name = bytes(data[offset:offset + name_bytes]).decode("utf-8")
    except UnicodeDecodeError:
        raise HistoryFileError(f"{where} holds a series name that is not UTF-8") from None
    return rank, start, count, name, offset + name_bytes


def _replace_from(series: Series, name: str, start: int, columns: list[array], path: str) -> None:
    held = series.setdefault(name, (array("q"), array("d"), array("d")))
    if start > len(held[0]):
        raise HistoryFileError(f"the history file {path} skips points of the series {name!r} (from {len(held[0])} "
                               f"to {start})")
    for kept, new in zip(held, columns, strict=True):
        del kept[start:]
        kept.extend(new)


def _column(kind: str, data: bytes | memoryview) -> array:
    column = array(kind)
    column.frombytes(data)
    if sys.byteorder != "little":
        column.byteswap()
    return column


def _little_endian(column: array) -> bytes:
    if sys.byteorder == "little":
        return column.tobytes()
    swapped = array(column.typecode, column)
    swapped.byteswap()
    return swapped.tobytes()
