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
* **precision** — a rank trained in fp32 on a GPU that computes bf16 (``--amp off`` there);
* **straggler** — a rank whose logged steps per second are under :data:`STRAGGLER_RATIO` of the others'
  median, or (ranks kept in step by DDP) whose GPU is much busier than the others', which then wait for it.

Telemetry taken before the first logged step is left out when the run logs steps (start-up is not
training). Too few samples (:data:`MIN_SAMPLES`) or steps (:data:`MIN_STEPS`): no hint rather than a guess.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

IDLE_GPU_PCT = 50.0
BUSY_CPU_PCT = 80.0  # of one core
MEMORY_HEADROOM_FRACTION = 0.4
STRAGGLER_RATIO = 0.75
BUSIER_BY_PCT = 20.0  # a GPU this many points busier than the others' mean, and 1.3× it, holds them back
MIN_SAMPLES = 3
MIN_STEPS = 5


@dataclass(frozen=True)
class Hint:
    rule: str  # "input-pipeline", "batch-headroom", "precision", "straggler"
    text: str


@dataclass
class _Steps:
    count: int = 0
    first: tuple[int, float] | None = None  # (step, time)
    last: tuple[int, float] | None = None


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

    def add_snapshot(self, snap) -> None:
        """A :class:`~nbtrain.gpu.telemetry.Snapshot`; samples before the first logged step are skipped."""
        if self.training_from is not None and snap.time < self.training_from:
            return
        for gpu in snap.gpus:
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
    return [*_input_pipeline(evidence), *_straggler(evidence), *_precision(evidence), *_batch_headroom(evidence)]


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
    alike = f" (and {len(starved) - 1} other ranks alike)" if len(starved) > 1 else ""
    return [Hint("input-pipeline", (
        f"GPU {gpu} was busy {busy:.0f} % of the time on average while rank {rank}'s processes used {cpu:.0f} % "
        f"of a CPU core{alike}: the CPU side feeds the GPU too slowly. Most often that is the input pipeline: "
        "load batches in parallel (DataLoader num_workers=4 or more, pin_memory=True, persistent_workers=True) or "
        "keep the dataset on the GPU if it fits. With data already on the GPU, it is launching many small "
        "kernels: take bigger batches, or --compile (reduce-overhead uses CUDA graphs)."))]


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
