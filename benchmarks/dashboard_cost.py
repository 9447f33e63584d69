"""What the live dashboard costs the kernel: CPU, widget messages, and memory for long runs.

Run it with the project's environment::

    PYTHONPATH=. python benchmarks/dashboard_cost.py [--seconds 30] [--nprocs 2]

1. **A training run with the dashboard.** A small MLP is trained by ``--nprocs`` gloo ranks for about
   ``--seconds``, logging ``loss`` every step and ``val_loss`` every 50 steps (and ``total_steps``),
   through :func:`nbtrain.launch.api.run_source` with the widget dashboard attached (no front end:
   ``display`` does nothing, the widgets' comm messages are counted instead of sent). Measured:

   * the CPU time of the dashboard's two threads (sampler, drawing; each thread's own CPU clock) plus the time its callbacks took on the main thread, divided by the run's wall time:
     the share of one core the dashboard used (goal: at most 5 %);
   * widget state messages per second (goal: at most 4);
   * the final picture's CPU time (once, at the end).

2. **10^6 logged steps.** The kernel side of a million steps (2 ranks, ``loss`` every step) is fed
   into the dashboard's store in batches as the ranks send them; reported: the retained size of the
   store's series (deep size), the process's RSS growth, and the cost per record on the main thread.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def run_with_dashboard(seconds: float, nprocs: int) -> dict:
    import IPython.display
    import ipywidgets

    from nbtrain.dashboard.observer import DashboardObserver
    from nbtrain.dashboard.widget import RunDashboard
    from nbtrain.launch.api import run_source
    from nbtrain.launch.config import LaunchRequest

    messages = []
    original = ipywidgets.Widget.send_state

    def send_state(self, key=None):  # note the time of each message the widgets send
        messages.append(time.monotonic())
        return original(self, key)

    ipywidgets.Widget.send_state = send_state
    IPython.display.display = lambda *a, **k: None

    observer = DashboardObserver(RunDashboard)
    timed = Timed(observer)
    finish = {}
    original_finish = observer.run_finished

    def run_finished(status, summary):  # split the end-of-run picture from the live cost
        observer.stop()
        assert observer.sampler is not None and observer.ticker is not None  # started with the run
        finish["threads"] = observer.sampler.cpu_seconds + observer.ticker.cpu_seconds
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
    steps = len(result.history["loss"])
    in_live = [m for m in messages if live_start <= m <= finish["live_end"]]
    assert isinstance(observer.front, RunDashboard)
    plot = observer.front.plot
    return {
        "wall_s": time.monotonic() - started, "live_s": live_seconds, "steps": steps,
        "threads_cpu_s": finish["threads"], "main_thread_cpu_s": main_thread,
        "cpu_share": (finish["threads"] + main_thread) / live_seconds,
        "messages_per_s": len(in_live) / live_seconds, "messages": len(in_live),
        "frames": plot.frames, "frame_cpu_s": plot.render_seconds / max(plot.frames, 1),
        "final_cpu_s": finish["final"],
    }


def deep_size(store) -> int:
    total = 0
    for by_rank in store._series.values():
        for series in by_rank.values():
            for values in (series.steps, series.means, series.mins, series.maxs, series.counts):
                total += sys.getsizeof(values) + sum(sys.getsizeof(v) for v in values)
    return total


def million_steps(steps: int = 10**6, ranks: int = 2, batch: int = 250) -> dict:
    from nbtrain.dashboard.metric_store import MetricStore

    store = MetricStore()
    rss_before = psutil.Process().memory_info().rss
    cpu = 0.0
    sizes = {}
    for start in range(0, steps, batch):
        for rank in range(ranks):
            records = [(s, 1e9 + s / 100, {"loss": 1.0 / (s + 1)}) for s in range(start, start + batch)]
            began = time.thread_time()
            store.add(rank, records)
            cpu += time.thread_time() - began
        if start + batch in (10**4, 10**5, 10**6):
            sizes[start + batch] = deep_size(store)
    return {"sizes": sizes, "rss_growth": psutil.Process().memory_info().rss - rss_before,
            "us_per_record": 1e6 * cpu / (steps * ranks), "points_kept": len(store.series("loss") or ())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--nprocs", type=int, default=2)
    args = parser.parse_args()
    print(f"# nbtrain dashboard cost — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    run = run_with_dashboard(args.seconds, args.nprocs)
    print(f"\n## training run: {args.nprocs} gloo ranks, {run['steps']} steps logged per rank, "
          f"dashboard live {run['live_s']:.1f} s")
    print(f"dashboard CPU: threads {run['threads_cpu_s']:.2f} s + main-thread callbacks {run['main_thread_cpu_s']:.3f} s "
          f"= {100 * run['cpu_share']:.1f} % of one core (goal <= 5 %)")
    print(f"widget messages: {run['messages']} in {run['live_s']:.1f} s = {run['messages_per_s']:.2f}/s (goal <= 4)")
    print(f"plot frames: {run['frames']}, {run['frame_cpu_s'] * 1000:.0f} ms CPU each (linear + log image)")
    print(f"final picture and summary: {run['final_cpu_s']:.2f} s CPU, once at the end")
    big = million_steps()
    print("\n## 10^6 logged steps x 2 ranks into the dashboard's store")
    for steps, size in big["sizes"].items():
        print(f"retained series after {steps:>9,} steps: {size / 1024:.0f} KiB")
    print(f"points kept per series: {big['points_kept']}; RSS growth over the whole feed: "
          f"{big['rss_growth'] / 2**20:.1f} MiB; {big['us_per_record']:.2f} us per record on the main thread")


if __name__ == "__main__":
    main()
