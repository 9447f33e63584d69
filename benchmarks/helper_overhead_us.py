"""Absolute per-step cost of nbtrain's helpers, in microseconds, on a model too small to hide it.

One process, a 1-rank gloo process group (so the model really is DDP), a tiny ``Linear(8, 8)``: the step
is almost all framework overhead, so the difference between loops is what nbtrain adds per step. Loops:

* ``plain DDP``: ``DDP(model)``, ``loss.backward()``, ``opt.step()``, ``opt.zero_grad()``;
* ``prepare``: ``nbtrain.prepare(model, opt)``, ``nbtrain.backward(loss)``, same step calls;
* ``prepare + log``: and ``nbtrain.log(loss=loss)`` (buffered; the sending thread runs as in a cell);
* ``prepare + grad-accum 4``: ``--grad-accum 4`` (3 of 4 steps skip the optimizer and the all-reduce).

Each loop runs REPEATS × STEPS steps; the minimum over repeats is kept (the least disturbed by other
load), in µs per step. On a busy machine whole loops still vary by tens of µs, so each helper is also
timed alone against the call it replaces (forward, step, zero_grad, log). Divide the added µs by your
real step time for the relative cost.

    python benchmarks/helper_overhead_us.py [--steps 2000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import nbtrain
    from nbtrain.rank.train import metrics, state
    from nbtrain.wire.settings import TrainSettings

    torch.set_num_threads(1)
    store_file = tempfile.mktemp(prefix="nbtrain-bench-")
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=0, world_size=1)
    x, y = torch.randn(16, 8), torch.randint(0, 8, (16,))

    def plain(steps):
        model = DDP(torch.nn.Linear(8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        started = time.perf_counter()
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return time.perf_counter() - started

    def prepared(steps, log=False, grad_accum=1):
        with state.scope(TrainSettings(amp="off", grad_accum=grad_accum), torch.device("cpu"), 0, 1), \
                metrics.scope(0, lambda message: None, {}):
            net = torch.nn.Linear(8, 8)
            model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
            started = time.perf_counter()
            for _ in range(steps):
                loss = F.cross_entropy(model(x), y)
                nbtrain.backward(loss)
                opt.step()
                opt.zero_grad()
                if log:
                    nbtrain.log(loss=loss)
            return time.perf_counter() - started

    loops = {
        "plain DDP": plain,
        "prepare": prepared,
        "prepare + log": lambda n: prepared(n, log=True),
        "prepare + grad-accum 4": lambda n: prepared(n, grad_accum=4),
    }
    best = {name: float("inf") for name in loops}
    for _ in range(args.repeats):
        for name, loop in loops.items():  # interleaved, so drifts in machine load hit every loop alike
            best[name] = min(best[name], loop(args.steps) / args.steps * 1e6)
    components = _components(args.repeats, x, y)
    dist.destroy_process_group()
    os.unlink(store_file) if os.path.exists(store_file) else None
    base = best["plain DDP"]
    print(f"{'loop':<24} {'µs/step':>9} {'added µs':>9}   (1 rank gloo, Linear(8, 8), min of {args.repeats} × {args.steps} "
          f"steps, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {os.cpu_count()} CPUs)")
    for name, value in best.items():
        print(f"{name:<24} {value:9.1f} {value - base:+9.1f}")
    print()
    print(f"{'one call':<34} {'plain µs':>9} {'nbtrain µs':>11} {'added':>7}")
    for name, (plain_us, ours_us) in components.items():
        print(f"{name:<34} {plain_us:9.2f} {ours_us:11.2f} {ours_us - plain_us:+7.2f}")


def _components(repeats: int, x, y) -> dict:
    """Each helper against what it replaces, timed alone (min over repeats of 5000 calls)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import nbtrain
    from nbtrain.rank.train import metrics, state
    from nbtrain.wire.settings import TrainSettings

    with state.scope(TrainSettings(amp="off"), torch.device("cpu"), 0, 1), metrics.scope(0, lambda message: None, {}):
        plain_model = DDP(torch.nn.Linear(8, 8))
        net = torch.nn.Linear(8, 8)
        plain_opt = torch.optim.SGD(net.parameters(), lr=0.0)
        model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.0))
        model(x).sum().backward()  # gradients for the steps to use
        loss = torch.tensor(1.0)
        pairs = {
            "forward: DDP vs PreparedDDP": (lambda: plain_model(x), lambda: model(x)),
            "optimizer.step()": (plain_opt.step, opt.step),
            "optimizer.zero_grad(set_to_none=False)": (lambda: plain_opt.zero_grad(False), lambda: opt.zero_grad(False)),
            "nothing vs nbtrain.log(loss=tensor)": (lambda: None, lambda: nbtrain.log(loss=loss)),
        }
        out = {}
        for name, (plain_call, our_call) in pairs.items():
            out[name] = (_min_us(plain_call, repeats), _min_us(our_call, repeats))
        return out


def _min_us(call, repeats: int, calls: int = 5000) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


if __name__ == "__main__":
    main()
