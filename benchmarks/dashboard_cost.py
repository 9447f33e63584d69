"""What the live dashboard costs the kernel: CPU, widget messages, and memory for long runs.

Run it with the project's environment::

    PYTHONPATH=. python benchmarks/dashboard_cost.py [--seconds 30] [--nprocs 2] [--baseline REF --rounds 2]

``--baseline REF`` (a git commit, e.g. the one before a dashboard change) measures that version's dashboard
too, in the same run, interleaved with this checkout's (baseline, current, baseline, current, … for
``--rounds``): each measurement runs in its own process with ``PYTHONPATH`` on a ``git archive`` of the
commit or on this checkout, so the machine's load is shared alike.

1. **A training run with the dashboard.** A small MLP is trained by ``--nprocs`` gloo ranks for about
   ``--seconds``, logging ``loss`` every step and ``val_loss`` every 50 steps (and ``total_steps``),
   through :func:`nbtrain.kernel.lifecycle.entry.run_source` with the widget dashboard attached (no front end:
   ``display`` does nothing, the widgets' comm messages are counted instead of sent). Measured:

   * the CPU time of the dashboard's two threads (sampler, ticker; each thread's own CPU clock) plus the
     time its callbacks took on the main thread, divided by the run's wall time: the share of one core the
     dashboard used (goal: at most 2 %);
   * widget messages per second, all of them (state and custom; goal: at most 4), and those of the chart
     alone (its curves and load panels, or the old plot's images), with their binary payload in KiB/s;
   * updates of the curves per second while logged values arrive (goal: at least 2), and the longest gap
     between two (the chart's module, sent once, and messages with telemetry samples alone do not count);
   * the final picture's CPU time (once, at the end).

   With ``--stand-in-gpus N`` the kernel's NVML is the tests' stand-in (``tests/helpers/fake_nvml.py``) with N
   boards of 18 NVLink links each, in the kernel only (the ranks train on the CPU): the sampler then reads
   every GPU's fields, health, NVLink counters and Xid events as on an 8-GPU machine; its own thread's share
   of a core is reported apart (goal: at most 1 %).

2. **10^6 logged steps.** The kernel side of a million steps (2 ranks, ``loss`` every step) is fed
   into the dashboard's store in batches as the ranks send them, the chart's feed polled after every batch
   as the widget would; reported: the retained size of the store's series (deep size), the process's RSS
   growth, the cost per record on the main thread and that of the chart's deltas.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

import psutil

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN = """
import time, torch, torch.distributed as dist, nbtrain
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
x, y = torch.randn(256, 64), torch.randn(256, 1)

def train_step():
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    return loss

# Every rank must run the same number of steps (a rank leaving early would leave the others waiting in
# the all-reduce), so the count is fixed from a short warm-up agreed on by all ranks.
started = time.time()
for _ in range(20):
    train_step()
per_step = torch.tensor([(time.time() - started) / 20])
dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
steps = max(int(SECONDS / per_step.item()), 100)
nbtrain.log(total_steps=steps)
for step in range(steps):
    loss = train_step()
    nbtrain.log(loss=loss, step=step)
    if step % 50 == 49:
        nbtrain.log(val_loss=loss.detach() * 1.1, step=step)
"""


class Timed:
    """Wraps an observer: accumulates the CPU time its callbacks take on the calling (main) thread."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        def timed(*args):
            started = time.thread_time()
            try:
                return method(*args)
            finally:
                self.seconds += time.thread_time() - started
        return timed


def _widget_tree(widget) -> set:
    found = {widget}
    for child in getattr(widget, "children", ()):
        found |= _widget_tree(child)
    return found


def install_stand_in_gpus(count: int) -> None:
    """The tests' stand-in NVML with ``count`` NVLink boards, for this process (the kernel) only."""
    sys.path.insert(0, os.path.join(CHECKOUT, "tests"))
    from helpers.fake_nvml import FakeGpu, make_module

    sys.modules["pynvml"] = make_module([FakeGpu(util=90, nvlinks=(1,) * 18, nvlink_kib_s=(2_000_000, 2_000_000))
                                         for _ in range(count)])


def run_with_dashboard(seconds: float, nprocs: int, stand_in_gpus: int = 0) -> dict:
    """One run with the widget dashboard of whichever nbtrain is first on the path; returns its costs."""
    import IPython.display
    import ipywidgets

    if stand_in_gpus:
        install_stand_in_gpus(stand_in_gpus)
    from nbtrain.kernel.dashboard.observer import DashboardObserver
    from nbtrain.kernel.dashboard.widget import RunDashboard
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest

    messages = []  # (time, widget, binary payload bytes, set-up?): every comm message, state or custom
    original = ipywidgets.Widget._send

    def _send(self, msg, buffers=None):
        # The chart's module and id go once, when it is made: set-up, not an update of the curves.
        state = msg.get("state") or {}
        setup = any(key.startswith("_") for key in state)
        load_only = set(state) == {"load"}  # the load panels' samples alone: no logged value in it
        messages.append((time.monotonic(), self, sum(len(b) for b in buffers or ()), setup, load_only))
        return original(self, msg, buffers)

    ipywidgets.Widget._send = _send  # this process only measures
    IPython.display.display = lambda *a, **k: None

    observer = DashboardObserver(RunDashboard)
    timed = Timed(observer)
    finish = {}
    original_finish = observer.run_finished

    def run_finished(status, summary):  # split the end-of-run picture from the live cost
        observer.stop()
        assert observer.sampler is not None and observer.ticker is not None  # started with the run
        finish["threads"] = observer.sampler.cpu_seconds + observer.ticker.cpu_seconds
        finish["sampler"] = observer.sampler.cpu_seconds
        finish["ticker"] = observer.ticker.cpu_seconds
        finish["live_end"] = time.monotonic()
        started = time.thread_time()
        original_finish(status, summary)
        finish["final"] = time.thread_time() - started

    observer.run_finished = run_finished  # type: ignore[method-assign]  # this run's observer only
    cell = TRAIN.replace("SECONDS", str(seconds))
    started = time.monotonic()
    result = run_source(cell, LaunchRequest(nprocs=nprocs, cpu=True), {}, observers=[timed])
    live_start = observer.model.started
    live_seconds = finish["live_end"] - live_start
    main_thread = timed.seconds - finish["final"]
    front = observer.front
    assert isinstance(front, RunDashboard)
    tables = _widget_tree(front.run_panel.widget) | _widget_tree(front.devices.widget)
    in_live = [m for m in messages if live_start <= m[0] <= finish["live_end"]]
    curves = [m for m in in_live if m[1] not in tables and not m[3]]
    # Updates of the curves (messages less than 0.1 s apart are one update: the old plot sent two images),
    # per second while values arrive: from the first update to the last (rank start-up left out). Messages
    # with telemetry samples only (the load panels, once a second) count as messages, not as updates.
    with_values = [m for m in curves if not m[4]]
    updates = [m[0] for i, m in enumerate(with_values) if i == 0 or m[0] - with_values[i - 1][0] > 0.1]
    arriving = updates[-1] - updates[0] if len(updates) > 1 else 0.0
    return {
        "wall_s": time.monotonic() - started, "live_s": live_seconds, "steps": len(result.history["loss"]),
        "threads_cpu_s": finish["threads"], "main_thread_cpu_s": main_thread, "ticker_cpu_s": finish["ticker"],
        "cpu_share": (finish["threads"] + main_thread) / live_seconds,
        "sampler_share": finish["sampler"] / live_seconds, "gpus": len(getattr(observer.model.telemetry.latest, "gpus", ())),
        "messages": len(in_live), "messages_per_s": len(in_live) / live_seconds,
        "curve_messages_per_s": len(curves) / live_seconds,
        "curve_kib_per_s": sum(m[2] for m in curves) / 1024 / live_seconds,
        "curve_updates": len(updates),
        "curve_updates_per_s_arriving": (len(updates) - 1) / arriving if arriving else 0.0,
        "curve_longest_gap_s": max((b - a for a, b in zip(updates, updates[1:], strict=False)), default=0.0),
        "final_cpu_s": finish["final"],
    }


def deep_size(store) -> int:
    total = 0
    for by_rank in store._series.values():
        for series in by_rank.values():
            for values in (series.steps, series.times, series.means, series.mins, series.maxs, series.counts):
                total += sys.getsizeof(values) + sum(sys.getsizeof(v) for v in values)
    return total


def million_steps(steps: int = 10**6, ranks: int = 2, batch: int = 250) -> dict:
    from nbtrain.kernel.dashboard.chart_feed import ChartFeed
    from nbtrain.kernel.dashboard.metric_store import MetricStore

    store = MetricStore()
    feed = ChartFeed(store)
    rss_before = psutil.Process().memory_info().rss
    cpu = feed_cpu = 0.0
    sizes = {}
    for start in range(0, steps, batch):
        for rank in range(ranks):
            records = [(s, 1e9 + s / 100, {"loss": 1.0 / (s + 1)}) for s in range(start, start + batch)]
            began = time.thread_time()
            store.add(rank, records)
            cpu += time.thread_time() - began
        began = time.thread_time()
        feed.poll()
        feed_cpu += time.thread_time() - began
        if start + batch in (10**4, 10**5, 10**6):
            sizes[start + batch] = deep_size(store)
    return {"sizes": sizes, "rss_growth": psutil.Process().memory_info().rss - rss_before,
            "us_per_record": 1e6 * cpu / (steps * ranks), "points_kept": len(store.series("loss") or ()),
            "feed_us_per_record": 1e6 * feed_cpu / (steps * ranks), "bases": feed.bases, "tails": feed.tails}


def measure_in_process(root: str, seconds: float, nprocs: int, stand_in_gpus: int = 0) -> dict:
    """:func:`run_with_dashboard` in a fresh interpreter whose ``nbtrain`` (and its ranks') comes from ``root``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--seconds", str(seconds),
                           "--nprocs", str(nprocs), "--stand-in-gpus", str(stand_in_gpus)], env=env, cwd=root,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the measurement with nbtrain from {root} failed:\n{done.stderr[-3000:]}")
    run = json.loads(done.stdout.strip().splitlines()[-1])
    if not os.path.realpath(run["nbtrain"]).startswith(os.path.realpath(root) + os.sep):
        raise RuntimeError(f"the measurement meant for {root} imported nbtrain from {run['nbtrain']}")
    return run


def describe(label: str, run: dict) -> str:
    return (f"{label:<9} CPU {run['threads_cpu_s']:.2f} s threads (of which drawing/sending {run['ticker_cpu_s']:.2f} s) "
            f"+ {run['main_thread_cpu_s']:.3f} s main thread over {run['live_s']:.1f} s = {100 * run['cpu_share']:.2f} % "
            f"of one core; messages {run['messages_per_s']:.2f}/s (curves {run['curve_messages_per_s']:.2f}/s, "
            f"{run['curve_kib_per_s']:.1f} KiB/s; {run['curve_updates']} updates, {run['curve_updates_per_s_arriving']:.2f}/s while values arrive, longest gap {run['curve_longest_gap_s']:.2f} s); "
            f"final picture {run['final_cpu_s']:.2f} s; {run['steps']} steps; the sampler alone "
            f"{100 * run.get('sampler_share', 0):.2f} % of one core with {run.get('gpus', 0)} GPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--baseline", metavar="REF", help="also measure this git commit's dashboard, interleaved")
    parser.add_argument("--rounds", type=int, default=1, help="measurements of each version")
    parser.add_argument("--stand-in-gpus", type=int, default=0, metavar="N",
                        help="the kernel reads N stand-in GPUs (tests/helpers/fake_nvml.py) instead of the driver")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one measurement, for measure_in_process: nbtrain from PYTHONPATH, not from this checkout
        import nbtrain

        run = run_with_dashboard(args.seconds, args.nprocs, args.stand_in_gpus)
        print(json.dumps(dict(run, nbtrain=nbtrain.__file__)))
        return
    sys.path.insert(0, CHECKOUT)
    print(f"# nbtrain dashboard cost — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    checkout = CHECKOUT
    with tempfile.TemporaryDirectory(prefix="nbtrain-baseline-") as baseline_root:
        versions = [("current", checkout)]
        if args.baseline:
            archive = subprocess.run(["git", "-C", checkout, "archive", args.baseline], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", baseline_root], input=archive.stdout, check=True)
            versions.insert(0, (f"baseline {args.baseline[:10]}", baseline_root))
        print(f"\n## training run: {args.nprocs} gloo ranks, about {args.seconds:g} s of steps; goal <= 2 % of one "
              f"core, <= 4 messages/s")
        results: dict[str, list[dict]] = {}
        for round_ in range(args.rounds):
            for label, root in versions:
                run = measure_in_process(root, args.seconds, args.nprocs, args.stand_in_gpus)
                results.setdefault(label, []).append(run)
                print(describe(f"{label.split()[0]} {round_ + 1}", run), flush=True)
        for label, runs in results.items():
            share = statistics.median(r["cpu_share"] for r in runs)
            rate = statistics.median(r["messages_per_s"] for r in runs)
            ticker = statistics.median(r["ticker_cpu_s"] / r["live_s"] for r in runs)
            sampler = statistics.median(r.get("sampler_share", 0) for r in runs)
            updates = statistics.median(r["curve_updates_per_s_arriving"] for r in runs)
            print(f"median {label}: {100 * share:.2f} % of one core (drawing/sending {100 * ticker:.2f} %, sampling "
                  f"{100 * sampler:.2f} %), "
                  f"{rate:.2f} messages/s, curve updates {updates:.2f}/s while values arrive")
    big = million_steps()
    print("\n## 10^6 logged steps x 2 ranks into the dashboard's store (current)")
    for steps, size in big["sizes"].items():
        print(f"retained series after {steps:>9,} steps: {size / 1024:.0f} KiB")
    print(f"points kept per series: {big['points_kept']}; RSS growth over the whole feed: "
          f"{big['rss_growth'] / 2**20:.1f} MiB; {big['us_per_record']:.2f} us per record on the main thread; "
          f"chart deltas {big['feed_us_per_record']:.3f} us per record ({big['tails']} updates, {big['bases']} bases)")


if __name__ == "__main__":
    main()
