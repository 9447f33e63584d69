"""A detached run's folder: what its ranks said, kept on disk for any kernel of the same user to replay.

A run that outlives its kernel is recorded by the node agent that runs its ranks, one folder per run under
:func:`runs_directory` (``<jupyter data dir>/nbtrain/runs/<run id>/``, ``NBTRAIN_RUNS_DIR`` overrides it).
The folder holds two files:

* ``manifest.json`` — the run id, its :class:`RecordedState`'s value, when it started, the agent's pid, the number
  of ranks and the last step logged; rewritten whole through a temporary file and ``os.replace``, so a reader
  sees the old manifest or the new one, never half of one;
* ``events.jsonl`` — append-only, one JSON object a line, in the order the kernel would have been told: which
  process runs each rank, each rank's output lines, each message a rank sent (the bytes it pickled, in base64:
  logged metrics, displays, ``Done`` with rank 0's results in :mod:`.payload`'s format) and each rank's exit;
  with ``--max-restarts``, after an attempt that failed, whether the agent started the ranks again; and the
  ranks' and GPUs' load as the agent sampled it (a sample a second at first, fewer as the run ages);
  A reader follows a live run by reading on from the offset it reached (:func:`read_events`);
* ``cell.json`` — written first, by the kernel that started the run (:func:`reserve`): the cell's magic line and
  source, its notebook and kernel, so that any kernel can attach to the run as the cell would have run.

Both sides import this module: the node agent writes (:class:`RunFolder`), a kernel reads (:func:`list_runs`,
:func:`read_events`, :func:`read_about`). The ranks' messages are unpickled by the kernel that attaches, from the
user's own 0600 file that the user's agent wrote after the ranks' HMAC handshake, as a blocking cell's are.

The folders are private (0700, files 0600). A reader judges every entry by ``lstat`` and the descriptor it
opened (``O_NOFOLLOW``, owner, type) before reading it, so another user's folder, link, FIFO or file in the
runs directory is passed over, never followed, read or crashed on, and no run of another user is listed.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import json
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
ABOUT = "cell.json"
MANIFEST_LIMIT_BYTES = 64 * 1024  # a manifest is a few hundred bytes; a larger file is not one of ours
ABOUT_LIMIT_BYTES = 16 * 1024 * 1024  # a cell's source and options
RESULTS_FOLDER_ENV = "NBTRAIN_RUN_FOLDER"  # a detached run's folder, in its ranks' environment (rank.results_file)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


class RunFolderError(Exception):
    """A run folder that cannot be made or read safely; the message says what was found and what to do."""


MAX_REASON = 400  # characters of a run's recorded reason that a reader takes

class RecordedState(enum.Enum):
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"  # the stop button (or a signal to the agent) ended it


class EventKind(enum.Enum):
    OUTPUT = "output"  # rank, stream, text: one rank's output lines
    EXIT = "exit"  # rank, code, error: torch elastic's error file, where the rank wrote one
    MESSAGE = "message"  # rank, data: a message the rank sent (wire.protocol, pickled by the rank), base64
    STARTED = "started"  # ranks: {rank: pid}, once the ranks' processes run
    RESTART = "restart"  # attempt, reason, resumes: after an attempt failed, the agent's --max-restarts decision: attempt
    # n > 0 started again from the checkpoint (reason ""), or 0 with why not (node.detached_restarts)
    TELEMETRY = "telemetry"  # sample: the ranks and GPUs as the dashboard samples them (gpu.snapshot_json), sampled by
    # the agent (node.detached_telemetry)


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    state: RecordedState
    started: float
    agent_pid: int
    nprocs: int
    step: int | None
    ended: float | None = None
    delivered: bool = False  # the cell has reached the agent: a kernel that exits now leaves the run going
    reason: str = ""  # why the run ended so, where its agent said more than its state (the cell never reached it)


def runs_directory() -> str:
    """Where this user's run folders live: ``NBTRAIN_RUNS_DIR``, else ``<jupyter data dir>/nbtrain/runs``.

    The Jupyter data directory is resolved as jupyter_core does on Linux, without importing it: a node agent
    may run where Jupyter is not installed."""
    override = os.environ.get("NBTRAIN_RUNS_DIR")
    if override:
        return override
    data = os.environ.get("JUPYTER_DATA_DIR")
    if not data:
        xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        data = os.path.join(xdg, "jupyter")
    return os.path.join(data, "nbtrain", "runs")


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise RunFolderError(f"{run_id!r} is not a run id: use 1 to 64 letters, digits, '_', '-' or '.', "
                             "starting with a letter or digit")
    return run_id


def _is_own_private_directory(info: os.stat_result) -> bool:
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def private_runs_directory(directory: str | None = None) -> str:
    """The runs directory, made 0700 if it is missing; one that is a link or another user's is refused."""
    directory = directory or runs_directory()
    os.makedirs(os.path.dirname(directory) or ".", mode=0o700, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RunFolderError(f"{directory} is not a folder of this user's (a link, a file or another user's "
                             "folder): remove it, or point NBTRAIN_RUNS_DIR at a folder of your own")
    if info.st_mode & 0o077:
        os.chmod(directory, 0o700)
    return directory


class RunFolder:
    """The writer's side: one run's folder, made by the agent that runs the ranks, which alone writes it."""

    def __init__(self, run_id: str, nprocs: int, agent_pid: int | None = None, directory: str | None = None):
        self.run_id = check_run_id(run_id)
        self.path = os.path.join(private_runs_directory(directory), run_id)
        with contextlib.suppress(FileExistsError):  # made already by the kernel that reserved the run (reserve())
            os.mkdir(self.path, 0o700)
        if not _is_own_private_directory(os.lstat(self.path)) or os.path.lexists(os.path.join(self.path, MANIFEST)):
            raise RunFolderError(f"{self.path} is not a new run folder of this user's: each detached run needs a "
                                 "new run id")
        self.manifest = {"run_id": run_id, "state": RecordedState.RUNNING.value, "started": time.time(),
                         "agent_pid": agent_pid or os.getpid(), "nprocs": int(nprocs), "step": None}
        self._last_step: int | None = None
        self._write_manifest()
        fd = os.open(os.path.join(self.path, EVENTS),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._events = os.fdopen(fd, "ab", buffering=0)

    def output(self, rank: int, stream: str, text: str) -> None:
        self._append(EventKind.OUTPUT, rank=rank, stream=stream, text=text)

    def rank_exited(self, rank: int, code: int, error: str | None = None, lost: str | None = None) -> None:
        """``lost``: why the rank's node is gone (a run on several machines: :mod:`nbtrain.node.relay`)."""
        self._append(EventKind.EXIT, rank=rank, code=code, error=error, **({"lost": lost} if lost else {}))

    def message(self, rank: int, data: bytes) -> None:
        """A message rank ``rank`` sent, as the bytes it pickled (never unpickled for this)."""
        self._append(EventKind.MESSAGE, rank=rank, data=base64.b64encode(data).decode("ascii"))

    def started(self, pids: dict[int, int]) -> None:
        self._append(EventKind.STARTED, ranks={str(rank): pid for rank, pid in pids.items()})

    def telemetry(self, sample: dict) -> None:
        self._append(EventKind.TELEMETRY, sample=sample)

    def restart(self, attempt: int, reason: str = "", resumes: str = "") -> None:
        """The failed attempt is followed by ``attempt``, which resumes from ``resumes`` (the checkpoint, where it
        stands), or by none (0) for ``reason``."""
        self._append(EventKind.RESTART, attempt=attempt, reason=reason, resumes=resumes)

    def delivered(self) -> None:
        """The cell has reached the agent: from now on the run needs no kernel."""
        self.manifest["delivered"] = True
        self._write_manifest()

    def step(self, step: int) -> None:
        """Rank 0 logged ``step``: the manifest's last step (what a table of runs shows)."""
        if self._last_step is None or step > self._last_step:
            self._last_step = self.manifest["step"] = step
            self._write_manifest()

    def finish(self, state: RecordedState, reason: str = "") -> None:
        """The run has ended: its state is final (``reason``: why, where the state does not say it) and the log is
        closed."""
        if reason:
            self.manifest["reason"] = reason
        self.manifest["state"] = state.value
        self.manifest["ended"] = time.time()
        self._write_manifest()
        self._events.close()

    def _append(self, kind: EventKind, **fields) -> None:
        # One write() of one whole line on an O_APPEND file: a reader never sees two lines interleaved
        self._events.write((json.dumps({"kind": kind.value, **fields}) + "\n").encode())

    def _write_manifest(self) -> None:
        fd, temporary = tempfile.mkstemp(dir=self.path, prefix=".manifest-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.manifest, fh)
            os.replace(temporary, os.path.join(self.path, MANIFEST))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise


def new_run_id() -> str:
    """A run id that sorts by start time: ``20261127-031502-3f9a1c``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def reserved_path(run_id: str, directory: str | None = None) -> str:
    """The folder of ``run_id``: the one :func:`reserve` made, else a new one (a run started without a cell)."""
    path = os.path.join(private_runs_directory(directory), check_run_id(run_id))
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    if not _is_own_private_directory(os.lstat(path)):
        raise RunFolderError(f"{path} is not a folder of this user's: remove it")
    return path


def reserve(run_id: str, about: dict, directory: str | None = None) -> str:
    """The kernel's side, before the agent starts: the run's folder (0700) with ``cell.json`` (0600) in it —
    the cell's magic line, source and notebook, so a kernel that attaches runs the cell's options again."""
    path = os.path.join(private_runs_directory(directory), check_run_id(run_id))
    os.mkdir(path, 0o700)
    fd = os.open(os.path.join(path, ABOUT), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(about, fh)
    return path


def read_about(run_id: str, directory: str | None = None) -> dict:
    """What :func:`reserve` wrote for ``run_id``; {} where there is none of this user's."""
    return read_json(run_id, ABOUT, ABOUT_LIMIT_BYTES, directory)


def read_json(run_id: str, name: str, limit: int = MANIFEST_LIMIT_BYTES, directory: str | None = None) -> dict:
    """The JSON object in file ``name`` of run ``run_id``'s folder; {} where there is none of this user's (or it is
    no JSON object, or larger than ``limit`` bytes)."""
    folder = _open_own_folder(directory or runs_directory(), check_run_id(run_id))
    if folder is None:
        return {}
    try:
        fd = _open_own_file(folder, name)
    finally:
        os.close(folder)
    if fd is None:
        return {}
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    try:
        found = json.loads(data) if len(data) <= limit else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def write_json(run_id: str, name: str, data: dict, directory: str | None = None) -> None:
    """File ``name`` in run ``run_id``'s folder (which must be this user's) holds ``data`` now: written whole to a
    temporary file, then renamed over it, so a reader sees the old object or the new one."""
    path = os.path.join(directory or runs_directory(), check_run_id(run_id))
    if not _is_own_private_directory(os.lstat(path)):
        raise RunFolderError(f"{path} is not a run folder of this user's")
    fd, temporary = tempfile.mkstemp(dir=path, prefix=f".{name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(temporary, os.path.join(path, name))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _open_own_file(folder_fd: int, name: str) -> int | None:
    """A descriptor on ``name`` in the folder, or None unless it is a regular file of this user's (a link, a
    FIFO or another user's file is never followed, read or waited on)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def _open_own_folder(directory: str, run_id: str) -> int | None:
    try:
        fd = os.open(os.path.join(directory, run_id), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not _is_own_private_directory(os.fstat(fd)):
        os.close(fd)
        return None
    return fd


def _summary(manifest) -> RunSummary | None:
    try:
        step, ended = manifest["step"], manifest.get("ended")
        return RunSummary(run_id=check_run_id(manifest["run_id"]), state=RecordedState(manifest["state"]),
                          started=float(manifest["started"]), agent_pid=int(manifest["agent_pid"]),
                          nprocs=int(manifest["nprocs"]), step=None if step is None else int(step),
                          ended=None if ended is None else float(ended), delivered=manifest.get("delivered") is True,
                          reason=str(manifest.get("reason") or "")[:MAX_REASON])
    except (KeyError, TypeError, ValueError, RunFolderError):
        return None


def read_manifest(run_id: str, directory: str | None = None) -> RunSummary | None:
    """One run's manifest, or None where there is no such run of this user's (or its manifest is not one)."""
    folder = _open_own_folder(directory or runs_directory(), check_run_id(run_id))
    if folder is None:
        return None
    try:
        fd = _open_own_file(folder, MANIFEST)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MANIFEST_LIMIT_BYTES + 1)
    finally:
        os.close(folder)
    try:
        manifest = json.loads(data) if len(data) <= MANIFEST_LIMIT_BYTES else None
    except ValueError:
        return None
    summary = _summary(manifest) if isinstance(manifest, dict) else None
    return summary if summary is not None and summary.run_id == run_id else None


def list_runs(directory: str | None = None) -> list[RunSummary]:
    """This user's runs, oldest first; anything else in the runs directory is passed over."""
    directory = directory or runs_directory()
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    runs = [read_manifest(name, directory) for name in names if RUN_ID.match(name)]
    return sorted((run for run in runs if run is not None), key=lambda run: run.started)


STARTING_WITHIN_S = 60.0  # a reserved folder without a manifest younger than this: its agent is starting


def starting_runs(directory: str | None = None, now: float | None = None) -> list[str]:
    """The ids of this user's runs whose kernel reserved the folder (:func:`reserve`) less than
    :data:`STARTING_WITHIN_S` ago and whose agent has not written the manifest yet: the cell returned, the run
    is starting. An older folder without a manifest is a run whose agent never started: not waited for."""
    directory = directory or runs_directory()
    now = time.time() if now is None else now
    try:
        names = sorted(name for name in os.listdir(directory) if RUN_ID.match(name))
    except OSError:
        return []
    found = []
    for name in names:
        folder = _open_own_folder(directory, name)
        if folder is None:
            continue
        try:
            about = os.stat(ABOUT, dir_fd=folder, follow_symlinks=False)
            has_manifest = os.path.lexists(os.path.join(directory, name, MANIFEST))
        except OSError:
            continue
        finally:
            os.close(folder)
        if not has_manifest and about.st_uid == os.geteuid() and now - about.st_mtime < STARTING_WITHIN_S:
            found.append(name)
    return found


KEEP_DAYS = 7.0  # a finished run's folder can be attached this long (NBTRAIN_RUNS_KEEP_DAYS), then it is swept


def sweep_ended(directory: str | None = None, now: float | None = None) -> list[str]:
    """Remove this user's run folders that ended more than ``NBTRAIN_RUNS_KEEP_DAYS`` (default 7) days ago; the
    ids removed. A running run, a folder without a manifest of ours, and anything another user planted stay."""
    directory = directory or runs_directory()
    keep_s = float(os.environ.get("NBTRAIN_RUNS_KEEP_DAYS") or KEEP_DAYS) * 86400
    now = time.time() if now is None else now
    swept = []
    for run in list_runs(directory):
        if run.state is RecordedState.RUNNING or run.ended is None or now - run.ended < keep_s:
            continue
        path = os.path.join(directory, run.run_id)
        if _is_own_private_directory(os.lstat(path)):  # checked again: list_runs judged it a moment ago
            shutil.rmtree(path, ignore_errors=True)
            swept.append(run.run_id)
    return swept


def read_events(run_id: str, offset: int = 0, directory: str | None = None) -> tuple[list[dict], int]:
    """The whole event lines from byte ``offset`` on, and the offset to read on from next time (a line the
    agent is still writing is left for then)."""
    folder = _open_own_folder(directory or runs_directory(), check_run_id(run_id))
    if folder is None:
        raise RunFolderError(f"there is no run {run_id!r} of this user's in {directory or runs_directory()}")
    try:
        fd = _open_own_file(folder, EVENTS)
    finally:
        os.close(folder)
    if fd is None:
        raise RunFolderError(f"run {run_id!r} has no event log of this user's")
    with os.fdopen(fd, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    whole = data[:data.rfind(b"\n") + 1]
    events = [json.loads(line) for line in whole.splitlines()]
    return events, offset + len(whole)


DECISION_WAIT_S = 60.0  # how long a reader waits for the agent's --max-restarts decision after a failed attempt
DECISION_POLL_S = 0.1


def restart_decision(run_id: str, failed_attempt: int, wait_s: float = DECISION_WAIT_S,
                     directory: str | None = None) -> tuple[str | None, str]:
    """After attempt ``failed_attempt`` (0: the first) of run ``run_id`` failed: (None, the checkpoint it resumes
    from) once its agent recorded that it started the next one, else (why not, "") — the agent's reason, or that
    the run ended or its agent fell silent (as a reason that follows "not restarting: ")."""
    offset, decisions = 0, 0
    deadline = time.monotonic() + wait_s
    while True:
        summary = read_manifest(run_id, directory)  # before the events: a final state read first: all are written
        events, offset = read_events(run_id, offset, directory)
        for event in events:
            if event.get("kind") != EventKind.RESTART.value:
                continue
            if decisions == failed_attempt:
                if event.get("attempt"):
                    return None, str(event.get("resumes") or "the checkpoint")
                return str(event.get("reason") or "its agent did not restart it"), ""
            decisions += 1
        if summary is None or summary.state is not RecordedState.RUNNING:
            return f"the run ended ({summary.state.value if summary else 'its record is gone'})", ""
        if time.monotonic() > deadline:
            return f"its agent said nothing of a restart within {wait_s:.0f} s (see its agent.log)", ""
        time.sleep(DECISION_POLL_S)
