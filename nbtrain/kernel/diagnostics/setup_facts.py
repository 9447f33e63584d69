"""What ``nbtrain.prepare()`` set up on the ranks, in words: precision, memory format, compile time, sharding.

The ranks send one :class:`~nbtrain.wire.protocol.Setup` per prepared model after its first forward
(:mod:`nbtrain.rank.train.speed`); the run keeps them per rank (``RunResult.setup``) and the observers get each
as it comes. This module only reads them, for the summary's first line and the dashboard: rank 0's models
speak for the run (every rank decides alike), the compile time is the slowest rank's, since the ranks wait
for each other at their first all-reduce.
"""

from __future__ import annotations

from ...common.words import count

NOT_A_MODEL = {"shard_state", "shard_unused", "precision", "integration"}  # Setup facts that describe no prepared model
DATA_WAIT_WORTH_SAYING_PCT = 10.0
MIN_TIMED_STEPS = 5  # steps timed (the first, counted one left out) before the summary speaks of rates


def setup_words(setup: dict[int, list[dict]]) -> list[str]:
    """``["bf16", "channels_last", "compiled (default) in 41.2 s"]``; empty when nothing was prepared."""
    models = [m for m in setup.get(0) or next(iter(setup.values()), []) if not NOT_A_MODEL & m.keys()]
    if not models:
        return integration_words(setup) + sharding_words(setup) + mfu_words(setup)
    words = []
    amps = sorted({m.get("amp", "off") for m in models})
    words.append("fp32" if amps == ["off"] else "/".join(a for a in amps if a != "off"))
    layouts = [m.get("channels_last") for m in models]
    if any(layouts):
        words.append("channels_last" if all(layouts) else f"channels_last ({sum(map(bool, layouts))} of "
                                                          f"{count('model', len(layouts))})")
    compiled = compile_seconds(setup)
    mode = next((m["compile"] for m in models if m.get("compile")), None)
    if compiled is not None:
        words.append(f"compiled ({mode}) in {compiled:.1f} s")
    failed = next((m["compile_error"] for m in models if m.get("compile_error")), None)
    if failed:
        words.append("not compiled: torch.compile failed, see above")
    return integration_words(setup) + words + sharding_words(setup) + mfu_words(setup)


def integration_words(setup: dict[int, list[dict]]) -> list[str]:
    """``["logged by Hugging Face Trainer"]``: whose logs became the run's series (:mod:`nbtrain.rank.integrations`)."""
    names = dict.fromkeys(f["integration"] for facts in setup.values() for f in facts if f.get("integration"))
    return [f"logged by {name}" for name in names]


def mfu_words(setup: dict[int, list[dict]]) -> list[str]:
    """``["MFU 41 % (406 TFLOP/s of bf16's dense peak 989 TFLOP/s)", "each step: 38 % data · 30 % forward · …"]``,
    from rank 0's step meter (:mod:`nbtrain.rank.train.stepmeter`): the achieved rate alone where the peak is
    unknown, or why nothing was counted; the samples (and, for token ids, tokens) per second over every rank;
    where each step's time went (:func:`split_words`), or from a rank that
    does not split its steps the data wait where it is at least :data:`DATA_WAIT_WORTH_SAYING_PCT` %. Nothing
    for a cell that timed fewer than :data:`MIN_TIMED_STEPS` steps."""
    fact = step_meter_fact(setup, 0)
    if fact is None or fact.get("steps_timed", 0) < MIN_TIMED_STEPS:  # a few steps say nothing of a rate
        return []
    words = []
    if fact.get("flops_uncounted"):
        words.append(f"MFU not measured: {fact['flops_uncounted']}")
    elif "tflops" in fact:
        achieved = _flop_rate(fact["tflops"])
        if fact.get("mfu") is not None:
            words.append(f"MFU {fact['mfu']:.0f} % ({achieved} of {fact['precision']}'s dense peak "
                         f"{_flop_rate(fact['peak_tflops'])})")
        else:
            words.append(f"{achieved} per rank" + (" (no MFU on the CPU)" if fact.get("on_cpu")
                                                   else " (MFU: this GPU's peak is unknown)"))
    if fact.get("samples_per_s"):
        words.append(f"{fact['samples_per_s']:,.0f} samples/s")
    if fact.get("tokens_per_s"):
        words.append(f"{_count_rate(fact['tokens_per_s'])} tokens/s")
    if fact.get("split"):
        words.append(split_words(fact["split"]))
    elif fact.get("data_wait", 0.0) >= DATA_WAIT_WORTH_SAYING_PCT:
        words.append(f"{fact['data_wait']:.0f} % of each step waiting for data")
    return words


def split_words(split: dict[str, float]) -> str:
    """``each step: 52 % data · 20 % forward · 18 % backward · 6 % optimizer · 4 % other`` (phases under 1 % left out)."""
    shown = [f"{share:.0f} % {phase}" for phase, share in split.items() if share >= 1.0]
    return "each step: " + " · ".join(shown) if shown else ""


def step_meter_fact(setup: dict[int, list[dict]], rank: int) -> dict | None:
    """The step meter's end-of-cell fact of ``rank`` (the first rank's, if that rank sent none)."""
    facts = setup.get(rank) or next(iter(setup.values()), [])
    return next((f for f in facts if "precision" in f), None)


def splits_of(setup: dict[int, list[dict]]) -> dict[int, dict[str, float]]:
    """``{rank: {phase: percent}}`` of the ranks that sent a step split, in rank order."""
    found = {}
    for rank in sorted(setup):
        fact = step_meter_fact({rank: setup[rank]}, rank)
        if fact is not None and fact.get("split"):
            found[rank] = fact["split"]
    return found


def _count_rate(per_second: float) -> str:
    """``2.1 M``, ``412 k``, ``950``."""
    if per_second >= 1e6:
        return f"{per_second / 1e6:.1f} M"
    return f"{per_second / 1e3:.0f} k" if per_second >= 1e4 else f"{per_second:,.0f}"


def _flop_rate(tflops: float) -> str:
    """``406 TFLOP/s``, ``2.1 TFLOP/s``, ``9.3 GFLOP/s``, ``310 kFLOP/s``: the unit that gives the rate two or three
    digits (a small model on a laptop CPU runs at a few MFLOP/s, which GFLOP/s would round to 0.0)."""
    rate = tflops * 1e12
    value, prefix = next(((rate / scale, prefix) for scale, prefix in _SI_PREFIXES if rate >= scale), (rate, ""))
    return f"{value:.0f} {prefix}FLOP/s" if value >= 10 else f"{value:.1f} {prefix}FLOP/s"


_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def sharding_words(setup: dict[int, list[dict]]) -> list[str]:
    """``["FSDP2 over 2 ranks (8 blocks)", "training state per rank 769 MiB (DDP: 1.5 GiB)"]``: what --shard did,
    measured at the cell's end on each rank (the largest rank's; DDP would hold the unsharded state on each)."""
    facts = [f for models in setup.values() for f in models]
    plan = next((f for f in facts if "shard" in f), None)
    unused = next((f for f in facts if "shard_unused" in f), None)
    if plan is None and unused is not None:  # --shard, but the cell prepared no model
        return ["--shard: nothing sharded (no model went through nbtrain.prepare()"
                + ("; each rank trained its own copy)" if unused["trained"] else ")")]
    if plan is None:
        return []
    words = [f"{plan['shard']} over {count('rank', plan['shard_ranks'])} ({count('block', plan['blocks'])})"]
    held = [f["shard_state"] for f in facts if "shard_state" in f]
    if held and max(held):
        words.append(f"training state per rank {memory_size(max(held))} (DDP: {memory_size(max(held) * plan['shard_ranks'])})")
    peaks = [f["peak"] for f in facts if f.get("peak")]
    if peaks:
        words.append(f"peak memory per rank {memory_size(max(peaks))}")
    return words


def memory_size(nbytes: float) -> str:
    """``512 MiB``, ``2.0 GiB``."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def compile_seconds(setup: dict[int, list[dict]]) -> float | None:
    """The slowest rank's compile time (its models' first forwards, summed), or None without --compile."""
    per_rank = [sum(m["compile_s"] for m in models if "compile_s" in m)
                for models in setup.values() if any("compile_s" in m for m in models)]
    return max(per_rank) if per_rank else None
