"""LaunchConfig: everything that decides how a cell is run, checked before any process starts.

:func:`resolve` turns what the user asked for (:class:`LaunchRequest`, the magic's parsed arguments)
into a :class:`LaunchConfig`, or raises :class:`ConfigError` with a message that says what is wrong and
how to fix it. An option left out takes its ``NBTRAIN_*`` environment variable where it has one (declared
with the field; applied first, by :func:`~.options.with_env_fallbacks`). GPUs are counted through NVML
(:mod:`nbtrain.gpu.nvml`), never through CUDA, so the kernel stays CUDA-clean.

Devices: ranks see only the chosen GPUs (``CUDA_VISIBLE_DEVICES``) and rank ``r`` uses
``cuda:(local_rank % len(gpus))`` — so a pasted torchrun script's ``torch.cuda.set_device(local_rank)``
does the right thing. NCCL needs one GPU per rank; gloo may put several ranks on one GPU or run on CPU.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

from ...gpu import leasepolicy, nvml
from ...wire.settings import TrainOptions, TrainSettings, TrainSettingsError, parse_size, parse_train_settings
from ...common.words import count
from ..diagnostics.profiling import ProfileOptionError, parse_profile, profile_dir
from ..observers.hosted_trackers import TrackSpec, parse_tracks
from ..observers.trackers import TrackerSetupError, tensorboard_dir
from .hosts import SshSetupError, parse_hosts, parse_remote_python, parse_slurm, parse_ssh_options
from ..observers.cost import PriceError, parse_price
from ..ranks.spec import NodesSpec, PoolSpec
from .ft_request import fault_tolerant
from .detach import detached_spec, with_training
from .mistakes import ConfigError
from .notebook_modules import Workdir, WorkdirGone, notebook_workdir
from ...wire.agent_options import AgentOptions, PreemptionURLError, check_url
from ...wire.options import OptionEnvError, option, with_env_fallbacks

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_START_TIMEOUT_S = 180.0
DEFAULT_LAST_CALL_S = 3.0  # --nodes MIN:MAX: once MIN nodes joined, how long more may join (torch elastic: last_call_timeout)
DEFAULT_KEEP_ALIVE_S = 900.0
DEFAULT_PREEMPTION_GRACE_S = 25.0  # a preemption notice: how long the ranks have to save (AWS gives 120 s, GCP 30 s)
SESSION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class LaunchRequest(TrainOptions, AgentOptions):
    """What the user asked for: one field per ``%%distributed`` option, declared once (:mod:`nbtrain.wire.options`).

    The training options are inherited from :class:`~nbtrain.wire.settings.TrainOptions`, where the ranks read
    the same declarations; the node agents' from :class:`~nbtrain.wire.agent_options.AgentOptions`, where the
    agent reads them. The magic's arguments, their help and the request built from them all come from
    these declarations.
    """

    nprocs: int | None = option(None, None, "number of ranks (default: one per visible GPU, else 2)",
                                group="placement", type=int)
    cpu: bool = option(False, "--cpu", "run on CPU (gloo) even when GPUs are present", group="placement", switch=True)
    gpus: str | None = option(None, "--gpus", "GPUs to use, such as 0,2 (NVML/nvidia-smi numbering); auto: as many "
                              "free GPUs as ranks, none leased by another run and none used by other processes, waiting "
                              "in the machine's first-come queue until they are free", group="placement",
                              metavar="IDS|auto", env="NBTRAIN_GPUS")
    no_wait: bool = option(False, "--no-wait", "fail at once, saying who holds them, when the GPUs asked for are not "
                           "free, instead of waiting in the queue", group="placement", switch=True)
    gpu_timeout: float | None = option(
        None, "--gpu-timeout", "how long the cell waits in the queue for its GPUs before it fails (default: as long "
        "as it takes; the stop button leaves the queue)", group="placement", type=float, metavar="SECONDS",
        env="NBTRAIN_GPU_TIMEOUT")
    backend: str | None = option(None, "--backend", "process-group backend (default: nccl on GPUs, gloo on CPU)",
                                 group="placement", choices=("nccl", "gloo"))
    timeout: float | None = option(None, "--timeout", "collective timeout of the process group (default 600)",
                                   group="placement", type=float, metavar="SECONDS")
    start_timeout: float | None = option(
        None, "--start-timeout", "seconds the ranks may take to start and join the process group (default 180)",
        group="placement", type=float, metavar="SECONDS", env="NBTRAIN_START_TIMEOUT")
    run_id: str | None = option(None, "--run-id", "with --detach: the run's name, to attach to it by that name "
                                "(letters, digits, '_', '-', '.'; default: the date and time and a random suffix)",
                                group="placement", metavar="NAME")
    detach: bool = option(False, "--detach", "the run outlives the kernel: its ranks run under an agent of their own "
                          "on this machine (with --nodes, on nodes that agent brings up), recorded as they go, and "
                          "any kernel of yours can attach to it (implies --background)", group="placement", switch=True)
    nodes: str | None = option(None, "--nodes", "run on N machines: nodes join with the command the cell prints "
                               "(python -m nbtrain.node); the number of ranks is N × --nproc-per-node. MIN:MAX is "
                               "elastic, as torchrun's --nnodes MIN:MAX: the group forms with the nodes joined once "
                               "MIN are there (after --last-call), up to MAX", group="placement", metavar="N|MIN:MAX")
    last_call: float | None = option(
        None, "--last-call", "with --nodes MIN:MAX: once MIN nodes have joined, wait this long for more (up to MAX) "
        "before the group forms (default 3), as torch elastic's last-call timeout", group="placement", type=float,
        metavar="SECONDS", env="NBTRAIN_LAST_CALL")
    nproc_per_node: int | None = option(None, "--nproc-per-node", "ranks on each node with --nodes (default 1)",
                                        group="placement", type=int, metavar="M")
    rdzv_host: str | None = option(None, "--rdzv-host", "with --nodes: the kernel's address the nodes can reach; the "
                                   "kernel listens there (join link and c10d store)", group="placement",
                                   metavar="ADDRESS", env="NBTRAIN_RDZV_HOST")
    hosts: str | None = option(None, "--hosts", "with --nodes: start a node agent on each of these hosts over ssh "
                               "(one per node) instead of printing the join command", group="placement",
                               metavar="A,B")
    ssh_option: tuple[str, ...] = option((), "--ssh-option", "with --hosts: an ssh option for the connections "
                                         "(repeatable), such as Port=2222", group="placement", metavar="KEY=VALUE",
                                         repeat=True, env="NBTRAIN_SSH_OPTION")
    slurm: str | None = option(
        None, "--slurm", "with --nodes: start the node agents as a Slurm job — sbatch ARGS from a login node, an srun "
        "step inside an allocation (SLURM_JOB_ID set) — such as --slurm \"-p gpu --time=2:00:00\" (alone: no "
        "ARGS)", group="placement", metavar="ARGS", bare="", env="NBTRAIN_SLURM")
    remote_python: str | None = option(None, "--remote-python", "with --hosts or --slurm: the command that runs Python on the "
                                       "hosts (default: this kernel's Python where that path exists there, else "
                                       "python3)", group="placement", metavar="COMMAND", env="NBTRAIN_REMOTE_PYTHON")
    out: str | None = option(None, "--out", "names to bring back from rank 0, comma-separated; '-' for none "
                             "(default: every name the cell assigns)", group="results", metavar="NAMES")
    out_limit: str | None = option(
        None, "--out-limit", "a sharded model larger than SIZE stays on the ranks instead of coming back to the "
        "notebook (default: half the memory this machine has available)", group="results", metavar="SIZE")
    output: str = option("all", "--output", "all: every rank's output, whole lines, others prefixed [rank k], "
                         "rank 0's progress bars live (default); rank<k>: rank k's output only, as printed "
                         "(rank1 shows rank 1's tqdm bar live)", group="results", metavar="all|rank<k>")
    keep_alive: float | None = option(
        None, "--keep-alive", "keep the ranks warm this long after the cell for a fast re-run "
        "(default 900; 0 stops them)", group="warm ranks", type=float, metavar="SECONDS")
    fresh: bool = option(False, "--fresh", "start new rank processes instead of reusing warm ones",
                         group="warm ranks", switch=True)
    spawn: bool = option(False, "--spawn", "start each rank as a new Python process instead of forking it from the "
                         "zygote (a process with torch imported that the extension starts)", group="warm ranks",
                         switch=True)
    env: tuple[str, ...] = option((), "--env", "environment variable for the ranks (repeatable)",
                                  group="warm ranks", metavar="NAME=VALUE", repeat=True)
    session: str | None = option(
        None, "--session", "run in the namespace session NAME keeps on the ranks: its variables stay there "
        "between cells (the distributed_sessions, distributed_pull and distributed_close magics list, fetch, end)", group="warm ranks",
        metavar="NAME")
    preemption_grace: float | None = option(
        None, "--preemption-grace", "after a preemption notice (SIGTERM, a cloud's reclaim notice), how long the ranks "
        "have to save a checkpoint at their next step before the machine is let go (default 25)", group="training",
        type=float, metavar="SECONDS", env="NBTRAIN_PREEMPTION_GRACE")
    tensorboard: str | None = option(
        None, "--tensorboard", "write every nbtrain.log() series as TensorBoard events, each rank's in DIR/rank<k> "
        "(relative to the notebook's current directory; needs the tensorboard package)", group="tracking",
        metavar="DIR", env="NBTRAIN_TENSORBOARD")
    track: tuple[str, ...] = option((), "--track", "follow the run in mlflow[=URI] (a directory: a local store), "
                                    "wandb[=PROJECT] or trackio[=PROJECT]: rank 0's series, the options and the summary (repeatable)", group="tracking",
                                    metavar="NAME[=WHERE]", repeat=True)
    profile: str | None = option(
        None, "--profile", "record a torch.profiler trace of STEPS optimizer steps on every rank (after 1 skipped "
        "and 1 warm-up step; or WAIT,WARMUP,ACTIVE) and show the top operators and the communication time",
        group="tracking", metavar="STEPS")
    price_per_gpu_hour: float | None = option(
        None, "--price-per-gpu-hour", "the price of one GPU for an hour (of one core on the CPU): the run's "
        "GPU-hours and cost are shown in the summary, the dashboard and nbtrain.runs()", group="tracking",
        type=float, metavar="PRICE", env="NBTRAIN_PRICE_PER_GPU_HOUR")


@dataclass(frozen=True)
class LaunchConfig:
    pool: PoolSpec
    out_names: tuple[str, ...] | None  # None: every name the cell assigns
    output: str
    keep_alive_s: float
    fresh: bool
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    notes: tuple[str, ...] = field(default_factory=tuple)
    train: TrainSettings = field(default_factory=TrainSettings)  # sent to the ranks with each Job
    workdir: Workdir | None = None  # the notebook's directory and sys.path when the cell runs (each Job)
    tensorboard: str | None = None  # absolute --tensorboard DIR (see nbtrain.kernel.observers.trackers)
    tracks: tuple[TrackSpec, ...] = ()  # --track (see nbtrain.kernel.observers.hosted_trackers)
    session: str = ""  # --session: the namespace kept on the ranks that the cell runs in; "" = a fresh one
    price_per_hour: float | None = None  # --price-per-gpu-hour (per core-hour on the CPU; nbtrain.kernel.observers.cost)
    spawn: bool = False  # --spawn: new ranks are new interpreters, not forks of the zygote
    preemption_grace_s: float = DEFAULT_PREEMPTION_GRACE_S  # a notice's checkpoint must be written within this
    gpu_wait_s: float | None = None  # how long to wait in the queue for the GPUs (0: --no-wait; None: no limit)
    attach: str = ""  # %distributed_attach: the detached run followed (its ranks run already; nothing is sent)

    @property
    def shown_rank(self) -> int | None:
        """The one rank whose output is shown (``--output rank<k>``), or None for all of them."""
        return None if self.output == "all" else int(self.output[len("rank"):])


def _torch_has_cuda() -> bool:
    import torch  # importing torch does not initialise CUDA

    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


def _parse_gpu_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part != ""]
    except ValueError:
        raise ConfigError(f"--gpus takes GPU numbers separated by commas, such as --gpus 0,2 (got {text!r}).") from None
    if not ids:
        raise ConfigError("--gpus names no GPU; give numbers such as --gpus 0,1.")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--gpus names a GPU twice ({text}); each GPU can be listed once.")
    return ids


def _half_the_free_memory() -> int:
    import psutil

    return psutil.virtual_memory().available // 2


def _parse_names(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    if text.strip() in ("-", ""):
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ConfigError(f"--out takes Python names separated by commas; {', '.join(map(repr, bad))} is not one.")
    return names


def _parse_env(items) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ConfigError(f"--env takes NAME=value (got {item!r}).")
        pairs.append((name, value))
    return tuple(pairs)


def _parse_output(text: str) -> str:
    """``all`` or ``rank<k>`` (also spelled ``rank <k>``)."""
    output = (text or "all").strip().lower().replace(" ", "")
    if output == "all" or (output.startswith("rank") and output[4:].isdigit()):
        return "all" if output == "all" else f"rank{int(output[4:])}"
    raise ConfigError(f"--output is 'all' (every rank) or 'rank<k>' for rank k's output only, such as "
                      f"--output rank0 (got {text!r}).")


def _node_counts(text: str) -> tuple[int, int]:
    """(MIN, MAX) of ``--nodes N`` (N, N) or ``--nodes MIN:MAX``, checked."""
    parts = text.split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"--nodes takes a number of machines, such as --nodes 2, or an elastic range MIN:MAX, "
                          f"such as --nodes 1:4 (got {text!r}).")
    low, high = int(parts[0]), int(parts[-1])
    if low < 1:
        raise ConfigError(f"--nodes {text}: at least 1 node is needed.")
    if low > high:
        raise ConfigError(f"--nodes {text}: MIN is more than MAX; give --nodes {high}:{low}.")
    return low, high


def _node_placement(request: LaunchRequest) -> tuple[int, int, str, int]:
    """(MAX nodes, ranks per node, rdzv host, MIN nodes or 0 if not elastic) of a ``--nodes`` request, checked;
    (1, 0, "", 0) without one."""
    if request.nodes is None:
        if request.slurm is not None and request.slurm != os.environ.get("NBTRAIN_SLURM"):  # NBTRAIN_SLURM: --nodes cells only
            raise ConfigError("--slurm starts the node agents of --nodes N as a Slurm job; give --nodes and --rdzv-host.")
        if request.hosts is not None:
            raise ConfigError("--hosts starts node agents for --nodes N; give --nodes with as many nodes as hosts, "
                              "and --rdzv-host.")
        if request.nproc_per_node is not None or request.rdzv_host or request.last_call is not None:
            raise ConfigError("--nproc-per-node, --rdzv-host and --last-call go with --nodes N (several machines); "
                              "on one machine give the number of ranks: %%distributed 4.")
        return 1, 0, "", 0
    text = str(request.nodes).strip()
    low, high = _node_counts(text)
    elastic = ":" in text and low != high
    per_node = request.nproc_per_node if request.nproc_per_node is not None else 1
    if per_node < 1:
        raise ConfigError(f"--nproc-per-node must be at least 1 (got {per_node}).")
    if request.nprocs is not None and (elastic or request.nprocs != high * per_node):
        made = "a world size decided when the group forms" if elastic else str(high * per_node)
        raise ConfigError(f"{count('rank', request.nprocs)} asked for, but --nodes {text} × --nproc-per-node "
                          f"{per_node} makes {made}; leave the number of ranks out with --nodes.")
    if request.last_call is not None and (not elastic or request.last_call < 0):
        raise ConfigError("--last-call SECONDS (0 or more) goes with an elastic --nodes MIN:MAX, such as --nodes 1:4 "
                          f"--last-call 5 (got --nodes {text} --last-call {request.last_call}).")
    if not request.rdzv_host:
        raise ConfigError("--nodes needs --rdzv-host ADDRESS: the kernel's address that the nodes can reach (it "
                          "listens there for them), such as --rdzv-host 10.0.0.5.")
    return high, per_node, request.rdzv_host.strip(), low if elastic else 0


def _node_pool(request: LaunchRequest, placement: tuple[int, int, str, int], backend: str | None) -> PoolSpec:
    """Several machines: devices are the nodes' (--cpu: gloo on CPU; else one GPU per rank, nccl)."""
    nodes, per_node, host, min_nodes = placement
    slurm_args = request.slurm
    if request.hosts is not None and slurm_args is not None:  # before either is checked: the mistake is giving both
        if slurm_args != os.environ.get("NBTRAIN_SLURM"):
            raise ConfigError("--hosts and --slurm both start the node agents (over ssh, as a Slurm job); give one "
                              "of them.")
        slurm_args = None  # --hosts on the cell wins over NBTRAIN_SLURM
    try:
        hosts = parse_hosts(request.hosts, nodes) if request.hosts is not None else ()
        slurm = parse_slurm(slurm_args) if slurm_args is not None else None
        ssh = (parse_ssh_options(request.ssh_option) if hosts else (),
               parse_remote_python(request.remote_python) if hosts or slurm is not None else "")
        preemption_url = check_url(request.preemption_url) if request.preemption_url else ""
    except (SshSetupError, PreemptionURLError) as exc:
        raise ConfigError(str(exc)) from None
    if request.gpus and not _is_auto(request.gpus):  # NBTRAIN_GPUS=auto, set for a shared server, is no mistake here
        raise ConfigError("--gpus picks GPUs of this machine; with --nodes each node uses its first "
                          "--nproc-per-node GPUs (set CUDA_VISIBLE_DEVICES on the node to choose).")
    device_type = "cpu" if request.cpu else "cuda"
    if device_type == "cpu" and backend == "nccl":
        raise ConfigError("The nccl backend needs GPUs, but --cpu was given. Use --backend gloo (or leave --backend out).")
    where = NodesSpec(nodes, per_node, host, hosts, ssh[0], ssh[1], slurm, min_nodes, preemption_url,
                      DEFAULT_LAST_CALL_S if request.last_call is None else float(request.last_call))
    return _pool_spec(request, backend or ("gloo" if device_type == "cpu" else "nccl"), nprocs=nodes * per_node,
                      device_type=device_type, gpu_ids=(), nodes=where)


def _default_keep_alive() -> float:
    """How long warm ranks wait for the next cell when the cell gives no --keep-alive: the administrator's
    ``idle_release_s`` on a shared server (:mod:`nbtrain.gpu.leasepolicy`), else nbtrain's default."""
    try:
        policy = leasepolicy.load()
    except leasepolicy.PolicyError:
        return DEFAULT_KEEP_ALIVE_S  # a policy that cannot be read refuses the run's GPUs, saying why, later
    return DEFAULT_KEEP_ALIVE_S if policy.idle_release_s is None else float(policy.idle_release_s)


def _pool_spec(request: LaunchRequest, backend: str, **where) -> PoolSpec:
    """The one place a :class:`PoolSpec` is made: what every pool takes from the request, and where it runs."""
    return PoolSpec(backend=backend, timeout_s=float(request.timeout or DEFAULT_TIMEOUT_S),
                    env=_parse_env(request.env), **where)


def _parse_session(name: str | None, max_restarts: int | None) -> str:
    if name is None:
        return ""
    if not SESSION_NAME.fullmatch(name):
        raise ConfigError(f"--session takes a short name of letters, digits, '_', '.' or '-', such as --session s1 "
                          f"(got {name!r}).")
    if max_restarts:
        raise ConfigError("--max-restarts starts fresh ranks, which would lose the session's variables; "
                          "use one of --session and --max-restarts.")
    return name


def resolve(request: LaunchRequest) -> LaunchConfig:
    """Check the request against this machine and decide devices, backend and rank count."""
    try:
        request = with_env_fallbacks(request)
    except OptionEnvError as exc:
        raise ConfigError(str(exc)) from None
    try:
        workdir = notebook_workdir()  # first: a deleted directory makes every relative path below meaningless
    except WorkdirGone as exc:
        raise ConfigError(str(exc)) from None
    if request.nprocs is not None and request.nprocs < 1:
        raise ConfigError(f"The number of ranks must be at least 1 (got {request.nprocs}).")
    if request.cpu and request.gpus and not _is_auto(request.gpus):
        raise ConfigError("--cpu and --gpus contradict each other; use one of them.")
    backend = request.backend.lower() if request.backend else None
    if backend not in (None, "nccl", "gloo"):
        raise ConfigError(f"Unknown backend {request.backend!r}: use nccl (GPUs) or gloo (CPU, or GPUs).")
    if request.timeout is not None and request.timeout <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds (got {request.timeout}).")
    if request.start_timeout is not None and request.start_timeout <= 0:
        raise ConfigError(f"--start-timeout must be a positive number of seconds (got {request.start_timeout}).")
    output = _parse_output(request.output)
    placement = _node_placement(request)
    if placement[0] > 1 or placement[2]:
        pool = _node_pool(request, placement, backend)
        return _finish(request, detached_spec(request, pool) if request.detach else pool, output, workdir, [])

    visible = [] if request.cpu else nvml.visible_gpus()
    notes: list[str] = []
    on_gpu = bool(visible) and _torch_has_cuda()
    if visible and not on_gpu:
        notes.append("this PyTorch build has no CUDA support, so the ranks run on CPU")
    if _is_auto(request.gpus) and not request.cpu:
        if request.detach:
            raise ConfigError("--gpus auto leases GPUs for the kernel's own ranks; a --detach run needs them named: "
                              "--gpus 0,1 (%gpus shows which are free).")
        return _finish(request, _auto_pool(request, backend, visible, on_gpu), output, workdir, notes)
    if request.gpus and not request.cpu:  # on a CPU-only PyTorch the GPUs named are still leased, so that no one else trains on them
        wanted = _parse_gpu_ids(request.gpus)
        known = {g.index: g for g in visible}
        unknown = [i for i in wanted if i not in known]
        if unknown:
            have = ", ".join(str(g.index) for g in visible) or "none"
            raise ConfigError(f"GPU {', '.join(map(str, unknown))} not found; the GPUs this kernel can use are: {have}.")
        gpus = [known[i] for i in wanted]
    else:
        gpus = visible if on_gpu else []
    leased = tuple(g.index for g in gpus)
    gpus = gpus if on_gpu else []

    if backend == "nccl" and not gpus:
        why = "--cpu was given" if request.cpu else "no NVIDIA GPU is visible"
        raise ConfigError(f"The nccl backend needs GPUs, but {why}. Use --backend gloo (or leave --backend out).")
    nprocs = request.nprocs or (len(gpus) if gpus else 2)
    backend = backend or ("nccl" if gpus else "gloo")
    if backend == "nccl" and nprocs > len(gpus):
        raise ConfigError(
            f"{count('rank', nprocs)} on nccl need {count('GPU', nprocs)}, but only {len(gpus)} "
            f"({', '.join(str(g.index) for g in gpus)}) can be used. Run {count('rank', len(gpus))}, or use --backend gloo."
        )
    pool = _pool_spec(request, backend, nprocs=nprocs, device_type="cuda" if gpus else "cpu", gpu_ids=leased)
    notes += [] if gpus else _crowded_cores(nprocs)
    if request.detach:
        pool = detached_spec(request, pool)
    return _finish(request, pool, output, workdir, notes)


def _crowded_cores(nprocs: int) -> list[str]:
    """A note for CPU ranks more than twice the cores this kernel may run on: they take turns, and each collective
    waits for the ranks that are not running — a run that works, slowly, and a hint that says why."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if nprocs <= 2 * cores:
        return []
    return [f"{count('rank', nprocs)} on {count('CPU core', cores)}: the ranks take turns on the cores and every "
            f"all-reduce waits for the ones not running; %%distributed {cores} would run faster here"]


def _gpu_wait(request: LaunchRequest) -> float | None:
    """How long the cell waits in the queue for its GPUs: 0 with --no-wait, None for as long as it takes."""
    if request.no_wait:
        return 0.0
    if request.gpu_timeout is not None and request.gpu_timeout <= 0:
        raise ConfigError(f"--gpu-timeout must be a positive number of seconds (got {request.gpu_timeout}); "
                          "--no-wait fails at once.")
    return request.gpu_timeout


def _is_auto(gpus: str | None) -> bool:
    return (gpus or "").strip().lower() == "auto"


def _auto_pool(request: LaunchRequest, backend: str | None, visible: list, on_gpu: bool) -> PoolSpec:
    """``--gpus auto``: as many GPUs as ranks, chosen among the free ones when the pool starts
    (:mod:`nbtrain.kernel.lifecycle.gpulease`)."""
    if request.nprocs is None:
        raise ConfigError("--gpus auto leases one free GPU per rank, so it needs the number of ranks: "
                          "%%distributed 2 --gpus auto.")
    if not visible:
        raise ConfigError("--gpus auto chooses among this machine's GPUs, but no NVIDIA GPU is visible. "
                          "Leave --gpus out.")
    if request.nprocs > len(visible):
        raise ConfigError(f"--gpus auto: {count('rank', request.nprocs)} need {count('GPU', request.nprocs)}, but "
                          f"this machine has {len(visible)}. Run {count('rank', len(visible))} at most.")
    if backend == "nccl" and not on_gpu:
        raise ConfigError("The nccl backend needs CUDA, but this PyTorch build has none. Use --backend gloo.")
    return _pool_spec(request, backend or ("nccl" if on_gpu else "gloo"), nprocs=request.nprocs,
                      device_type="cuda" if on_gpu else "cpu", gpu_ids=(), gpu_count=request.nprocs)


def _finish(request: LaunchRequest, pool: PoolSpec, output: str, workdir: Workdir, notes: list[str]) -> LaunchConfig:
    """The per-cell settings around a checked pool spec."""
    nprocs = pool.nprocs
    if output != "all" and int(output[len("rank"):]) >= nprocs:
        raise ConfigError(f"--output {output}: there is no such rank; this run's ranks are numbered 0 to {nprocs - 1}.")
    keep_alive = _default_keep_alive() if request.keep_alive is None else float(request.keep_alive)
    if pool.nodes is not None and pool.nodes.detached:
        keep_alive = 0.0  # a detached run's agent and ranks end with the run
    elif request.run_id is not None:
        raise ConfigError("--run-id names a detached run: give --detach too, or leave --run-id out.")
    if keep_alive < 0:
        raise ConfigError(f"--keep-alive must be 0 or more seconds (got {request.keep_alive}).")
    try:
        train = parse_train_settings(request, cwd=workdir.cwd)
    except TrainSettingsError as exc:
        raise ConfigError(str(exc)) from None
    start_timeout = DEFAULT_START_TIMEOUT_S if request.start_timeout is None else float(request.start_timeout)
    grace = DEFAULT_PREEMPTION_GRACE_S if request.preemption_grace is None else float(request.preemption_grace)
    if grace <= 0:
        raise ConfigError(f"--preemption-grace must be a positive number of seconds (got {request.preemption_grace}).")
    try:
        tensorboard = tensorboard_dir(request.tensorboard, workdir.cwd) if request.tensorboard is not None else None
        tracks = parse_tracks(tuple(request.track), workdir.cwd)
    except TrackerSetupError as exc:
        raise ConfigError(str(exc)) from None
    if request.profile is not None:
        try:
            train = replace(train, profile=parse_profile(request.profile),
                            profile_dir=profile_dir(workdir.cwd, tensorboard))
        except ProfileOptionError as exc:
            raise ConfigError(str(exc)) from None
    if train.shard:
        try:
            limit = parse_size(request.out_limit, "--out-limit") if request.out_limit else _half_the_free_memory()
        except TrainSettingsError as exc:
            raise ConfigError(str(exc)) from None
        train = replace(train, out_limit=limit)
    if train.shard_offload and pool.device_type != "cuda":
        raise ConfigError("--shard-offload keeps the shards in CPU memory while the ranks compute on GPUs; these ranks "
                          "run on the CPU, where the shards are already. Leave it out.")
    if train.shard == "hybrid" and not train.ft and (pool.nodes is None or pool.nodes.count <= 1):
        raise ConfigError("--shard hybrid replicates the model across nodes and shards it within each, so it needs "
                          "--nodes N (on one machine, use --shard, or --ft replicas=R: R replica groups).")
    pool = with_training(fault_tolerant(request, pool, train.ft_replicas) if train.ft else pool, train)
    session = _parse_session(request.session, request.max_restarts)
    try:
        price = parse_price(request.price_per_gpu_hour)
    except PriceError as exc:
        raise ConfigError(str(exc)) from None
    if session and request.nodes is not None:
        raise ConfigError("--session keeps variables on this machine's warm ranks; it does not go with --nodes yet. "
                          "Leave out one of them.")
    return LaunchConfig(pool, _parse_names(request.out), output, keep_alive, request.fresh,
                        start_timeout_s=start_timeout, notes=tuple(notes), train=train, workdir=workdir,
                        tensorboard=tensorboard, tracks=tracks, session=session, price_per_hour=price,
                        spawn=request.spawn, preemption_grace_s=grace, gpu_wait_s=_gpu_wait(request))
