"""The bottleneck advisor: what limited a run's speed, said from what was measured in that run.

Data in, hints out; nothing here draws or prints. :class:`Evidence` gathers a run's measurements as they
come — telemetry snapshots (:mod:`nbtrain.gpu.telemetry`: GPU busy %, GPU memory, each rank's CPU), the
steps each rank logged with ``nbtrain.log`` and their times, and what ``prepare()`` set up on each rank
(:class:`~nbtrain.wire.protocol.Setup`: precision, device, whether its GPU computes bf16) — and
:func:`advise` turns them into :class:`Hint` s. The live dashboard asks for them as the run goes
(``RunModel.hints()``) and the summary after it; both only display them.

Each rule fires only on its own measurement, and its hint quotes it:

* **input pipeline** — a GPU busy less than :data:`IDLE_GPU_PCT` % on average while its rank's process tree
  (DataLoader workers included) keeps :data:`BUSY_CPU_PCT` % of a core: the GPU waits for the CPU — for
  batches, mostly, or for kernel launches when the data is already on the GPU (the hint names both);
* **batch size headroom** — a GPU's memory never above :data:`MEMORY_HEADROOM_FRACTION` of its total;
* **data wait** — the steps of a rank waited at least :data:`DATA_WAIT_PCT` % of their time for a prepared
  DataLoader's next batch (:mod:`nbtrain.rank.train.stepmeter`); or one rank waited :data:`DATA_WAIT_RATIO` × the
  others' median: its data comes slower;
* **comm wait** — the steps of a rank waited at least :data:`COMM_WAIT_PCT` % of their time for DDP's gradient
  all-reduce after backward computed its last gradient (*comm* in the step split: :mod:`nbtrain.rank.train.commwait`),
  or for FSDP2's reduce-scatters (``--shard``: :mod:`nbtrain.rank.train.shard_meter`);
  when one rank waited under a third of that, the others wait for it: it is the straggler, and the hint names it;
* **precision** — a rank trained in fp32 on a GPU that computes bf16 (``--amp off`` there);
* **straggler** — a rank whose logged steps per second are under :data:`STRAGGLER_RATIO` of the others'
  median, or (ranks kept in step by DDP) whose GPU is much busier than the others', which then wait for it;
* **GPU health** (:mod:`nbtrain.gpu.health`) — a busy GPU slowed (power cap, thermal, …) in at least
  :data:`SLOWED_FRACTION` of its samples; a PCIe link narrower than the board's; uncorrected ECC errors
  counted during the run; any Xid error the driver reported for it while the dashboard watched (from the run's
  first sample on: :mod:`nbtrain.gpu.xid`), with the count and the last Xid code; a GPU that ran kernels most of
  the time with, on average, fewer than :data:`FEW_SMS_PCT` % of its SMs active (GPM, :mod:`nbtrain.gpu.gpm`:
  small kernels that NVML's utilization calls busy). On a ``--nodes`` run the
  nodes' GPUs are judged alike, from their heartbeats (:meth:`Evidence.add_nodes`), and named ``node b GPU 1``.

Telemetry taken before the first logged step is left out when the run logs steps (start-up is not
training). Too few samples (:data:`MIN_SAMPLES`) or steps (:data:`MIN_STEPS`): no hint rather than a guess.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ...common.words import count
from ..observers.events import NodeState
from .setup_facts import splits_of, step_meter_fact

IDLE_GPU_PCT = 50.0
BUSY_CPU_PCT = 80.0  # of one core
MEMORY_HEADROOM_FRACTION = 0.4
STRAGGLER_RATIO = 0.75
BUSIER_BY_PCT = 20.0  # a GPU this many points busier than the others' mean, and 1.3× it, holds them back
MIN_SAMPLES = 3
MIN_STEPS = 5
SLOWED_FRACTION = 0.2
FEW_SMS_PCT = 40.0  # GPM's SM active in a GPU's busy samples: below it, its kernels leave most SMs idle
DATA_WAIT_PCT = 30.0  # of each step spent waiting for the next batch: the input pipeline holds training back
DATA_WAIT_RATIO = 3.0
COMM_WAIT_PCT = 25.0  # of each step waiting for the all-reduce after backward: the link (or a slower rank) holds training back


@dataclass(frozen=True)
class Hint:
    rule: str  # "input-pipeline", "data-wait", "batch-headroom", "precision", "straggler", …
    text: str


@dataclass
class _Steps:
    count: int = 0
    first: tuple[int, float] | None = None  # (step, time)
    last: tuple[int, float] | None = None


@dataclass
class _Health:
    """One GPU's health over a run: busy samples, those slowed and by what, the power then, the link, ECC."""

    busy: int = 0
    slowed: dict = field(default_factory=dict)  # reason -> busy samples it held the clock down in
    power: list = field(default_factory=list)  # (draw, limit) watts in slowed samples
    narrow_link: tuple[int, int] | None = None  # (lanes, the board's lanes) when narrower
    ecc_first: int | None = None  # volatile uncorrected ECC count at the first sample, and now
    ecc_last: int | None = None
    xid_errors: int = 0  # Xid errors since the watcher started, and the last code
    xid_last: int | None = None
    sm_active: list = field(default_factory=list)  # GPM's SM active % in busy samples (Hopper and later)

    def add(self, gpu) -> None:
        health = gpu.health
        if health is None:
            return
        if (gpu.utilization or 0) >= IDLE_GPU_PCT and health.sm_active is not None:
            self.sm_active.append(health.sm_active)
        if health.xid_errors:
            self.xid_errors, self.xid_last = max(self.xid_errors, health.xid_errors), health.xid_last
        if (gpu.utilization or 0) >= IDLE_GPU_PCT:
            self.busy += 1
            for reason in health.slowed_by:
                self.slowed[reason] = self.slowed.get(reason, 0) + 1
            if health.slowed_by and gpu.power is not None and gpu.power_limit:
                self.power.append((gpu.power, gpu.power_limit))
        if health.pcie_degraded:
            self.narrow_link = (health.pcie_width, health.pcie_width_max)
        if health.ecc_uncorrected is not None:
            self.ecc_first = health.ecc_uncorrected if self.ecc_first is None else self.ecc_first
            self.ecc_last = health.ecc_uncorrected


@dataclass
class Evidence:
    """One run's measurements, appended as they come (from the telemetry thread and the run loop)."""

    gpu_busy: dict[int, list[float]] = field(default_factory=dict)  # GPU index → utilisation % samples
    gpu_memory: dict[int, tuple[int, int]] = field(default_factory=dict)  # GPU index → (peak bytes used, total)
    rank_cpu: dict[int, list[float]] = field(default_factory=dict)  # rank → CPU % (100 = one core) samples
    rank_gpu: dict[int, int] = field(default_factory=dict)  # rank → the NVML index of its GPU
    steps: dict[int, dict[str, _Steps]] = field(default_factory=dict)  # rank → metric name → its steps
    setup: dict[int, list[dict]] = field(default_factory=dict)  # rank → prepare()'s facts, model by model
    training_from: float | None = None  # unix time of the first logged step
    gpu_health: dict[tuple[str, int], _Health] = field(default_factory=dict)  # (node, GPU index) → its health

    def add_snapshot(self, snap) -> None:
        """A :class:`~nbtrain.gpu.telemetry.Snapshot`; samples before the first logged step are skipped."""
        if self.training_from is not None and snap.time < self.training_from:
            return
        for gpu in snap.gpus:
            self.gpu_health.setdefault(("", gpu.index), _Health()).add(gpu)
            if gpu.utilization is not None:
                self.gpu_busy.setdefault(gpu.index, []).append(float(gpu.utilization))
            if gpu.memory_used is not None and gpu.memory_total:
                peak = self.gpu_memory.get(gpu.index, (0, gpu.memory_total))[0]
                self.gpu_memory[gpu.index] = (max(peak, gpu.memory_used), gpu.memory_total)
        for rank in snap.ranks:
            if rank.gpu_index is not None:
                self.rank_gpu[rank.rank] = rank.gpu_index
            if rank.cpu_percent is not None and rank.alive:
                self.rank_cpu.setdefault(rank.rank, []).append(float(rank.cpu_percent))

    def add_nodes(self, nodes) -> None:
        """A ``--nodes`` run's machines as their last heartbeats said (:class:`~nbtrain.kernel.observers.events.NodeInfo`,
        about once a second): each GPU's health is judged as this machine's are, under ``node b GPU 1``. A node
        heard before the first logged step, or lost, adds nothing."""
        for node in nodes:
            if node.state == NodeState.LOST or (self.training_from is not None and node.last_heard < self.training_from):
                continue
            for gpu in node.gpus:
                self.gpu_health.setdefault((node.name, gpu.status.index), _Health()).add(gpu.status)

    def add_metrics(self, rank: int, records) -> None:
        """``(step, unix_time, {name: value})`` records as ``nbtrain.log`` sent them."""
        for step, when, values in records:
            if self.training_from is None:
                self.training_from = when
                self.gpu_busy.clear()  # what was sampled so far was the start-up
                self.rank_cpu.clear()
            for name in values:
                seen = self.steps.setdefault(rank, {}).setdefault(name, _Steps())
                seen.count += 1
                seen.first = seen.first or (step, when)
                seen.last = (step, when)

    def add_setup(self, rank: int, facts: dict) -> None:
        self.setup.setdefault(rank, []).append(dict(facts))

    def steps_per_second(self, rank: int) -> float | None:
        """Over the metric the rank logged most often: (last step − first step) / time between them."""
        names = self.steps.get(rank, {})
        if not names:
            return None
        seen = max(names.values(), key=lambda s: s.count)
        if seen.count < MIN_STEPS or seen.first is None or seen.last is None or seen.last[1] <= seen.first[1]:
            return None
        return (seen.last[0] - seen.first[0]) / (seen.last[1] - seen.first[1])


def evidence_from_history(history, setup: dict[int, list[dict]]) -> Evidence:
    """What a run measured without telemetry (no dashboard): its logged steps and prepare()'s setup."""
    evidence = Evidence()
    for name in history.names:
        for rank in history.ranks(name):
            series = history.series(name, rank)
            evidence.add_metrics(rank, [(s, t, {name: 0.0}) for s, t in zip(series.steps, series.times, strict=True)])
    for rank, models in setup.items():
        for facts in models:
            evidence.add_setup(rank, facts)
    return evidence


def advise(evidence: Evidence) -> list[Hint]:
    """Every hint the evidence supports, most important first."""
    return [*_gpu_health(evidence), *_data_wait(evidence), *_comm_wait(evidence), *_input_pipeline(evidence), *_straggler(evidence),
            *_precision(evidence), *_batch_headroom(evidence)]


def _gpu_health(evidence: Evidence) -> list[Hint]:
    hints = []
    for (node, index), health in sorted(evidence.gpu_health.items()):
        gpu = f"node {node} GPU {index}" if node else f"GPU {index}"
        if health.xid_errors:
            hints.append(Hint("xid", f"{gpu} reported {health.xid_errors} Xid error"
                                     f"{'s' if health.xid_errors != 1 else ''} during the run (the last: Xid "
                                     f"{health.xid_last}) — the driver saw the GPU fault, so results may be wrong; "
                                     "look the code up in NVIDIA's Xid table, check dmesg (NVRM: Xid) and "
                                     "nvidia-smi -q, and run again elsewhere if it repeats."))
        errors = (health.ecc_last or 0) - (health.ecc_first or 0)
        if errors > 0:
            hints.append(Hint("ecc", f"{gpu} reported {errors} uncorrected ECC "
                                     f"error{'s' if errors != 1 else ''} during the run — results from this run may be "
                                     "wrong; check the GPU (nvidia-smi -q -d ECC) and run again elsewhere."))
        if health.busy >= MIN_SAMPLES and health.slowed:
            reason, samples = max(health.slowed.items(), key=lambda item: item[1])
            if samples / health.busy >= SLOWED_FRACTION:
                power = ""
                if reason == "power cap" and health.power:
                    draw = statistics.fmean(p for p, _ in health.power)
                    power = f" ({draw:.0f} of {health.power[-1][1]:.0f} W)"
                hints.append(Hint("gpu-slowed", f"{gpu} spent {100 * samples / health.busy:.0f} % of the run "
                                                f"slowed by its {reason}{power}."))
        if len(health.sm_active) >= MIN_SAMPLES and (active := statistics.fmean(health.sm_active)) < FEW_SMS_PCT:
            hints.append(Hint("few-sms", f"{gpu} ran a kernel most of the time, yet only {active:.0f} % of its SMs "
                                         "were active on average (GPM): its kernels are too small to fill it — "
                                         "take bigger batches, or --compile (fused kernels; reduce-overhead uses "
                                         "CUDA graphs)."))
        if health.narrow_link is not None:
            lanes, full = health.narrow_link
            hints.append(Hint("pcie", f"{gpu}'s PCIe link runs at x{lanes} (x{full} possible): data loading "
                                      "through it is limited (reseat the card, or check the slot and the BIOS)."))
    return hints


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if len(values) >= MIN_SAMPLES else None


def _input_pipeline(evidence: Evidence) -> list[Hint]:
    starved = []  # (GPU busy %, rank, GPU, CPU %) of each rank whose GPU waits while its CPU works
    for rank, gpu in sorted(evidence.rank_gpu.items()):
        busy, cpu = _mean(evidence.gpu_busy.get(gpu, [])), _mean(evidence.rank_cpu.get(rank, []))
        if busy is not None and cpu is not None and busy < IDLE_GPU_PCT and cpu >= BUSY_CPU_PCT:
            starved.append((busy, rank, gpu, cpu))
    if not starved:
        return []
    busy, rank, gpu, cpu = min(starved)
    alike = f" (and {count('other rank', len(starved) - 1)} alike)" if len(starved) > 1 else ""
    return [Hint("input-pipeline", (
        f"GPU {gpu} was busy {busy:.0f} % of the time on average while rank {rank}'s processes used {cpu:.0f} % "
        f"of a CPU core{alike}: the CPU side feeds the GPU too slowly. Most often that is the input pipeline: "
        "load batches in parallel (DataLoader num_workers=4 or more, pin_memory=True, persistent_workers=True) or "
        "keep the dataset on the GPU if it fits. With data already on the GPU, it is launching many small "
        "kernels: take bigger batches, or --compile (reduce-overhead uses CUDA graphs)."))]


def _data_wait(evidence: Evidence) -> list[Hint]:
    facts = {rank: fact for rank in sorted(evidence.setup) if (fact := step_meter_fact(evidence.setup, rank))
             and "data_wait" in fact and fact.get("steps_timed", 0) >= MIN_STEPS}
    if not facts:
        return []
    rank, worst = max(facts.items(), key=lambda item: item[1]["data_wait"])
    wait = worst["data_wait"]
    if wait >= DATA_WAIT_PCT:
        return [Hint("data-wait", f"{wait:.0f} % of each step on rank {rank} waited for data"
                                  f"{_loader_words(worst.get('loaders') or [])}: {_loader_advice(worst)}")]
    others = [fact["data_wait"] for other, fact in facts.items() if other != rank]
    typical = statistics.median(others) if others else None
    if typical is not None and wait >= 10.0 and wait >= DATA_WAIT_RATIO * max(typical, 1.0):
        return [Hint("data-wait", f"rank {rank}'s data wait is {wait / max(typical, 1.0):.0f}× the others' "
                                  f"({wait:.0f} % of each step against {typical:.0f} %): its batches come slower — "
                                  "a slower disk or file system on its machine, or samples that cost more to load.")]
    return []


def _comm_wait(evidence: Evidence) -> list[Hint]:
    timed = {rank for rank in evidence.setup
             if (fact := step_meter_fact(evidence.setup, rank)) and fact.get("steps_timed", 0) >= MIN_STEPS}
    shares = {rank: split["comm"] for rank, split in splits_of(evidence.setup).items() if rank in timed and "comm" in split}
    if not shares or max(shares.values()) < COMM_WAIT_PCT:
        return []
    sharded = any("shard" in fact for facts in evidence.setup.values() for fact in facts)
    collective = "reduce-scatter" if sharded else "all-reduce"
    rank = max(shares, key=lambda r: shares[r])
    least = min(shares, key=lambda r: shares[r])
    # a sharded model's on the CPU blocked backward at each block: not only after it
    waited = "FSDP2's gradient reduce-scatter" if sharded else "the gradient all-reduce after backward"
    said = f"{shares[rank]:.0f} % of each step on rank {rank} waited for {waited}"
    if shares[least] <= shares[rank] / 3:
        return [Hint("comm-wait", (
            f"{said}, against {shares[least]:.0f} % on rank {least}: the other ranks wait for rank {least} at every "
            f"{collective}, so rank {least} is the straggler. Look for what is different there: its data shard, its "
            "GPU, or work only it does (logging, evaluation)."))]
    if sharded:
        remedies = "reduce-scatter less often with --grad-accum N (one per N micro-steps) or a bigger batch per rank"
        if not (step_meter_fact(evidence.setup, rank) or {}).get("on_cpu"):
            remedies += ", on several nodes shard within each node only (--shard hybrid)"
        return [Hint("comm-wait", f"{said} (communication FSDP2 could not hide behind the backward): {remedies}, "
                                  f"or {_faster_link(evidence, rank)}.")]
    return [Hint("comm-wait", (
        f"{said} (communication DDP could not hide behind the backward): all-reduce less often with --grad-accum N "
        "(one all-reduce per N micro-steps) or a bigger batch per rank, compress the gradients "
        "(model.register_comm_hook(None, bf16_compress_hook) from torch.distributed.algorithms.ddp_comm_hooks."
        f"default_hooks), or {_faster_link(evidence, rank)}."))]


def _faster_link(evidence: Evidence, rank: int) -> str:
    """The last remedy of a long gradient wait: a faster link between GPUs, or on the CPU fewer ranks per core."""
    fact = step_meter_fact(evidence.setup, rank) or {}
    if fact.get("on_cpu"):
        return ("run fewer ranks than the machine has free cores (ranks on the CPU that share a core wait for each "
                "other in every collective)")
    return "train over a faster link between the GPUs (NVLink, InfiniBand)"


def _loader_words(loaders: list[dict]) -> str:
    if len(loaders) != 1:
        return ""
    loader = loaders[0]
    workers = loader.get("num_workers", 0)
    return f" (a DataLoader with {count('worker', workers) if workers else 'no workers'})"


def _loader_advice(fact: dict) -> str:
    loader = (fact.get("loaders") or [{}])[0]
    steps = []
    if loader.get("num_workers", 0) < 4:
        steps.append("raise num_workers (4 or more)")
    if not fact.get("on_cpu") and not loader.get("pin_memory"):
        steps.append("pin_memory=True")
    if loader.get("num_workers", 0) and not loader.get("persistent_workers"):
        steps.append("persistent_workers=True")
    steps.append("or decode on the GPU (DALI, torchvision.io.decode_jpeg on the device)" if not fact.get("on_cpu")
                 else "or make each sample cheaper to load")
    return ", ".join(steps) + "."


def _batch_headroom(evidence: Evidence) -> list[Hint]:
    if not evidence.training_from:
        return []  # nothing was trained (no step logged): a small peak says nothing about batches
    roomy = {gpu: (used, total) for gpu, (used, total) in sorted(evidence.gpu_memory.items())
             if used / total < MEMORY_HEADROOM_FRACTION}
    if not roomy or len(roomy) < len(evidence.gpu_memory):
        return []
    used, total = max(roomy.values(), key=lambda ut: ut[0] / ut[1])
    which = ", ".join(map(str, roomy))
    return [Hint("batch-headroom", (
        f"GPU memory peaked at {used / 2**30:.1f} GiB of {total / 2**30:.0f} GiB ({100 * used / total:.0f} %, GPU "
        f"{which}): there is room for a batch about {max(2, int(0.8 * total / used))}× bigger (scale the learning "
        "rate with it), which usually keeps the GPU busier."))]


def _precision(evidence: Evidence) -> list[Hint]:
    for rank, models in sorted(evidence.setup.items()):
        fp32 = [m for m in models if m.get("amp") == "off" and m.get("bf16_supported")]
        if fp32:
            device = fp32[0].get("device", "its GPU")
            return [Hint("precision", (
                f"rank {rank} trained in fp32 on {device}, which computes bf16: --amp bf16 (or leaving --amp out) "
                "runs the forward in bf16 under autocast, typically 1.2–2× faster, and with convolutions "
                "channels_last on top."))]
    return []


def _straggler(evidence: Evidence) -> list[Hint]:
    rates = {r: v for r in sorted(evidence.steps) if (v := evidence.steps_per_second(r)) is not None and v > 0}
    if len(rates) >= 2:
        slowest = min(rates, key=lambda r: rates[r])
        others = statistics.median(v for r, v in rates.items() if r != slowest)
        if rates[slowest] < STRAGGLER_RATIO * others:
            return [Hint("straggler", (
                f"rank {slowest} is a straggler: {rates[slowest]:.2f} steps/s against {others:.2f} for the other "
                f"ranks (median). Look for what is different there: its data shard, its GPU, or work only it does."))]
    busy = {r: m for r, g in evidence.rank_gpu.items() if (m := _mean(evidence.gpu_busy.get(g, []))) is not None}
    if len(busy) >= 2 and len(set(evidence.rank_gpu.values())) == len(evidence.rank_gpu):
        busiest = max(busy, key=lambda r: busy[r])
        rest = statistics.fmean(v for r, v in busy.items() if r != busiest)
        if busy[busiest] - rest >= BUSIER_BY_PCT and busy[busiest] >= 1.3 * rest:
            return [Hint("straggler", (
                f"rank {busiest} is a straggler: its GPU {evidence.rank_gpu[busiest]} was busy {busy[busiest]:.0f} % "
                f"against {rest:.0f} % for the other ranks' GPUs, which wait for it at every all-reduce. Look for "
                "more work on that rank (a bigger shard, extra logging or evaluation) or a slower GPU."))]
    return []
