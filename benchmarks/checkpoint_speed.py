"""save_checkpoint() under --shard against DCP called by hand, on the same state in the same ranks.

One ``%%distributed --shard --checkpoint DIR`` cell prepares a model of ``--layers`` linear layers of width
``--width`` with AdamW (one step, so the optimizer holds its state), then, alternately for ``--rounds``:

* ``nbtrain.save_checkpoint()`` — what training is blocked for (sync; with ``--checkpoint-async`` in a second
  cell, the call's time: the state is staged, the write goes on in the background);
* ``dcp.save`` / ``dcp.async_save`` of the same model and optimizer state dicts, written by hand, with the same
  planner settings nbtrain uses (plan caching on) and, async, the same checkpointer: a thread (DCP's default).
  Where torch has DCP's process checkpointer (``AsyncCheckpointerType.PROCESS``), the async cell times raw
  ``dcp.async_save`` with it too, after one save that starts its process, and stops that process at its end: the
  line it prints is what decides nbtrain's choice of checkpointer (the one that blocks training less).

A third cell resumes from the checkpoint (``prepare()`` reads it), a fourth prepares the same model with
``--no-resume``: the difference is nbtrain's resume. It is timed against a resume written by hand in a fifth
cell's new ranks: the model's state dict, new optimizer state (``torch.empty_like`` of shapes it is given free,
untouched: on the CPU the load faults its pages in) and ``dcp.load`` — the ranks' first, as a resume's is. The
third cell also times, after nbtrain's resume, ``dcp.load`` into new optimizer state (a second load in the ranks:
what the first paid for, DCP's first use in a process, it finds done) and into state dicts whose every page was
written before the clock started, which no resume into a new process has. nbtrain's figure is a difference of
two cells' ranks, so a loaded machine makes it noisy; a sixth cell times the same reading in one
cell: ``nbtrain.load_checkpoint()`` into the prepared model and a fresh optimizer (its state cleared each round),
against the same by hand (the model's state dict, new optimizer state, ``dcp.load``) and against ``dcp.load`` into
state dicts made, and written, beforehand. Both reading cells also time torch's own recipe
for resuming by hand (``get_state_dict``, ``dcp.load``, ``set_state_dict``, as DCP's tutorial writes it) into a
fresh optimizer: the work a user would write, which the bare ``dcp.load`` leaves out.
Each figure is the median over the rounds of the slowest rank's time (barriers around each call); which of the
two saves goes first alternates from round to round. Each line also gives the median and quartiles of the rounds'
own ratios (both sides of a round timed back to back): on a loaded machine, how far the ratio is from noise. The ranks are forked from a zygote started first, as
``%load_ext nbtrain`` starts it in a notebook.
Goal: nbtrain ≤ 1.05× raw for each. ``--logged STEPS`` first logs two series for STEPS steps in each rank, as a long
run has by the time it saves: the saves' lines then include what keeping that history costs (the first save writes
it all; later ones only what was logged since, so the medians are the saves of a long run).

    python benchmarks/checkpoint_speed.py [--ranks 2] [--rounds 5] [--layers 8] [--width 1024] [--logged 0] [--gpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

CELL = """
import os, time, torch, nbtrain
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

PROCESS = getattr(AsyncCheckpointerType, "PROCESS", None) if ASYNC else None
torch.manual_seed(0)
model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = nbtrain.prepare(model, opt)
model(torch.randn(4, WIDTH, device=device)).sum().backward()
opt.step()
gloo = dist.new_group(backend="gloo")
for step in range(LOGGED):  # what a long run has logged by now: two series a rank
    nbtrain.log(loss=float(step), lr=0.1, step=step)

def slowest(seconds):
    box = torch.tensor([seconds])
    dist.all_reduce(box, op=dist.ReduceOp.MAX, group=gloo)
    return float(box)

def timed(call):
    dist.barrier(group=gloo)
    began = time.perf_counter()
    waited = call()
    took = time.perf_counter() - began
    if waited is not None:
        waited()  # the background write, outside the time training was blocked for
    return slowest(took)

def raw_state():
    return {"model0": get_model_state_dict(model), "optim0": get_optimizer_state_dict(model, opt.optimizer)}

def raw_save(name, checkpointer=AsyncCheckpointerType.THREAD):
    target = os.path.join(RAW_DIR, name)
    planner = DefaultSavePlanner(enable_plan_caching=True)
    if ASYNC:
        future = dcp.async_save(raw_state(), checkpoint_id=target, process_group=gloo, planner=planner,
                                async_checkpointer_type=checkpointer)
        return future.result
    dcp.save(raw_state(), checkpoint_id=target, planner=planner)

def stop_checkpoint_process():  # DCP keeps it for the rank's life: ask it to end, and wait until it has
    import multiprocessing
    from torch.distributed.checkpoint import _async_process_executor as executor

    process, executor._CHECKPOINT_PROCESS = executor._CHECKPOINT_PROCESS, None
    if process is not None:
        process.__del__()  # DCP's own shutdown: TERMINATE over its pipe, join, SIGTERM if it is still there
    return [child.pid for child in multiprocessing.active_children()]  # joined: none left, not even a zombie

def ours():
    nbtrain.save_checkpoint()
    if ASYNC:
        from nbtrain.rank.train.state import current
        return current().wait_for_save

contenders = {"nbtrain": ours, "raw": lambda: raw_save(f"r{round_}")}
if PROCESS is not None:
    raw_save("warm", PROCESS)()  # the first save starts the checkpoint process (seconds): not a save's time
    contenders["raw_process"] = lambda: raw_save(f"p{round_}", PROCESS)
times = {who: [] for who in contenders}
for round_ in range(ROUNDS):  # which goes first rotates: the disk's state after a write favours none
    order = list(contenders)[round_ % len(contenders):] + list(contenders)[:round_ % len(contenders)]
    for who in order:
        times[who].append(timed(contenders[who]))
left = stop_checkpoint_process() if PROCESS is not None else []
"""

READ_PREAMBLE = """
import time, torch, nbtrain
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict, get_state_dict,
                                                     set_state_dict)

gloo = dist.new_group(backend="gloo")

def recipe():  # torch's DCP recipe for resuming by hand: the state dicts, one load, and set back
    model_state, optim_state = get_state_dict(model, opt.optimizer)
    state = {"model0": model_state, "optim0": optim_state}
    dcp.load(state, checkpoint_id=RAW_DIR + "/r0")
    set_state_dict(model, opt.optimizer, model_state_dict=state["model0"], optim_state_dict=state["optim0"])

def slowest(seconds):
    box = torch.tensor([seconds])
    dist.all_reduce(box, op=dist.ReduceOp.MAX, group=gloo)
    return float(box)
"""  # the resume cells': their imports, a gloo group, the slowest rank's time

RESUME = READ_PREAMBLE + """
model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
dist.barrier(group=gloo)
began = time.perf_counter()
model, opt = nbtrain.prepare(model, opt)  # resumes: reads the checkpoint the first cell wrote
resume = {"nbtrain": slowest(time.perf_counter() - began)}
state = {"model0": get_model_state_dict(model), "optim0": get_optimizer_state_dict(model, opt.optimizer)}
dist.barrier(group=gloo)
began = time.perf_counter()
dcp.load(state, checkpoint_id=RAW_DIR + "/r0")
resume["raw"] = slowest(time.perf_counter() - began)
# the same by hand into new optimizer state (allocated, never touched), as a resume must make it: its pages are
# faulted in by the load, as nbtrain's resume's are, where the state above had been written already
new = {"state": {name: {what: torch.empty_like(tensor) for what, tensor in tensors.items()}
                 for name, tensors in state["optim0"]["state"].items()},
       "param_groups": state["optim0"]["param_groups"]}
state = {"model0": state["model0"], "optim0": new}
dist.barrier(group=gloo)
began = time.perf_counter()
dcp.load(state, checkpoint_id=RAW_DIR + "/r0")
resume["raw_new"] = slowest(time.perf_counter() - began)
del new, state
opt.optimizer.state.clear()  # a fresh optimizer, as the resumed one was
dist.barrier(group=gloo)
began = time.perf_counter()
recipe()
resume["recipe"] = slowest(time.perf_counter() - began)
"""

HAND_RESUME = READ_PREAMBLE + """
model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = nbtrain.prepare(model, opt)  # --no-resume
shapes = get_optimizer_state_dict(model, opt.optimizer)  # the state's shapes, given to the hand-written resume free
opt.optimizer.state.clear()
dist.barrier(group=gloo)
began = time.perf_counter()
state = {"model0": get_model_state_dict(model),
         "optim0": {"state": {name: {what: torch.empty_like(tensor) for what, tensor in tensors.items()}
                              for name, tensors in shapes["state"].items()}, "param_groups": shapes["param_groups"]}}
dcp.load(state, checkpoint_id=RAW_DIR + "/r0")  # the ranks' first load, as a resume's is
hand = slowest(time.perf_counter() - began)
"""  # a resume written by hand, first in new ranks: the model's state dict, new optimizer state, one dcp.load

LOAD = READ_PREAMBLE + """
def timed(call):
    dist.barrier(group=gloo)
    began = time.perf_counter()
    call()
    return slowest(time.perf_counter() - began)

model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = nbtrain.prepare(model, opt)  # --no-resume: nothing read yet
shapes = get_optimizer_state_dict(model, opt.optimizer)  # made once, outside the clock


def by_hand():  # as a hand-written resume does it: the model's state dict, new optimizer state, one dcp.load
    new = {"state": {name: {what: torch.empty_like(tensor) for what, tensor in tensors.items()}
                     for name, tensors in shapes["state"].items()}, "param_groups": shapes["param_groups"]}
    dcp.load({"model0": get_model_state_dict(model), "optim0": new}, checkpoint_id=RAW_DIR + "/r0")


load = {"nbtrain": [], "raw": [], "written": [], "recipe": []}
for round_ in range(ROUNDS):
    opt.optimizer.state.clear()  # a fresh optimizer each round, as a resumed cell's is
    state = {"model0": get_model_state_dict(model), "optim0": get_optimizer_state_dict(model, opt.optimizer)}
    contenders = {"nbtrain": lambda: nbtrain.load_checkpoint(CHECKPOINT + "/checkpoint.pt"), "raw": by_hand,
                  "written": lambda: dcp.load(state, checkpoint_id=RAW_DIR + "/r0"), "recipe": recipe}
    order = list(contenders)[round_ % 4:] + list(contenders)[:round_ % 4]
    for who in order:
        if who != "written":
            opt.optimizer.state.clear()
        load[who].append(timed(contenders[who]))
"""


def run(args, cell: str, names: dict, **options) -> dict:
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.lifecycle.pools import PoolManager
    from nbtrain.kernel.request.config import LaunchRequest

    request = LaunchRequest(nprocs=args.ranks, cpu=not args.gpu, keep_alive=0, fresh=True, shard="full",
                            checkpoint=names["CHECKPOINT"], **options)
    namespace = dict(names)
    run_source(cell, request, namespace, manager=PoolManager(starter=args.starter))
    return namespace


def zygote():
    """The rank starter a notebook has after ``%load_ext nbtrain``: ranks forked from a zygote that has imported
    what they use (DCP among it), not new interpreters."""
    from nbtrain.kernel.ranks.starter import RankStarter

    starter = RankStarter()
    starter.start_zygote()
    assert starter.zygote is not None and starter.zygote.wait_ready(), "the zygote did not start"
    return starter


def line(what: str, ours: list[float], raw: list[float]) -> str:
    ours_s, raw_s = statistics.median(ours), statistics.median(raw)
    return (f"{what:<28} nbtrain {ours_s * 1000:8.1f} ms   raw {raw_s * 1000:8.1f} ms   ratio {ours_s / raw_s:5.2f}×"
            f"   {paired(ours, raw)}")


def paired(ours: list[float], raw: list[float]) -> str:
    """The rounds' own ratios: each round times both back to back, so a load that comes and goes between rounds
    moves both sides of its ratio; their median and quartiles say how far the ratio above is from noise."""
    ratios = sorted(o / r for o, r in zip(ours, raw, strict=True) if r > 0)
    if len(ratios) < 4:
        return ""
    low, middle, high = statistics.quantiles(ratios, n=4)
    return f"(per round: median {middle:.2f}×, quartiles {low:.2f}–{high:.2f}×)"


def checkpointers(process: list[float], thread: list[float], left: list[int]) -> str:
    """Raw dcp.async_save's blocking time with DCP's process checkpointer against its thread one (nbtrain's)."""
    process_s, thread_s = statistics.median(process), statistics.median(thread)
    return (f"{'  raw, process checkpointer':<28} process {process_s * 1000:8.1f} ms   thread {thread_s * 1000:6.1f} ms   "
            f"ratio {process_s / thread_s:5.2f}×   processes left {len(left)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--logged", type=int, default=0, metavar="STEPS",
                        help="log two series for STEPS steps in each rank before the saves (a long run's history)")
    args = parser.parse_args()
    args.starter = zygote()
    try:
        return measure(args)
    finally:
        args.starter.close()


def measure(args) -> int:
    params = args.layers * (args.width * args.width + args.width)
    print(f"{args.ranks} ranks, {params / 1e6:.1f} M parameters (AdamW: {params * 12 / 2**20:.0f} MiB of state), "
          f"{args.rounds} rounds, {'GPU' if args.gpu else 'CPU (gloo)'}, {args.logged} steps of 2 series logged first")
    with tempfile.TemporaryDirectory(prefix="nbtrain-ckpt-bench-") as folder:
        names = {"WIDTH": args.width, "LAYERS": args.layers, "ROUNDS": args.rounds, "LOGGED": args.logged}
        for mode in ("sync", "async"):
            where = os.path.join(folder, mode)
            ns = run(args, CELL, {**names, "ASYNC": mode == "async", "RAW_DIR": os.path.join(where, "raw"),
                                  "CHECKPOINT": os.path.join(where, "nbtrain")}, checkpoint_async=mode == "async")
            print(line(f"save_checkpoint(), {mode}", ns["times"]["nbtrain"], ns["times"]["raw"]))
            if "raw_process" in ns["times"]:
                print(checkpointers(ns["times"]["raw_process"], ns["times"]["raw"], ns["left"]))
        where = os.path.join(folder, "sync")
        resumed, fresh = ([run(args, RESUME, {**names, "RAW_DIR": os.path.join(where, "raw"),
                                             "CHECKPOINT": os.path.join(where, "nbtrain")}, resume=resume)["resume"]
                           for _ in range(args.rounds)] for resume in (True, False))
        extra = [r["nbtrain"] - f["nbtrain"] for r, f in zip(resumed, fresh, strict=True)]
        hand = [run(args, HAND_RESUME, {**names, "RAW_DIR": os.path.join(where, "raw"),
                                        "CHECKPOINT": os.path.join(where, "nbtrain")}, resume=False)["hand"]
                for _ in range(args.rounds)]
        print(line("resume (prepare()'s extra)", extra, hand))
        print(line("  against a second dcp.load", extra, [r["raw_new"] for r in resumed]))
        print(line("  against state written before", extra, [r["raw"] for r in resumed]))
        print(line("  against torch's recipe", extra, [r["recipe"] for r in resumed]))
        loaded = run(args, LOAD, {**names, "RAW_DIR": os.path.join(where, "raw"),
                                  "CHECKPOINT": os.path.join(where, "nbtrain")}, resume=False)["load"]
        print(line("load_checkpoint(), one cell", loaded["nbtrain"], loaded["raw"]))
        print(line("  against state written before", loaded["nbtrain"], loaded["written"]))
        print(line("  against torch's recipe", loaded["nbtrain"], loaded["recipe"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
