"""Messages between the kernel and a node agent (``python -m nbtrain.node``), after the handshake.

A node's conversation (:mod:`nbtrain.wire.link` frames, authenticated both ways first)::

    node   -> NodeHello(host, pid, gpus, cpus)      once, right after the handshake, in raw bytes (link.read_hello)
    kernel -> the node's name in this pool: a, b, c, …  raw bytes too; only then do frames (pickles) start
    either -> Heartbeat(time, telemetry)            about every second; 5 s of silence = lost; the node's telemetry is
                                                    plain JSON values (node.main.telemetry), read field by field
    kernel -> StartRanks(...)                       run torch elastic's agent for this node's ranks
    node   -> RanksStarted(ranks)                   after the c10d rendezvous: global rank -> (local rank, pid)
    kernel -> Deliver(job, files)                   a cell's Job, once per node, with its shared-memory files
    node   -> RankOutput(rank, stream, text)        a rank's stdout/stderr, as it comes
    node   -> RankMessage(rank, data)               a rank's message to the kernel (wire.protocol), as pickled
    node   -> RankExited(rank, code, error)         a rank's process ended (error: its @record error file)
    kernel -> DumpStacks(ranks, wait)               "where are you?": SIGUSR1 to these ranks (faulthandler)
    node   -> Stacks(stacks)                        what their stack files grew by: rank -> text
    kernel -> Interrupt()                           the stop button: one SIGINT to each rank and its children
    kernel -> StopRanks()                           SIGTERM → SIGKILL the ranks; the node stays joined
    node   -> RanksStopped()                        every rank of the node has ended
    node   -> NodeError(text)                       the agent could not start the ranks (rendezvous failed, …)
    node   -> PreemptionNotice(source, at, ends_at) the machine is about to go: SIGTERM, or the cloud's notice
    node   -> NodeNote(text)                        something the user should know (the notice URL cannot be read)
    kernel -> Bye(reason)                           the pool ends: the agent exits

Rank messages travel as the bytes the rank pickled: the node relays them without looking inside (it reads only
the few it acts on itself), and the kernel unpickles them as if they came from a local rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .restart_policy import RestartPolicy


@dataclass(frozen=True)
class NodeHello:
    host: str
    pid: int
    gpus: int
    cpus: int
    address: str = ""  # the address the node reached the kernel from
    slurm_job: str = ""  # the Slurm job the agent runs in (its SLURM_JOB_ID): released with it


@dataclass(frozen=True)
class Heartbeat:
    time: float
    telemetry: dict = field(default_factory=dict)  # the node's: only str, numbers, None, lists, dicts (see above)


@dataclass(frozen=True)
class StartRanks:
    run_id: str
    rdzv_endpoint: str  # host:port of the c10d store the kernel hosts ("" for a detached run: the agent's own)
    nnodes: int
    nproc_per_node: int
    backend: str
    device_type: str
    timeout_s: float
    env: tuple[tuple[str, str], ...]
    kernel_pid: int  # names the kernel's shared-memory files, which the node recreates under its own names
    group_rank: int = 0  # this node's place in the group, decided by the kernel (its ranks: group_rank × nproc …)
    join_timeout_s: float = 180.0
    detached_run: str = ""  # a run that outlives its kernel: the agent hosts the store and records the run (node.detached)
    restarts: RestartPolicy | None = None  # a detached run's --max-restarts, which its agent carries out
    leased_gpus: tuple[int, ...] = ()  # a detached run's GPUs, which its agent leases too (they outlive the kernel)
    spread: object = None  # a detached run on several machines: the kernel's NodesSpec of them, for its agent's relay


@dataclass(frozen=True)
class RanksStarted:
    run_id: str
    ranks: dict  # global rank -> (local rank, pid)


@dataclass(frozen=True)
class Deliver:
    job: bytes  # the pickled wire.protocol.Job, the same bytes for every rank of the node
    files: tuple[tuple[str, bytes], ...] = ()  # the kernel's shared-memory input files: path, contents


@dataclass(frozen=True)
class ToRank:
    rank: int
    data: bytes  # one pickled wire.protocol message for this rank alone (the answer to its prompt)


@dataclass(frozen=True)
class RankOutput:
    rank: int
    stream: str
    text: str


@dataclass(frozen=True)
class RankMessage:
    rank: int
    data: bytes


@dataclass(frozen=True)
class RankExited:
    rank: int
    code: int
    error: str | None = None
    lost: str | None = None  # why the rank's node is gone ("node b (rank 1) lost: …"; from a detached run's relay)


@dataclass(frozen=True)
class DumpStacks:
    ranks: tuple[int, ...]
    wait: float


@dataclass(frozen=True)
class Stacks:
    stacks: dict  # rank -> the Python stacks it dumped


@dataclass(frozen=True)
class Interrupt:
    pass


@dataclass(frozen=True)
class StopRanks:
    pass


@dataclass(frozen=True)
class RanksStopped:
    run_id: str = ""  # the pool whose ranks ended ("": whichever the node was asked to stop)


@dataclass(frozen=True)
class NodeError:
    text: str


@dataclass(frozen=True)
class NodeNote:
    """A line for the cell, said once by the agent: the kernel shows it in the running cell, or the next one."""

    text: str


@dataclass(frozen=True)
class Bye:
    reason: str


@dataclass(frozen=True)
class PreemptionNotice:
    """The node is about to be reclaimed: the agent got SIGTERM, or the cloud's metadata service said so."""

    source: str  # "SIGTERM", "AWS", "GCP", "Azure"
    noticed_at: float  # unix time
    ends_at: float | None = None  # when the machine goes, where the notice says
