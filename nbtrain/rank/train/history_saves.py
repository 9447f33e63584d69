"""Which logged points each save must send: a cell's account of the history files its checkpoints name.

A checkpoint's series live in a file beside it that each save appends to (:mod:`.history_file`). The save group's
first rank writes it; it knows, for each checkpoint path, which file the last checkpoint it wrote names
(``token``), how many bytes of it (``length``), and how many saves have gone into it (``saves``). At each save it
tells every rank the file's token and count in one small broadcast (:func:`.save_gather.rank0s_plan`) — before the
ranks pick what to send, so nobody has to guess whether the last save reached the disk:

* every rank remembers, for each save it took part in, how many points of each series it had sent by then. The
  file holds what a rank had sent by the save the broadcast names, so the rank sends only what it logged after
  that. A save that failed is not counted: the next one sends its points again (the file is cut back first);
* a file the rank knows nothing of — a new one, after the writer changed (``--ft``) or the last one was lost —
  gets every point. A chunk replaces its series from its start, so sending too much is harmless; too little never
  happens.

A resume goes on appending to the file its checkpoint names; the series it restores (only ones the rank had no
point of) count as sent to that file.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

from ...wire.checkpoint_files import HISTORY
from .history_file import HistoryFileError, append, check, intact


@dataclass(frozen=True)
class HistoryPlan:
    """What the writer will append to: the file's token, and how many saves the file already holds."""

    token: int
    saves: int


@dataclass(frozen=True)
class HistoryFile:
    """A checkpoint's history: its file's token, how many bytes of it are the checkpoint's, after how many saves."""

    token: int
    length: int
    saves: int

    def name(self, target: str) -> str:
        return f"{os.path.basename(target)}{HISTORY}{self.token:08x}"

    def entry(self, target: str) -> dict:
        """What the checkpoint file records of it."""
        return {"file": self.name(target), "length": self.length, "saves": self.saves, "token": self.token}

    @classmethod
    def from_entry(cls, entry: dict) -> HistoryFile:
        return cls(int(entry["token"]), int(entry["length"]), int(entry["saves"]))


class SavedHistory:
    """One rank's account, for one cell: as the writer, each path's :class:`HistoryFile` as last named by a
    checkpoint; as a sender, what it had sent by each save into each path's file."""

    def __init__(self) -> None:
        self._files: dict[str, HistoryFile] = {}
        self._written: dict[str, HistoryFile] = {}  # appended to, not yet named by a checkpoint in place
        self._sent: dict[str, tuple[int, dict[int, dict[str, int]]]] = {}  # path: (token, {saves: lengths})

    # -- the writer (the save group's first rank)
    def plan(self, target: str) -> HistoryPlan:
        """The file the next save to ``target`` appends to: the last checkpoint's, while it is whole, else a new one."""
        current = self._files.get(target)
        if current is None or not intact(os.path.join(os.path.dirname(target), current.name(target)), current.length):
            current = self._files[target] = HistoryFile(secrets.randbits(31) | 1, 0, 0)
        return HistoryPlan(current.token, current.saves)

    def write(self, target: str, plan: HistoryPlan, snapshot: dict) -> dict:
        """The checkpoint rank 0 writes to ``target``: the chunks its ``ranks`` sent (``"history"``, checked to be
        their own) appended to the plan's file, which it names in their place (``"history"``)."""
        ranks, chunks = [], []
        for entry in snapshot["ranks"]:
            entry = dict(entry)
            data = _as_bytes(entry.pop("history", None))
            check(data, int(entry.get("rank", 0)))
            chunks.append(data)
            ranks.append(entry)
        current = self._files.get(target)
        keep = current.length if current is not None and current.token == plan.token else 0
        written = HistoryFile(plan.token, 0, plan.saves + 1)
        length = append(os.path.join(os.path.dirname(target), written.name(target)), keep, chunks)
        written = self._written[target] = HistoryFile(plan.token, length, plan.saves + 1)
        return {**snapshot, "ranks": ranks, "history": written.entry(target)}

    def in_place(self, target: str) -> str | None:
        """The checkpoint file that :meth:`write` made is in place: the next save appends after it. Returns the
        name of the file it names."""
        written = self._written.pop(target, None)
        if written is None:
            return None
        self._files[target] = written
        return written.name(target)

    # -- every rank
    def sent_by(self, target: str, plan: HistoryPlan) -> dict[str, int]:
        """How many points of each series the plan's file already holds of this rank's (none: a file it does not know)."""
        token, by_save = self._sent.get(target, (0, {}))
        return dict(by_save.get(plan.saves, {})) if token == plan.token else {}

    def sending(self, target: str, plan: HistoryPlan, lengths: dict[str, int]) -> None:
        """This rank sends its series up to ``lengths`` in the save after ``plan.saves``."""
        token, by_save = self._sent.get(target, (0, {}))
        if token != plan.token:
            by_save = {}
        kept = {saves: sent for saves, sent in by_save.items() if saves >= plan.saves}  # older ones are never named again
        kept[plan.saves + 1] = dict(lengths)
        self._sent[target] = (plan.token, kept)

    def resumed(self, target: str, history: HistoryFile, restored: dict[str, int] | None) -> None:
        """The cell resumed from ``target``, whose checkpoint names ``history``: later saves go on appending to it.
        ``restored``: how many points of each series this rank read back from it and took as its own (a series it
        did not take is sent whole; None: it took none). A resume only adds series this rank had no point of, so
        what it sent to other paths' files stays as counted."""
        self._files[target] = history
        token, by_save = self._sent.get(target, (0, {}))
        known = by_save.get(history.saves, {}) if token == history.token else {}  # this cell wrote it: still so
        self._sent[target] = (history.token, {history.saves: {**known, **(restored or {})}})


def _as_bytes(chunks) -> bytes:
    """A rank's chunks as they arrive: a uint8 tensor (what plain values can carry), or nothing."""
    if chunks is None:
        return b""
    if not hasattr(chunks, "numpy") or getattr(chunks, "dtype", None) is None or str(chunks.dtype) != "torch.uint8":
        raise HistoryFileError("a rank sent its logged series as something other than bytes")
    return chunks.cpu().numpy().tobytes()
