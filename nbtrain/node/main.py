"""A node agent's life: join, serve the kernel's pools, leave with the pool.

1. **join** — parse ``--join HOST:PORT`` and read the token from ``--token-file``, stdin (``--token -``) or
   ``$NBTRAIN_JOIN_TOKEN``, never from the command line (:mod:`.token`; the token carries the address too:
   ``--join`` must agree),
   connect from ``--address`` if given (emulated nodes on 127.0.0.2, 127.0.0.3, …), TLS with the pinned
   certificate, the mutual handshake, then :class:`~nbtrain.wire.nodes.NodeHello` in its fixed raw layout; the
   kernel answers with the node's name. A kernel busy admitting other connections, or not reachable yet, is
   tried again with a growing pause (:func:`join`) until ``--start-timeout`` or the token's expiry: the agents
   of a Slurm job are not lost to a moment of contention;
2. **serve** — heartbeats every second both ways (the node's carry its CPU, RAM and GPU use: :func:`telemetry`); :class:`~nbtrain.wire.nodes.StartRanks` runs torch
   elastic's agent for this node's ranks (:mod:`.agent`), ``Deliver``, ``Interrupt`` and ``StopRanks`` go to
   the local ranks (:mod:`.ranks`);
   Its terminal shows a line per event; torch's stack traces go to the agent's log file (:mod:`.console`).
   A preemption notice — SIGTERM to the agent, or the cloud's metadata service with ``--preemption-url``
   (:mod:`.preemption`) — goes to the kernel at once; the agent stays until the kernel has had the
   checkpoint written and says :class:`~nbtrain.wire.nodes.Bye` (a notice with no ranks running, or a
   second SIGTERM, ends it at once).
3. **leave** — on :class:`~nbtrain.wire.nodes.Bye` (the pool ended), when the link breaks, or when the kernel
   has been silent for :data:`KERNEL_SILENT_S`: the ranks are stopped (SIGTERM → SIGKILL), the node's
   shared-memory files and private directory removed, and the agent exits. It never outlives its pool —
   except the agent of a detached run (:mod:`.detached`), which sees that run to its end first.
"""

from __future__ import annotations

import argparse
import importlib
import os
import queue
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING

import psutil

from ..common.leftovers import sweep_quietly, sweep_temp
from ..wire import nodes as N
from ..wire.link import JoinToken, Link, LinkError, LinkRetry, connect
from ..wire.shm import sweep_orphans
from .agent import run_ranks
from .detached import Outbox
from .detached_restarts import see_through
from .console import route_output, say
from ..wire.agent_options import AgentOptions, PreemptionURLError, check_url
from ..wire.options import OptionEnvError, options_of, with_env_fallbacks
from .notices import Notices
from .local_ranks import LocalRanks
from .token import read_token, reexec_without_token

if TYPE_CHECKING:  # imported only by a --detach --nodes run's agent: it brings the kernel's cluster modules
    from .relay import RelayRanks

HEARTBEAT_S = 1.0
KERNEL_SILENT_S = 5.0
NOTICE_CHECK_S = 0.05  # how soon a SIGTERM goes to the kernel (a signal handler cannot use the link's locks)
START_TIMEOUT_S = 180.0  # how long a join is tried again: the cell's default --start-timeout
RETRY_FIRST_S = 0.2  # the first pause before trying again; it doubles, up to RETRY_MAX_S
RETRY_MAX_S = 5.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nbtrain.node",
                                     description="Join a notebook's %%distributed pool as a node.")
    parser.add_argument("--join", required=True, metavar="HOST:PORT", help="the kernel's address, as the cell printed it")
    parser.add_argument("--token", metavar="-",
                        help="'-' reads the join token from stdin (--hosts sends it so over ssh); a token itself is "
                             "refused here: every user of the machine can read a command line")
    parser.add_argument("--token-file", metavar="PATH",
                        help="a file of mode 0600 holding the join token (the notebook prints its path)")
    parser.add_argument("--address", default=None, help="this node's address to connect from (default: the OS picks)")
    parser.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)  # a --detach --nodes run's agent
    parser.add_argument("--start-timeout", metavar="SECONDS", type=_seconds,
                        default=os.environ.get("NBTRAIN_START_TIMEOUT", START_TIMEOUT_S),
                        help="how long to keep trying to join a kernel that is busy or not reachable yet, at most "
                             f"until the token expires (default {START_TIMEOUT_S:.0f}) [env: NBTRAIN_START_TIMEOUT]")
    for f, spec in options_of(AgentOptions):  # declared once, with the cell's option of the same name
        names, kwargs = spec.argparse_spec(f.name, f.default)
        parser.add_argument(*names, **kwargs)
    args = parser.parse_args(argv)
    try:  # an option left out takes its NBTRAIN_* variable, as in a cell
        given = with_env_fallbacks(AgentOptions(**{f.name: getattr(args, f.name) for f, _ in options_of(AgentOptions)}))
    except OptionEnvError as exc:
        parser.error(str(exc))
    return argparse.Namespace(**{**vars(args), **vars(given)})


def _seconds(text) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a positive number of seconds, such as 180 (got {text!r}, from "
                                         "--start-timeout or NBTRAIN_START_TIMEOUT)")
    return value


def _gpu_count() -> int:
    try:
        from ..gpu import nvml

        return len(nvml.visible_gpus())
    except Exception:
        return 0


def join(args: argparse.Namespace, text: str, notices: Notices) -> tuple[Link, str]:
    """Join the kernel the token names; a busy or unreachable kernel is tried again until ``--start-timeout``
    or the token's expiry, whichever comes first, the pause doubling (with jitter, so a Slurm job's agents do
    not come back all at once). The first refusal is said on the terminal. A SIGTERM while joining ends the
    tries (after the one under way, at most its connect timeout); one during the try that joins is a notice."""
    token = JoinToken.decode(text)
    host, _, port = args.join.rpartition(":")
    if (host.strip("[]"), port) != (token.host, str(token.port)):
        raise LinkError(f"--join {args.join} is not the address in the token ({token.host}:{token.port})")
    hello = N.NodeHello(socket.gethostname(), os.getpid(), _gpu_count(), os.cpu_count() or 1, args.address or "",
                        os.environ.get("SLURM_JOB_ID", ""))
    by_timeout = time.monotonic() + args.start_timeout
    by_expiry = time.monotonic() + token.expires - time.time()
    pause, told = RETRY_FIRST_S, False
    while True:
        try:
            return connect(token, hello, args.address)
        except LinkRetry as exc:
            left = min(by_timeout, by_expiry) - time.monotonic()
            if left <= 0:
                why = "the token expired" if by_expiry < by_timeout else f"--start-timeout {args.start_timeout:g} s passed"
                raise LinkError(f"{exc}; gave up trying again: {why}") from None
            if not told:
                say(f"{exc}; trying again for up to {left:.0f} s")
                told = True
            _pause_unless_stopped(min(left, pause * random.uniform(0.5, 1.0)), notices)
            pause = min(RETRY_MAX_S, pause * 2)


def _pause_unless_stopped(seconds: float, notices: Notices) -> None:
    """Sleep between two tries to join, in short slices: a SIGTERM meanwhile ends the tries."""
    until = time.monotonic() + seconds
    while not notices.sigterms and time.monotonic() < until:
        time.sleep(min(NOTICE_CHECK_S, max(0.0, until - time.monotonic())))
    if notices.sigterms:
        raise LinkError("a SIGTERM came while joining; not joined")


def serve(link: Link, name: str, address: str | None, notices: Notices | None = None, relay: bool = False) -> str:
    """Until the pool ends; returns why it ended. A detached run (:mod:`.detached`) goes on alone if the kernel goes;
    ``relay``: its ranks run on nodes this agent brings up (:mod:`.relay`)."""
    notices = notices or Notices()
    sweep_dead_agents()
    directory = tempfile.mkdtemp(prefix=f"nbtrain-node-{os.getpid()}-")
    os.chmod(directory, 0o700)
    outbox = Outbox(link)
    ranks: LocalRanks | RelayRanks
    if relay:
        from .relay import RelayRanks

        ranks = RelayRanks(outbox.send)
    else:
        ranks = LocalRanks(directory, outbox.send)
    beat = threading.Event()
    threading.Thread(target=_heartbeats, args=(link, beat, ranks.more_telemetry), name="nbtrain-node-heartbeat",
                     daemon=True).start()
    try:
        why = _serve_kernel(link, ranks, outbox, address, notices)
        if outbox.recorder is not None:  # a detached run: to its end, restarted as --max-restarts says
            why = see_through(ranks, outbox.recorder, lambda start: _handle(start, ranks, link, address, outbox.send),
                              why)
        return why
    finally:
        beat.set()
        if ranks.pids():
            ranks.stop(0.5)
        if outbox.recorder is not None:
            outbox.recorder.close()  # after the ranks' last word: its state is final
        ranks.close()
        link.close()
        link.join(2.0)
        shutil.rmtree(directory, ignore_errors=True)


def _serve_kernel(link: Link, ranks: LocalRanks | RelayRanks, outbox: Outbox, address: str | None, notices: Notices) -> str:
    """What the kernel asks, until it says Bye, its link breaks or it falls silent; returns which."""
    acted = 0
    while True:
        try:
            message = link.incoming.get(timeout=NOTICE_CHECK_S)
        except queue.Empty:
            message = ...
        why = _preemption(notices, ranks, link)
        if why:
            return why
        if outbox.recorder is not None:
            acted = outbox.recorder.act_on_interrupts(ranks, acted)
        if message is None:
            return "the connection to the kernel broke"
        if time.monotonic() - link.last_heard > KERNEL_SILENT_S:
            return f"the kernel was silent for {KERNEL_SILENT_S:.0f} s"
        if isinstance(message, N.Bye):
            return message.reason
        if isinstance(message, N.StartRanks) and message.detached_run:
            message = outbox.record(message, ranks.more_telemetry)
        elif isinstance(message, N.Interrupt) and outbox.recorder is not None:
            outbox.recorder.stop_asked()
        elif isinstance(message, N.Deliver) and outbox.recorder is not None:
            outbox.recorder.delivered(message)
        _handle(message, ranks, link, address, outbox.send)


def _preemption(notices: Notices, ranks: LocalRanks | RelayRanks, link: Link) -> str:
    """A notice goes to the kernel, which has the ranks save and then says Bye; "" while the agent stays."""
    if notices.sigterms > 1:
        return "a second SIGTERM"
    notice = notices.take()
    if notice is None:
        return ""
    if not ranks.running():
        return f"a preemption notice ({notice.source}) with no ranks running"
    link.send(notice)
    say(f"preemption notice ({notice.source}): the ranks save a checkpoint at their next step, then this node leaves")
    return ""


def sweep_dead_agents() -> None:
    """What agents killed on this machine left (SIGKILL runs no cleanup): their folders and /dev/shm files."""
    sweep_quietly(sweep_temp, sweep_orphans)  # whatever another user planted under those names, this agent serves


def _handle(message, ranks: LocalRanks | RelayRanks, link: Link, address: str | None, send) -> None:
    if isinstance(message, N.StartRanks):
        if isinstance(ranks, LocalRanks):
            run_ranks(message, ranks, address, send)
        else:
            ranks.begin(message)
    elif isinstance(message, N.Deliver):
        ranks.deliver(message)
    elif isinstance(message, N.ToRank):
        ranks.send_one(message)
    elif isinstance(message, N.Interrupt):
        ranks.interrupt()
    elif isinstance(message, N.DumpStacks):
        threading.Thread(target=ranks.dump_stacks, args=(message,), name="nbtrain-node-stacks", daemon=True).start()
    elif isinstance(message, N.StopRanks):
        if ranks.running():
            threading.Thread(target=ranks.stop, name="nbtrain-node-stop", daemon=True).start()
        else:
            link.send(N.RanksStopped())


def telemetry(reader) -> dict:
    """This machine now, sent with each heartbeat: CPU and RAM use, and each GPU as plain JSON values
    (:meth:`~nbtrain.gpu.devices.GpuStatus.to_json`: load, memory, temperature, power, its health — clocks and
    what holds them down, PCIe, NVLink, ECC, the Xid errors since the agent started — and its MIG instances)."""
    sample: dict = {"cpu_percent": psutil.cpu_percent(None), "ram_percent": psutil.virtual_memory().percent}
    try:
        sample["gpus"] = [gpu.to_json() for gpu in reader.read()]
    except Exception:  # a driver hiccup must not stop the heartbeats
        sample["gpus"] = []
    return sample


def _heartbeats(link: Link, stop: threading.Event, more) -> None:
    """Every :data:`HEARTBEAT_S`: this machine's telemetry, and what ``more()`` adds (a relay's nodes)."""
    from ..gpu.devices import DeviceReader

    reader = DeviceReader(xid_events=True)  # Xid errors counted from the agent's start, on a thread of their own
    psutil.cpu_percent(None)  # the first call only starts the measurement
    try:
        while not stop.wait(HEARTBEAT_S):
            link.send(N.Heartbeat(time.time(), {**telemetry(reader), **more()}))
    finally:
        reader.close()


def _everywhere(link: Link):
    """``say`` for what the user must see wherever they look: the agent's terminal, its log file and the cell."""
    def tell(text: str) -> None:
        say(text)
        print(f"nbtrain.node: {text}", file=sys.stderr, flush=True)  # fd 2 is the log file (console.route_output)
        link.send(N.NodeNote(text))
    return tell


def _preload() -> None:
    """Import torch elastic before joining: loading libtorch holds the GIL for seconds, which would silence the
    heartbeats of a node already joined (and it makes the first pool start sooner)."""
    for module in ("torch.distributed.elastic.agent.server.local_elastic_agent",
                   "torch.distributed.elastic.rendezvous"):
        importlib.import_module(module)


def main(argv=None) -> None:
    try:
        if argv is None:  # run as a program (python -m nbtrain.node), not called from another one
            reexec_without_token()
    except ValueError as exc:
        sys.exit(f"nbtrain.node: {exc}")
    args = parse_args(argv)
    try:
        text = read_token(args.token, args.token_file, sys.stdin)
        if args.preemption_url:
            check_url(args.preemption_url)
    except (ValueError, PreemptionURLError) as exc:
        sys.exit(f"nbtrain.node: {exc}")
    _preload()
    notices = Notices()
    # SIGTERM: a preemption notice from before the kernel may count this node in (one that comes before it did
    # ends the tries to join: join())
    notices.install()
    try:
        link, name = join(args, text, notices)
    except (LinkError, OSError) as exc:
        sys.exit(f"nbtrain.node: cannot join: {exc}")
    log = route_output()  # from here torch's tracebacks go to the log, a line each to the terminal
    say(f"joined as node {name} (log: {log})")
    if args.preemption_url:
        notices.poll(args.preemption_url, _everywhere(link))
    why = serve(link, name, args.address, notices, relay=args.relay)
    say(f"leaving: {why}")
    os._exit(0)  # torch elastic's threads (rendezvous keep-alive, log tails) must not keep a finished node alive
