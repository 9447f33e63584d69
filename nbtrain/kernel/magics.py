"""IPython magics: ``%%distributed``, ``%distributed_shutdown``, ``%distributed_nodes``, the session magics
(``%distributed_sessions``, ``%distributed_pull``, ``%distributed_close``) and ``%gpus``: they parse their
arguments, then call plain functions (:func:`distributed_cell` adds the dashboard, runs
:func:`~.launch.lifecycle.entry.run_source` and prints the summary; the session magics call :mod:`nbtrain.kernel.lifecycle.entry`'s
``list_sessions``, ``pull`` and ``close``; ``%gpus`` is :func:`nbtrain.kernel.dashboard.show_gpus`).

Each ``%%distributed`` option is declared once, as a field of :class:`~.launch.config.LaunchRequest` (how
the cell runs) or of :class:`CellDisplay` (what the notebook shows), with :func:`~nbtrain.wire.options.option`.
The magic's arguments are generated from those fields, in groups added as decorators (``placement_args``,
``training_args``, … as ipyparallel's magics share theirs), and the parsed arguments become the two
dataclasses by field name, so adding an option means adding one field.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from . import dashboard
from .background import BackgroundCell, BackgroundRun, BackgroundRuns
from .cluster import Cluster
from .cluster.detached_runs import AttachChoiceError, choose_run, follow_or_control, runs_table, settled_runs
from ..wire.detached_stop import stop_all_detached
from .cluster.tokens import parse_ttl
from ..gpu import leases
from .lifecycle import entry
from .lifecycle.entry import UserInputError, format_summary, run_source
from .lifecycle.pools import PoolManager
from .observers.history import RunOutcome
from .observers.registry import RunRegistry
from .request.config import LaunchRequest
from .request.hosts import parse_hosts, parse_remote_python, parse_slurm, parse_ssh_options
from ..common.words import count
from ..wire.agent_options import check_url
from ..wire.runfolder import RunFolderError, read_about
from ..wire.options import OptionEnvError, from_arguments, option, options_of, with_env_fallbacks


@dataclass(frozen=True)
class CellDisplay:
    """The options of ``%%distributed`` that decide what the notebook shows and whether it waits, not how the
    ranks run."""

    background: bool = option(False, "--background", "return at once with a handle (nbtrain.last_run) while the "
                              "ranks train; the cell's names arrive between later cells", group="display",
                              switch=True, env="NBTRAIN_BACKGROUND")
    quiet: bool = option(False, "--quiet", "do not print the one-line summary after the run", group="display",
                         switch=True)
    dashboard: bool = option(True, "--no-dashboard", "do not show the live dashboard (GPU use, logged curves)",
                             group="display", switch=True)


@dataclass(frozen=True)
class NodesCommand:
    """The options only ``%distributed_nodes`` has; it shares the cell's node options by name (:data:`NODE_OPTIONS`)."""

    emulate: int = option(0, "--emulate", "start N node agents on this machine, on 127.0.0.2, 127.0.0.3, … (with "
                          "--rdzv-host 127.0.0.1): emulated nodes, to try --nodes without a cluster", group="nodes",
                          type=int, metavar="N")
    token_ttl: str | None = option(None, "--token-ttl", "a new join token, admitting nodes for this long (900, 30m, "
                                   "2h; default 1h)", group="nodes", metavar="DURATION")
    revoke: bool = option(False, "--revoke", "revoke the join token: a new one admits nodes from now on (joined "
                          "nodes stay)", group="nodes", switch=True)


NODE_OPTIONS = ("rdzv_host", "hosts", "ssh_option", "remote_python", "slurm", "nodes", "preemption_url")  # LaunchRequest's, on %distributed_nodes too


def option_group(cls, group: str | None = None, names: tuple[str, ...] = ()):
    """A decorator adding options of ``cls`` to a magic, in declaration order: those of ``group``, or ``names``.

    The shared option groups of ipyparallel's magics, generated from :mod:`nbtrain.wire.options`.
    """
    specs = [spec.argparse_spec(f.name, f.default) for f, spec in options_of(cls)
             if (spec.group == group if group else f.name in names)]
    if not specs:
        raise ValueError(f"{cls.__name__} has no option in group {group!r} or named {names}")

    def add_options(func):
        for names, kwargs in reversed(specs):  # IPython builds the parser from the last decorator applied
            func = argument(*names, **kwargs)(func)
        return func

    return add_options


placement_args = option_group(LaunchRequest, "placement")
results_args = option_group(LaunchRequest, "results")
warm_rank_args = option_group(LaunchRequest, "warm ranks")
display_args = option_group(CellDisplay, "display")
training_args = option_group(LaunchRequest, "training")
tracking_args = option_group(LaunchRequest, "tracking")
speed_args = option_group(LaunchRequest, "speed")
node_args = option_group(LaunchRequest, names=NODE_OPTIONS)
nodes_command_args = option_group(NodesCommand, "nodes")


def parse_argstring(magic, line: str, name: str | None = None):
    """The magic's arguments from ``line``, as IPython parses them; an unknown option is named with the closest
    known one (``--chekpoint`` → ``--checkpoint``), a UsageError before anything starts. ``name``: the magic as
    the user types it (``%%distributed``; default: the parser's ``%name``)."""
    try:
        return magic.parser.parse_argstring(line)
    except UsageError as exc:
        unknown = _unknown_options(str(exc))
        if not unknown:
            raise
        known = [flag for action in magic.parser._actions for flag in action.option_strings]
        raise UsageError(unknown_option_message(unknown[0], known, name or magic.parser.prog)) from None


def _unknown_options(message: str) -> list[str]:
    """The words that look like options in argparse's "unrecognized arguments: ..." message."""
    if not message.startswith("unrecognized arguments:"):
        return []
    words = message.split(":", 1)[1].split()
    return [word.split("=", 1)[0] for word in words if re.match(r"--?[A-Za-z]", word)]


def unknown_option_message(word: str, known: list[str], magic: str) -> str:
    """``unknown option --chekpoint; did you mean --checkpoint?``, or where the options are listed."""
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.8)  # a typo (0.83 and up), not another word
    if close:
        return f"unknown option {word}; did you mean {close[0]}?"
    return f"unknown option {word}; `{magic}?` lists the options this magic takes."


def node_options(args) -> LaunchRequest:
    """``%distributed_nodes``'s shared options as a request, with the same environment fallbacks as a cell's."""
    values = vars(args)
    shared: dict[str, Any] = {name: tuple(values[name]) if isinstance(values[name], list) else values[name]
                              for name in NODE_OPTIONS}
    given = replace(LaunchRequest(), **shared)
    try:
        return with_env_fallbacks(given)
    except OptionEnvError as exc:
        raise UsageError(str(exc)) from None


@magics_class
class DistributedMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.cluster = Cluster()  # joined nodes (--nodes), kept between cells
        self.pools = PoolManager(self.cluster.make_pool, machines=self.cluster)  # a Slurm job: released when idle
        self.background = BackgroundRuns(shell, self.pools) if shell is not None else None
        self.last_run: BackgroundRun | None = None
        self._registry = None

    def observers(self, background: int = 0) -> list:
        """Who follows each run: the run registry (read by the Jupyter server extension); a background run's own
        record (``background``: its number), beside the kernel's blocking cells' one."""
        if background:
            try:
                return [RunRegistry(background=background)]
            except OSError:
                return []
        if self._registry is None:
            try:
                self._registry = RunRegistry()
            except OSError as exc:  # an unwritable runtime dir must not stop training
                print(f"nbtrain: runs will not be listed in JupyterLab ({exc})")
                self._registry = False
        return [self._registry] if self._registry else []

    @magic_arguments(name="%distributed")  # a cell magic: the help's usage line reads %%distributed
    @placement_args
    @results_args
    @warm_rank_args
    @display_args
    @training_args
    @tracking_args
    @speed_args
    @cell_magic
    def distributed(self, line, cell):
        """Run this cell's code as N PyTorch DDP ranks, each its own process.

        Every rank runs the whole cell with the default process group initialised and these names set:
        ``rank``, ``local_rank``, ``world_size`` and ``device`` (its GPU, or the CPU). RANK, LOCAL_RANK,
        WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set as torchrun sets them, so a pasted torchrun script
        (with its own ``dist.init_process_group()``) runs unchanged. Notebook variables the cell reads
        are sent to the ranks; names the cell assigns on rank 0 come back into the notebook.

        Examples::

            %%distributed 4
            model = DDP(Net().to(device))
            ...
            final_loss = loss.item()        # back in the notebook after the cell

            %%distributed 2 --cpu --out model,final_loss
            %%distributed --gpus 0,2 --timeout 120
            %%distributed 4 --output rank0 --keep-alive 0
            %%distributed 4 --amp bf16 --grad-accum 4 --checkpoint runs/exp1   # see nbtrain.prepare()
            %%distributed 4 --compile --no-channels-last
            %%distributed 2 --session s1 --out -   # variables stay on the ranks for the next s1 cell
        """
        args = parse_argstring(self.distributed, line, "%%distributed")
        try:
            display = with_env_fallbacks(from_arguments(CellDisplay, args))
        except OptionEnvError as exc:
            raise UsageError(str(exc)) from None
        request = from_arguments(LaunchRequest, args)
        display = replace(display, background=display.background or request.detach)  # --detach implies --background
        background = self.background.count + 1 if display.background and self.background is not None else 0
        side = ShellSide(self.shell, self.pools, tuple(self.observers(background)))
        if display.background:
            self.last_run = start_background(side, (line, cell), request, display, self.background)
            return self.last_run
        return distributed_cell(side, cell, request, display)

    @magic_arguments()
    @argument("--once", action="store_true", help="print a table of the GPUs (or CPU/RAM) now instead of a live view")
    @argument("--interval", type=float, metavar="SECONDS", help="seconds between samples, 0.25 to 5 (default 1)")
    @argument("--for", dest="duration", type=float, metavar="SECONDS",
              help="stop the live view after this long (default 600; 0: until stopped)")
    @argument("--stop", action="store_true", help="stop every live view started by %%gpus")
    @line_magic
    def gpus(self, line):
        """Show this machine's GPUs — utilisation, memory, temperature, power, processes — live, under the cell.

        Without an NVIDIA driver it shows CPU and RAM instead. In a terminal, or with ``--once``, it prints a
        table. Examples: ``%gpus``, ``%gpus --once``, ``%gpus --interval 0.5 --for 0``, ``%gpus --stop``.
        """
        args = parse_argstring(self.gpus, line)
        try:
            dashboard.show_gpus(self.shell, once=args.once, interval=args.interval, duration=args.duration,
                                stop=args.stop)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not args.stop:
            for line in leases.view_lines():  # who holds which GPU of this machine (docs/shared-servers.md)
                print(line)

    @magic_arguments()
    @argument("run", nargs="?", help="the detached run's id (default: your only running one; if none runs, the "
              "one that finished last)")
    @argument("--background", action="store_true", help="return at once with a handle (nbtrain.last_run) while "
              "the run goes on, as %%%%distributed --background does")
    @argument("--list", action="store_true", help="list your detached runs on this machine and attach to none")
    @argument("--force", action="store_true", help="take control of the run from the kernel that has it (the one "
              "that started it, while it lives): this kernel's stop button then stops the run")
    @line_magic
    def distributed_attach(self, line):
        """Follow a ``%%distributed --detach`` run from this kernel, as its cell would have run: its output and
        curves from the start, then live; the stop button stops it; its names and ``history`` arrive at its end
        (at once, if it ended already). While the kernel that started it (or attached first) lives, that kernel's
        stop button stops the run and this one's stops following only; ``--force`` takes control. Examples:
        ``%distributed_attach``, ``%distributed_attach RUN_ID``, ``%distributed_attach --background``,
        ``%distributed_attach --list``.
        """
        args = parse_argstring(self.distributed_attach, line)
        if args.list:
            print(runs_table(settled_runs()))
            return None
        try:
            run = choose_run(args.run)
        except (AttachChoiceError, RunFolderError) as exc:
            raise UsageError(str(exc)) from None
        about = read_about(run.run_id)
        cell_line, source = str(about.get("line", "")), str(about.get("source", ""))
        recorded = parse_argstring(self.distributed, cell_line, "%%distributed")
        request = replace(from_arguments(LaunchRequest, recorded), detach=False, run_id=None)
        display = replace(from_arguments(CellDisplay, recorded), background=args.background)
        print(f"nbtrain: attached to detached run {run.run_id} ({run.state.value}"
              + (f", step {run.step}" if run.step is not None else "") + ")" + (f": {run.reason}" if run.reason else ""))
        following = follow_or_control(run, args.force)  # else another kernel's stop button stops the run
        if following:
            print(following)
        side = ShellSide(self.shell, self.pools.companion(), tuple(self.observers(0)), attach=run.run_id)
        if args.background:  # (the companion: the kernel's warm ranks stay the blocking cells')
            self.last_run = start_background(side, (cell_line, source), request, display, self.background)
            return self.last_run
        return distributed_cell(side, source, request, display)

    @magic_arguments()
    @argument("--detached", action="store_true", help="also stop every detached run of yours on this machine "
              "(%%%%distributed --detach), wherever it was started")
    @line_magic
    def distributed_shutdown(self, line):
        """Stop the warm ranks kept for fast re-runs, end every session (they also stop at kernel exit), and let
        joined nodes go (their agents exit). ``--detached`` also stops your detached runs."""
        args = parse_argstring(self.distributed_shutdown, line)
        if args.detached:
            print("\n".join(stop_all_detached()) or "nbtrain: no detached run of yours is running.")
        sessions = list(self.pools.sessions.live)
        if self.pools.shutdown():
            ended = f" (sessions ended: {', '.join(sessions)})" if sessions else ""
            print(f"nbtrain: stopped the warm ranks{ended}.")
        else:
            print("nbtrain: no warm ranks to stop.")
        if self.cluster.close():
            print("nbtrain: the joined nodes were released; their agents exit.")

    @magic_arguments()
    @node_args
    @nodes_command_args
    @line_magic
    def distributed_nodes(self, line):
        """List the nodes joined for ``%%distributed --nodes N``: address, GPUs, state; and the command to join more.

        Examples: ``%distributed_nodes``, ``%distributed_nodes --rdzv-host 10.0.0.5`` (print the join command
        now), ``%distributed_nodes --rdzv-host 127.0.0.1 --emulate 2`` (two emulated nodes on this machine),
        ``%distributed_nodes --rdzv-host 10.0.0.5 --hosts gpu1,gpu2`` (start agents there over ssh),
        ``%distributed_nodes --rdzv-host 10.0.0.5 --slurm "-p gpu" --nodes 2`` (start them as a Slurm job now).
        """
        args = parse_argstring(self.distributed_nodes, line)
        command, nodes = from_arguments(NodesCommand, args), node_options(args)
        if command.revoke or command.token_ttl:
            try:
                print(self.cluster.renew_token(nodes.rdzv_host, parse_ttl(command.token_ttl) if command.token_ttl
                                               else None, command.revoke))
            except (ValueError, OSError) as exc:
                raise UsageError(str(exc)) from None
        if nodes.hosts is not None:
            return self._start_hosts(nodes, command)
        if args.slurm is not None:  # given here (NBTRAIN_SLURM is for --nodes cells): start the job now
            return self._start_slurm(nodes, command)
        if command.emulate and not nodes.rdzv_host:
            raise UsageError("--emulate needs --rdzv-host 127.0.0.1 (the address the emulated nodes join)")
        if command.emulate < 0:
            raise UsageError(f"--emulate {command.emulate}: give a number of nodes, 1 or more")
        try:
            if command.emulate and nodes.rdzv_host:
                started = self.cluster.emulate(nodes.rdzv_host, command.emulate, _preemption_url(nodes))
                print(f"nbtrain: started {count('emulated node agent', len(started))} on {', '.join(started)}; "
                      "they join in a few seconds")
            elif nodes.rdzv_host:
                self.cluster.hub(nodes.rdzv_host)
        except (ValueError, OSError) as exc:
            raise UsageError(str(exc)) from None
        print("\n".join(self.cluster.describe()))

    def _start_hosts(self, nodes: LaunchRequest, command: NodesCommand) -> None:
        """``%distributed_nodes --hosts a,b``: checked first, then an ssh session per host."""
        if not nodes.rdzv_host or command.emulate:
            raise UsageError("--hosts needs --rdzv-host ADDRESS (the kernel's address the hosts can reach), "
                             "and goes without --emulate")
        try:
            hosts = parse_hosts(nodes.hosts or "")
            options = parse_ssh_options(nodes.ssh_option)
            python = parse_remote_python(nodes.remote_python)
            started = self.cluster.start_hosts(nodes.rdzv_host, hosts, options, python, _preemption_url(nodes))
        except (ValueError, OSError) as exc:
            raise UsageError(str(exc)) from None
        if started:
            print(f"nbtrain: starting node agents over ssh on {', '.join(started)}; they join in a few seconds")
        print("\n".join(self.cluster.describe()))

    def _start_slurm(self, nodes: LaunchRequest, command: NodesCommand) -> None:
        """``%distributed_nodes --slurm ARGS --nodes N``: checked first, then the job (or the step) is started."""
        counts = (nodes.nodes or "1").split(":")
        if not nodes.rdzv_host or command.emulate or len(counts) > 2 or not all(c.strip().isdigit() and int(c) > 0
                                                                                 for c in counts):
            raise UsageError("--slurm needs --rdzv-host ADDRESS (the kernel's address the nodes can reach) and "
                             "--nodes N or MIN:MAX (1 or more; default 1), and goes without --emulate")
        low, high = int(counts[0]), int(counts[-1])
        try:
            words = parse_slurm(nodes.slurm or "")
            python = parse_remote_python(nodes.remote_python)
            print(self.cluster.start_slurm(nodes.rdzv_host, max(low, high), words, python,
                                           min(low, high) if low != high else 0, _preemption_url(nodes)))
        except (ValueError, OSError) as exc:
            raise UsageError(str(exc)) from None
        print("\n".join(self.cluster.describe()))

    @line_magic
    def distributed_sessions(self, line):
        """List the sessions (``%%distributed N --session NAME``): ranks, devices, memory, the names each holds."""
        print("\n".join(entry.list_sessions(self.pools)))

    @magic_arguments()
    @argument("session", help="the session's name")
    @argument("names", nargs="*", help="names the session holds on rank 0")
    @line_magic
    def distributed_pull(self, line):
        """Bring names a session holds on rank 0 into the notebook: ``%distributed_pull s1 model opt``."""
        args = parse_argstring(self.distributed_pull, line)
        names = [n for part in args.names for n in part.split(",") if n]
        try:
            result = entry.pull(self.pools, args.session, names, self.shell.user_ns if self.shell else {})
        except UserInputError as exc:
            raise UsageError(str(exc)) from None
        print("\n".join(format_summary(result)))

    @magic_arguments()
    @argument("session", help="the session's name")
    @line_magic
    def distributed_close(self, line):
        """End a session: its processes stop (unless another session lives on them: then they drop what it held)."""
        args = parse_argstring(self.distributed_close, line)
        try:
            entry.close(self.pools, args.session)
        except UserInputError as exc:
            raise UsageError(str(exc)) from None
        print(f"nbtrain: session {args.session!r} ended.")


def _preemption_url(nodes: LaunchRequest) -> str:
    """``--preemption-url`` of ``%distributed_nodes``, checked (a ValueError says what it takes)."""
    return check_url(nodes.preemption_url) if nodes.preemption_url else ""


@dataclass(frozen=True)
class ShellSide:
    """Where a ``%%distributed`` cell runs: the IPython shell, the kernel's pools, who follows each run."""

    shell: Any
    pools: PoolManager
    observers: tuple = ()
    attach: str = ""  # %distributed_attach: the detached run the cell follows instead of starting ranks


def distributed_cell(side: ShellSide, cell: str, request: LaunchRequest, display: CellDisplay) -> None:
    """What ``%%distributed`` does once its line is parsed: add the dashboard, run, show the summary."""
    observer = _dashboard(side.shell, display)
    with_dashboard = replace(side, observers=(*side.observers, *([observer] if observer is not None else [])))
    return run_in_shell(with_dashboard, cell, request, quiet=display.quiet, advisor=observer)


def start_background(side: ShellSide, cell: tuple[str, str], request: LaunchRequest, display: CellDisplay,
                     runs: BackgroundRuns | None) -> BackgroundRun:
    """``%%distributed --background`` (``cell``: the magic's line and the cell): the cell's mistakes are said now;
    then it returns the run's handle."""
    if runs is None:
        raise UsageError("--background needs IPython's shell: run the cell in a notebook or IPython.")
    observer = _dashboard(side.shell, display)
    observers = (*side.observers, *([observer] if observer is not None else []))
    try:
        run = runs.start(BackgroundCell(cell[1], request, observers, observer, display.quiet, cell[0], side.attach))
    except UserInputError as exc:
        raise UsageError(str(exc)) from None
    if run.detached and not side.attach:
        print(f"nbtrain: detached run {run.detached}: it goes on if this kernel stops or restarts; "
              f"%distributed_attach {run.detached} follows it from any kernel of yours on this machine")
    return run


def _dashboard(shell, display: CellDisplay):
    try:
        return dashboard.observer_for(shell, enabled=display.dashboard)
    except ValueError as exc:  # NBTRAIN_DASHBOARD set to something unknown
        raise UsageError(str(exc)) from None


def run_in_shell(side: ShellSide, cell: str, request: LaunchRequest, quiet: bool = False, advisor=None) -> None:
    """Run a cell in ``side.shell``'s namespace; user mistakes become UsageError, before any process starts.
    ``advisor``: the dashboard that sampled the run's telemetry, whose hints the summary shows (None: the
    hints the run's own records support)."""
    shell = side.shell
    code_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    outcome = RunOutcome()
    try:
        result = run_source(cell, request, shell.user_ns, manager=side.pools, code_name=code_name,
                            observers=side.observers, outcome=outcome, attach=side.attach)
    except UserInputError as exc:
        raise UsageError(str(exc)) from None
    except BaseException:  # failed or stopped: what was logged until then is still the notebook's
        if len(outcome.history):
            shell.user_ns["history"] = outcome.history
        raise
    if len(result.history):
        shell.user_ns["history"] = result.history
    if not quiet:
        print("\n".join(format_summary(result, advisor.hints() if advisor is not None else None)))
