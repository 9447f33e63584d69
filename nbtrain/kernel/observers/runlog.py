"""This kernel's runs, one row each: ``nbtrain.runs()``.

Every ``%%distributed`` cell the kernel runs — finished, failed or stopped — adds a :class:`RunRow` to the
:class:`RunLog` its :class:`~nbtrain.kernel.lifecycle.pools.PoolManager` keeps: the cell's first line that is not an
import (most cells begin with the same ``import``, which tells them apart from nothing), the options that differed from the
defaults (``--amp bf16 --grad-accum 2``), when it started and how long it took (the seconds of the summary line,
so their hours and cost agree with it), the world size, the last logged
step, the final and best value of each logged series (best: the largest for accuracy-like names — ``acc``,
``score``, ``f1``, ``auc``, ``precision``, ``recall`` — the smallest for the rest, such as losses), its state
its checkpoint folder, and its GPU-hours (core-hours on the CPU) and their cost at ``--price-per-gpu-hour``
(:mod:`.cost`). :class:`RunsTable` shows them as a table (HTML in a notebook, text elsewhere) and
gives them as a list of dicts or CSV. Rows live as long as the kernel (the last :data:`KEEP` of them); a run's
series outlive it only in its checkpoint or its TensorBoard folder.

The last :data:`KEEP_SERIES` runs that logged anything also keep their cell and their :class:`~.history.History`
(the same object the notebook got as ``history``): :meth:`RunLog.earlier` hands them to the next run's dashboard,
which draws them faded beside it, each labelled with what differed — :func:`differences` between its cell and
options and the new run's.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import difflib
import html
import io
import re
import threading
import time
from dataclasses import dataclass, field

from .cost import Metering
from .events import RunState
from .history import History

KEEP = 200
KEEP_SERIES = 10  # runs whose series are kept for the next runs' charts to compare with
_HIGHER_IS_BETTER = re.compile(r"acc|score|f1|auc|precision|recall", re.I)


@dataclass(frozen=True)
class RunEnd:
    """One run as :meth:`RunLog.add` takes it: its cell and the options that differed, when it began (unix time),
    how long it took (a finished run's: its summary line's), its ranks, how it ended, its checkpoint folder."""

    cell: str
    options: str
    started: float
    seconds: float
    world_size: int
    state: RunState
    checkpoint: str | None = None


@dataclass(frozen=True)
class RunRow:
    number: int
    cell: str  # its first line that is not an import (:func:`title`)
    options: str  # the options that differed from the defaults
    started: float  # unix time
    seconds: float
    world_size: int
    steps: int | None  # the last logged step, on rank 0
    series: dict = field(default_factory=dict)  # name -> (final, best)
    state: RunState = RunState.FINISHED
    checkpoint: str | None = None
    gpu_hours: float | None = None  # GPUs held × hours; None on the CPU
    core_hours: float | None = None  # on the CPU: the ranks' cores × hours
    cost: float | None = None  # the hours × --price-per-gpu-hour; None without a price

    def flat(self) -> dict:
        """One flat dict: the fields, and ``<name> final`` / ``<name> best`` per series."""
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "series"}
        row["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        for name, (final, best) in self.series.items():
            row[f"{name} final"], row[f"{name} best"] = final, best
        return row


def title(cell: str) -> str:
    """The line that names a cell in the table: its first non-blank line outside ``import`` statements (a comment
    counts: it is the user's own title), else its first line."""
    lines = cell.splitlines()
    try:
        tree = ast.parse(cell)
    except SyntaxError:  # IPython syntax the ranks accept: no statement to skip
        tree = ast.Module(body=[], type_ignores=[])
    imports = {line for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
               for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
    chosen = [line.strip() for number, line in enumerate(lines, 1) if line.strip() and number not in imports]
    firsts = chosen or [line.strip() for line in lines if line.strip()]
    return firsts[0] if firsts else ""


def summarise(history: History) -> tuple[int | None, dict]:
    """Rank 0's last logged step and, per series, its final and best value."""
    steps: int | None = None
    series = {}
    for name in history.names:
        values = history.series(name)
        if not len(values):
            continue
        best = max(values.values) if _HIGHER_IS_BETTER.search(name) else min(values.values)
        series[name] = (values.values[-1], best)
        steps = max(steps or 0, values.steps[-1])
    return steps, series


@dataclass(frozen=True)
class EarlierRun:
    """A run of this kernel that logged series, for a later run to be compared with."""

    number: int  # its row's number in nbtrain.runs()
    cell: str
    options: str
    history: History
    label: str = ""  # how it ended and what differed from the run it is compared with (:func:`differences`)
    state: RunState = RunState.FINISHED


# How an earlier run ended, in the word its chart label starts with.
ENDINGS = {RunState.FINISHED: "finished", RunState.INTERRUPTED: "stopped", RunState.FAILED: "failed"}


def _option_words(options: str) -> dict[str, str]:
    """``--amp bf16 --fresh`` as ``{"--amp": "bf16", "--fresh": ""}``."""
    words: dict[str, str] = {}
    flag = ""
    for word in options.split():
        if word.startswith("--"):
            flag = word
            words[flag] = ""
        elif flag:
            words[flag] = f"{words[flag]} {word}".strip()
    return words


def differences(cell: str, options: str, now_cell: str, now_options: str) -> str:
    """What an earlier run had that the run now does not, in a few words: ``--grad-accum 2 · no --fresh · cell line
    3: lr = 0.1`` (its options' values, the options it lacked, the first line of its cell that differs)."""
    before, now = _option_words(options), _option_words(now_options)
    parts = [f"{flag} {value}".strip() for flag, value in before.items() if now.get(flag) != value]
    parts += [f"no {flag}" for flag in now if flag not in before]
    old_lines, new_lines = cell.splitlines(), now_cell.splitlines()
    for tag, i1, i2, j1, _ in difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes():
        if tag != "equal":
            line = old_lines[i1].strip() if i1 < i2 else "(no line here)"
            parts.append(f"cell line {(i1 if i1 < i2 else j1) + 2}: {line[:40]}")  # the magic's line is line 1
            break
    return " · ".join(parts) or "the same cell and options"


class RunLog:
    """This kernel's runs, in order; written only by :meth:`add`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # background runs end on threads of their own
        self._rows: list[RunRow] = []
        self._count = 0
        self._series: list[EarlierRun] = []  # the last KEEP_SERIES runs that logged anything

    def add(self, run: RunEnd, history: History, metering: Metering | None = None) -> None:
        """One more run, with what it logged and what it held."""
        with self._lock:
            self._add(run, history, metering)

    def _add(self, run: RunEnd, history: History, metering: Metering | None) -> None:
        self._count += 1
        steps, series = summarise(history)
        first = title(run.cell)
        hours = metering.hours(run.seconds) if metering else None
        on_gpus = metering is not None and metering.unit == "GPU"
        self._rows.append(RunRow(self._count, first[:80], run.options, run.started, run.seconds, run.world_size, steps,
                                 series, run.state, run.checkpoint, hours if on_gpus else None,
                                 None if on_gpus else hours, metering.cost(run.seconds) if metering else None))
        del self._rows[:-KEEP]
        if len(history):
            self._series.append(EarlierRun(self._count, run.cell, run.options, history, state=RunState(run.state)))
            del self._series[:-KEEP_SERIES]

    def earlier(self, cell: str, options: str, count: int = KEEP_SERIES) -> tuple[EarlierRun, ...]:
        """The last ``count`` runs that logged series, oldest first, each labelled with how it ended and what
        differed from a run of ``cell`` with ``options``: ``stopped · --lr 0.1`` (:func:`differences`)."""
        chosen = self._series[-count:] if count > 0 else []
        return tuple(dataclasses.replace(run, label=f"{ENDINGS.get(run.state, run.state)} · "
                                                    f"{differences(run.cell, run.options, cell, options)}")
                     for run in chosen)

    def table(self) -> RunsTable:
        return RunsTable(list(self._rows))


class RunsTable:
    """What ``nbtrain.runs()`` returns: a table in the notebook; ``to_dicts()`` and ``to_csv()`` for the rest."""

    def __init__(self, rows: list[RunRow]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def to_dicts(self) -> list[dict]:
        return [row.flat() for row in self.rows]

    def to_csv(self, path: str | None = None) -> str:
        """The table as CSV text; written to ``path`` too when given."""
        dicts = self.to_dicts()
        columns = list(dict.fromkeys(key for row in dicts for key in row))
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        writer.writerows(dicts)
        if path is not None:
            with open(path, "w", newline="") as f:
                f.write(out.getvalue())
        return out.getvalue()

    def to_pandas(self):
        """The table as a pandas DataFrame, one row per run, indexed by the run's number (needs pandas)."""
        import pandas

        return pandas.DataFrame(self.to_dicts()).set_index("number") if self.rows else pandas.DataFrame()

    def plot(self, name: str, **options):
        """Each run's final and best ``name`` (``runs().plot("loss")``), drawn by pandas with matplotlib; the Axes."""
        frame = self.to_pandas()
        columns = [c for c in (f"{name} final", f"{name} best") if c in frame.columns]
        if not columns:
            logged = sorted({c.rsplit(" ", 1)[0] for c in frame.columns if c.endswith(" final")})
            raise KeyError(f"no run of this kernel logged {name!r}; the runs logged: {', '.join(logged) or 'nothing'}")
        return frame[columns].plot(marker="o", title=name, **options)

    def _cells(self) -> tuple[list[str], list[list[str]]]:
        dicts = self.to_dicts()
        columns = list(dict.fromkeys(key for row in dicts for key in row))
        return columns, [[_text(row.get(c)) for c in columns] for row in dicts]

    def __str__(self) -> str:
        if not self.rows:
            return "nbtrain: no %%distributed run in this kernel yet."
        columns, rows = self._cells()
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<p>{html.escape(str(self))}</p>"
        columns, rows = self._cells()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
