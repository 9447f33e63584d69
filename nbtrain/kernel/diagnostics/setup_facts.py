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
    """``["logged by Hugging Face Trainer"]``: the training library whose own logs became the series
    (:mod:`nbtrain.rank.integrations`), once however many ranks said so."""
    names = sorted({f["integration"] for models in setup.values() for f in models if "integration" in f})
    return [f"logged by {', '.join(names)}"] if names else []


def mfu_words(setup: dict[int, list[dict]]) -> list[str]:
    """``["MFU 41 % (406 TFLOP/s of bf16's dense peak 989 TFLOP/s)", "each step: 38 % data · 30 % forward · …"]``,
    from rank 0's step meter (:mod:`nbtrain.rank.train.stepmeter`): the achieved rate alone where the peak is
    unknown, or why nothing was counted; where each step's time went (:func:`split_words`), or from a rank that
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


def _flop_rate(tflops: float) -> str:
    """``406 TFLOP/s``, ``2.1 TFLOP/s``, ``9.3 GFLOP/s``."""
    if tflops >= 1:
        return f"{tflops:.0f} TFLOP/s" if tflops >= 10 else f"{tflops:.1f} TFLOP/s"
    return f"{tflops * 1000:.0f} GFLOP/s" if tflops >= 0.01 else f"{tflops * 1000:.1f} GFLOP/s"


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
