"""What ``nbtrain.prepare()`` set up on the ranks, in words: precision, memory format, compile time.

The ranks send one :class:`~nbtrain.wire.protocol.Setup` per prepared model after its first forward
(:mod:`nbtrain.train.speed`); the run keeps them per rank (``RunResult.setup``) and the observers get each
as it comes. This module only reads them, for the summary's first line and the dashboard: rank 0's models
speak for the run (every rank decides alike), the compile time is the slowest rank's, since the ranks wait
for each other at their first all-reduce.
"""

from __future__ import annotations

from ..words import count


def setup_words(setup: dict[int, list[dict]]) -> list[str]:
    """``["bf16", "channels_last", "compiled (default) in 41.2 s"]``; empty when nothing was prepared."""
    models = setup.get(0) or next(iter(setup.values()), [])
    if not models:
        return []
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
    return words


def compile_seconds(setup: dict[int, list[dict]]) -> float | None:
    """The slowest rank's compile time (its models' first forwards, summed), or None without --compile."""
    per_rank = [sum(m["compile_s"] for m in models if "compile_s" in m)
                for models in setup.values() if any("compile_s" in m for m in models)]
    return max(per_rank) if per_rank else None
