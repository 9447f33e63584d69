"""Messages between the kernel and its ranks.

Each rank holds one authenticated connection to the kernel (:mod:`multiprocessing.connection` over a
UNIX socket in a private directory; the key is random per pool and reaches the rank on its stdin, never
in its environment or command line). Nothing is unpickled before the HMAC challenge has succeeded.

A conversation::

    rank   -> Hello(rank, pid)                       right after connecting
    rank   -> Ready(rank, device, times)             process group initialised (times: the cold start's split)
    kernel -> Job(...)                               one per cell; the same bytes for every rank
    rank   -> Loaded(job_id, rank)                   inputs unpickled: shared-memory files may go
    rank   -> Metrics(rank, records)                 what nbtrain.log() buffered, a few times a second
    rank   -> Setup(rank, facts)                     what prepare() set up for a model (AMP, layout, compile time)
    rank   -> Display(job_id, rank, seq, data, ...)  rank 0: display(obj), plt.show() (a MIME bundle)
    rank   -> InputRequest(job_id, rank, seq, prompt) input(), sys.stdin, pdb: a line from the notebook
    kernel -> InputReply(seq, text)                  the notebook's answer (None: no input can be given)
    rank   -> ProfileSummary(job_id, rank, ...)      --profile: top operators, communication time
    rank   -> Done(job_id, rank, results, modules, first_step) | Failed(job_id, rank, error)
    kernel -> CloseSession(name)                     drop a session's namespace (no reply)
    rank   -> PreemptNotice(rank, source, at)        SIGTERM from outside the pool (a container, a job stopping)
    kernel -> Preempt(job_id, grace)                 a notice: save a checkpoint at the next optimizer step
    rank   -> PreemptPropose(job_id, rank, step)     a rank that heard it, at a step boundary: save at this step
    kernel -> PreemptAt(job_id, step)                the first proposal, to every rank: the step they all save at
    rank   -> PreemptHeard(job_id, rank)             this rank knows that step
    kernel -> PreemptAgreed(job_id)                  every rank knows it: a proposer waiting at its boundary goes on
    rank   -> PreemptSaved(job_id, rank, step, ...)  rank 0: that checkpoint is written
    rank   -> BreakpointLeft(job_id, call)           nbtrain.breakpoint(rank=k): rank k left the debugger
    kernel -> BreakpointRelease(job_id, call)        to every rank: the ranks waiting at that breakpoint go on
    kernel -> Stopping()                             the SIGTERM that follows is the kernel's own (no notice)
    kernel -> Shutdown()                             barrier, destroy the group, exit 0

A ``Job`` with a ``session`` name runs in the namespace that session keeps on each rank instead of a fresh
one (:mod:`nbtrain.rank.session`); its ``Done`` then says which names the session holds.

Output does not travel here: each rank's stdout and stderr are pipes read by the kernel, so C-level
output (NCCL warnings, a segfault message) is shown too. After a job a rank writes :data:`END_MARK` and
the job id to both streams, so the kernel knows it has shown everything the job printed. After sending a
:class:`Display` a rank writes :data:`DISPLAY_MARK` and its ``seq`` to stdout, so the kernel shows it at
that place among the text (see :mod:`nbtrain.kernel.relay.displays`). After sending an :class:`InputRequest` a
rank writes :data:`INPUT_MARK` and its ``seq`` to stdout, so the kernel asks only once it has shown what
the rank printed before the prompt (see :mod:`nbtrain.kernel.relay.stdin`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .settings import TrainSettings

END_MARK = "\x1e\x1fnbtrain-end "
DISPLAY_MARK = "\x1e\x1fnbtrain-display "
INPUT_MARK = "\x1e\x1fnbtrain-input "
MARKS = (END_MARK, DISPLAY_MARK, INPUT_MARK)  # all start with the same control characters


@dataclass(frozen=True)
class Hello:
    rank: int
    pid: int


@dataclass(frozen=True)
class StartTimes:
    """When a starting rank passed each step (``time.time()`` of its machine): the cold start's split."""

    launched: float  # its process ran its first line of Python (spawned) or was forked (zygote)
    imported: float  # torch and the rank's code imported
    joined: float  # rendezvous: connected to the kernel's store
    built: float  # communicator set up: the default process group initialised


@dataclass(frozen=True)
class Ready:
    rank: int
    device: str
    times: StartTimes | None = None


@dataclass(frozen=True)
class FaultTolerance:
    """A ``--ft`` job's replica groups: where they meet and the secret their state travels under (this channel is
    authenticated; neither is ever in a rank's environment or command line)."""

    lighthouse: str  # http://HOST:PORT of the run's torchft Lighthouse
    secret: bytes  # the run's recovery secret (rank/train/ft_transport.py)
    groups: int  # replica groups the run has
    host: str = "127.0.0.1"  # where each group's own servers listen ("": the address its node reaches the kernel from)
    group_size: int = 1  # ranks per group: rank r is rank r % group_size of group r // group_size


@dataclass(frozen=True)
class Job:
    job_id: int
    source: str
    filename: str
    inputs: bytes
    out_names: tuple[str, ...]
    train: TrainSettings = TrainSettings()  # --amp, --grad-accum, --checkpoint
    cwd: str = ""  # the notebook's current directory: the rank runs the cell there
    sys_path: tuple[str, ...] = ()  # the kernel's sys.path, absolute (see nbtrain.kernel.request.notebook_modules)
    result_prefix: str = ""  # rank 0 writes large results to /dev/shm files starting with this; "" = in the pickle
    shared_files: tuple[str, ...] = ()  # the /dev/shm files the inputs map: another machine gets their bytes
    session: str = ""  # run in this session's namespace, kept between jobs; "" = a fresh namespace
    line_offset: int = 1  # lines above the source in the cell (the magic's): a warning names the cell's line
    ft: FaultTolerance | None = None  # --ft: this rank's replica group (rank/train/ft_cell.py)


@dataclass(frozen=True)
class Loaded:
    job_id: int
    rank: int


@dataclass(frozen=True)
class Frame:
    filename: str
    lineno: int
    name: str
    line: str | None


@dataclass(frozen=True)
class RemoteError:
    """An exception raised on a rank, reduced to what the kernel needs to show it."""

    type_name: str
    message: str
    frames: tuple[Frame, ...]
    stage: str = "cell"  # "cell", "inputs" or "results"
    chained: tuple[str, ...] = field(default_factory=tuple)  # formatted causes, outermost last

    @property
    def headline(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name


@dataclass(frozen=True)
class Done:
    job_id: int
    rank: int
    results: object | None  # payload.Results on the return rank
    seconds: float
    modules: tuple = ()  # (name, path, mtime_ns, size) of the user's own modules imported so far
    rank_path: tuple = ()  # the rank's own sys.path entries, without its start-up directory
    held: tuple = ()  # a session's job: (name, type name) of every name the session now holds
    gpu_bytes: int | None = None  # a session's job: memory the rank's tensors hold on its GPU (None: no CUDA)
    first_step: float | None = None  # time.time() the cell's first optimizer step ended (None: it took none)


@dataclass(frozen=True)
class Failed:
    job_id: int
    rank: int
    error: RemoteError


@dataclass(frozen=True)
class Metrics:
    """Values a rank logged with ``nbtrain.log``: ``(step, unix_time, {name: float})`` records."""

    rank: int
    records: list
    restored: bool = False  # the series saved in a checkpoint, sent again when the run resumes from it


@dataclass(frozen=True)
class Setup:
    """What ``nbtrain.prepare()`` decided for one model, sent after its first forward (``rank/train/speed.py``):
    ``{"model": 0, "amp": "bf16", "device": "cuda:0", "bf16_supported": True, "channels_last": True,
    "compile": "default", "compile_s": 41.2}`` (``compile_error`` when it fell back)."""

    rank: int
    facts: dict


@dataclass(frozen=True)
class Display:
    """Rich output of a cell (rank 0): a MIME bundle as Jupyter's display_data has it (images as base64)."""

    job_id: int
    rank: int
    seq: int  # numbers the job's displays from 1; the same number follows DISPLAY_MARK in stdout
    data: dict
    metadata: dict = field(default_factory=dict)
    transient: dict = field(default_factory=dict)  # {"display_id": …}: names the output, as in Jupyter
    update: bool = False  # replace the output named by transient's display_id instead of adding one
    result: bool = False  # the cell's last expression's value: shown as the notebook's Out[n]


@dataclass(frozen=True)
class InputRequest:
    """A rank waits for a line of input (``input()``, ``sys.stdin.readline()``, pdb's prompt)."""

    job_id: int
    rank: int
    seq: int  # numbers the job's prompts from 1; the same number follows INPUT_MARK in stdout
    prompt: str


@dataclass(frozen=True)
class InputReply:
    """The line the user typed, without its newline; None: no input can be given (the rank gets EOFError)."""

    seq: int
    text: str | None
    reason: str = ""  # why there is no input, for the rank's EOFError


@dataclass(frozen=True)
class ProfileSummary:
    """``--profile``: one rank's top operators ``(name, calls, self_us)`` and its time in communication."""

    job_id: int
    rank: int
    operators: tuple[tuple[str, int, float], ...]
    communication_us: float
    total_us: float
    steps: int  # optimizer steps seen while profiling
    trace_file: str | None  # the Chrome / TensorBoard trace written, if the recording began


@dataclass(frozen=True)
class CloseSession:
    """Forget a session's namespace (``%distributed_close``); the rank frees what it held."""

    name: str


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class PreemptNotice:
    """This rank got SIGTERM from outside nbtrain (a container or job being stopped): a preemption notice."""

    rank: int
    source: str  # "SIGTERM"; on a node the agent's sources too (nbtrain.wire.nodes.PreemptionNotice)
    noticed_at: float  # unix time
    ends_at: float | None = None  # when the machine goes, where the notice says
    node: str = ""  # the node it came from, filled in by the kernel's node pool


@dataclass(frozen=True)
class Preempt:
    """The machine (or one of the nodes) is about to go: save a checkpoint at the next optimizer-step boundary."""

    job_id: int
    grace: float


@dataclass(frozen=True)
class PreemptPropose:
    """A rank that heard a notice, at an optimizer-step boundary: every rank could save at ``step`` (its step + 1)."""

    job_id: int
    rank: int
    step: int


@dataclass(frozen=True)
class PreemptAt:
    """The kernel, to every rank: the first proposal, the step at which every rank saves the notice's checkpoint."""

    job_id: int
    step: int


@dataclass(frozen=True)
class PreemptHeard:
    """A rank's channel thread has the :class:`PreemptAt`: the rank saves there at the latest."""

    job_id: int
    rank: int


@dataclass(frozen=True)
class PreemptAgreed:
    """The kernel, to every rank: each one has heard the :class:`PreemptAt` (a waiting proposer may go on)."""

    job_id: int


@dataclass(frozen=True)
class PreemptSaved:
    """Rank 0: the checkpoint a :class:`Preempt` asked for is written."""

    job_id: int
    rank: int
    step: int
    seconds: float  # the write itself
    path: str


@dataclass(frozen=True)
class BreakpointLeft:
    """The rank that ``nbtrain.breakpoint(rank=k)`` stopped has left the debugger (its ``call``-th of the cell)."""

    job_id: int
    call: int


@dataclass(frozen=True)
class BreakpointRelease:
    """The kernel, to every rank: the ranks waiting at the cell's ``call``-th ``nbtrain.breakpoint()`` go on."""

    job_id: int
    call: int


@dataclass(frozen=True)
class Stopping:
    """The kernel (or the node's agent) stops this rank now: its SIGTERM is no preemption notice."""


@dataclass(frozen=True)
class FtJoining:
    """A ``--ft`` rank, to the kernel: it reached the cell's first ``prepare()`` and waits to take its first quorum."""

    job_id: int
    rank: int


@dataclass(frozen=True)
class FtOut:
    """The kernel, to each ``--ft`` replica group's first rank, at each change: the groups out of the run now (lost,
    or new ranks in their place that have not rejoined). The first group not out brings the cell's names back."""

    job_id: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class FtGo:
    """The kernel, to a ``--ft`` rank waiting at its first ``prepare()``: every group that starts together is there
    (or this rank replaces one that was lost): take the first quorum now."""

    job_id: int
