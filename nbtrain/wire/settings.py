"""TrainSettings: the per-cell training options of ``%%distributed``, checked in the kernel.

``--amp``, ``--grad-accum``, ``--checkpoint``, ``--no-resume``, ``--max-restarts``, ``--channels-last`` /
``--no-channels-last``, ``--compile [MODE]``, ``--compile-fallback``, ``--shard [full|hybrid]``,
``--shard-offload`` and ``--activation-checkpointing`` become one frozen :class:`TrainSettings`. It travels to the ranks inside each :class:`~nbtrain.wire.protocol.Job` — not in
the pool's environment, which decides whether warm processes can be reused: changing ``--amp`` between
two cells must not cost a new pool.

:func:`parse_train_settings` validates everything before any process starts and resolves a relative
checkpoint directory against the notebook's current directory when the cell runs (``cwd``: the one
:func:`~nbtrain.launch.request.config.resolve` captured, which the job also runs in) — one rule, whatever directory
the warm ranks were started from. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

AMP_CHOICES = ("auto", "bf16", "fp16", "off")
# torch.compile's modes, then two backends that trace without generating code (for finding what breaks a compile)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_DEBUG_BACKENDS = ("aot_eager", "eager")
COMPILE_CHOICES = COMPILE_MODES + COMPILE_DEBUG_BACKENDS
CHECKPOINT_FILE = "checkpoint.pt"
SHARD_CHOICES = ("full", "hybrid")  # FSDP2 over every rank; HSDP: replicated across nodes, sharded within one


@dataclass(frozen=True)
class TrainSettings:
    amp: str = "auto"  # "auto": bf16 on GPUs that support it, fp16 on older GPUs, off on CPU
    grad_accum: int = 1
    checkpoint_dir: str | None = None  # absolute
    resume: bool = True  # resume automatically from checkpoint_dir when a checkpoint is there
    max_restarts: int = 0
    restart: int = 0  # which restart this attempt is (TORCHELASTIC_RESTART_COUNT in the ranks)
    profile: tuple[int, int, int] | None = None  # --profile: wait, warmup, active optimizer steps
    profile_dir: str | None = None  # absolute; where each rank writes its trace
    channels_last: bool | None = None  # None: channels_last for conv models under AMP on GPUs (train/speed.py)
    compile: str | None = None  # a COMPILE_CHOICES entry: torch.compile prepared models; None: do not
    compile_fallback: bool = False  # a failed compile runs the model uncompiled instead of failing the cell
    shard: str | None = None  # a SHARD_CHOICES entry: prepare() shards models with FSDP2; None: DDP
    shard_offload: bool = False  # sharded parameters and optimizer state live on the CPU (CPUOffloadPolicy)
    activation_checkpointing: bool = False  # each sharded block recomputes its activations in backward
    checkpoint_async: bool = False  # --shard: save_checkpoint() writes in the background (dcp.async_save)
    out_limit: int | None = None  # bytes: a sharded model larger than this stays on the ranks (None: no limit)

    @property
    def checkpoint_path(self) -> str | None:
        return os.path.join(self.checkpoint_dir, CHECKPOINT_FILE) if self.checkpoint_dir else None


class TrainSettingsError(ValueError):
    """A training option is malformed; the message says how to write it."""


def parse_train_settings(amp: str | None = None, grad_accum: int | None = None, checkpoint: str | None = None,
                         resume: bool = True, max_restarts: int | None = None, cwd: str | None = None, *,
                         channels_last: bool | None = None, compile: str | None = None,
                         compile_fallback: bool = False, shard: str | None = None, shard_offload: bool = False,
                         activation_checkpointing: bool = False, checkpoint_async: bool = False) -> TrainSettings:
    """Check the options and build :class:`TrainSettings`; raise :class:`TrainSettingsError` if one is wrong."""
    amp_mode = (amp or "auto").strip().lower()
    if amp_mode in ("bfloat16",):
        amp_mode = "bf16"
    if amp_mode in ("float16", "half"):
        amp_mode = "fp16"
    if amp_mode in ("none", "no", "fp32", "false"):
        amp_mode = "off"
    if amp_mode not in AMP_CHOICES:
        raise TrainSettingsError(f"--amp is bf16, fp16, off or auto (got {amp!r}); auto (or leaving it out) picks "
                                 "bf16 or fp16 by GPU and off on CPU.")
    if grad_accum is None:
        grad_accum = 1
    if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
        raise TrainSettingsError(f"--grad-accum takes a whole number of micro-steps per optimizer step, 1 or more (got {grad_accum!r}).")
    restarts = 0 if max_restarts is None else max_restarts
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise TrainSettingsError(f"--max-restarts takes 0 or more restarts (got {max_restarts!r}).")
    checkpoint_dir = None
    if checkpoint is not None:
        text = os.path.expanduser(checkpoint.strip())
        if not text:
            raise TrainSettingsError("--checkpoint needs a directory, such as --checkpoint runs/exp1.")
        checkpoint_dir = os.path.normpath(os.path.join(cwd or os.getcwd(), text))
        if os.path.exists(checkpoint_dir) and not os.path.isdir(checkpoint_dir):
            raise TrainSettingsError(f"--checkpoint {checkpoint} is a file; give a directory (the checkpoint goes in "
                                     f"{CHECKPOINT_FILE} inside it).")
        parent = _existing_parent(checkpoint_dir)
        if not os.access(parent, os.W_OK):
            raise TrainSettingsError(f"--checkpoint {checkpoint}: cannot write in {parent}; choose a writable directory.")
    if restarts and checkpoint_dir is None:
        raise TrainSettingsError("--max-restarts resumes the ranks from their last checkpoint, so it needs "
                                 "--checkpoint DIR (and nbtrain.save_checkpoint() in the cell).")
    compile_mode = _compile_mode(compile)
    if compile_fallback and compile_mode is None:
        raise TrainSettingsError("--compile-fallback says what to do when torch.compile fails, so it needs --compile "
                                 "(such as --compile --compile-fallback).")
    shard_mode = _shard_mode(shard, shard_offload, activation_checkpointing)
    if shard_mode and compile_fallback:
        raise TrainSettingsError("--compile-fallback does not go with --shard yet: a sharded model's blocks are compiled "
                                 "as they are sharded, with no uncompiled copy to fall back to. Leave it out.")
    if checkpoint_async and (shard_mode is None or checkpoint_dir is None):
        raise TrainSettingsError("--checkpoint-async writes sharded checkpoints in the background, so it needs --shard "
                                 "and --checkpoint DIR.")
    return TrainSettings(amp_mode, grad_accum, checkpoint_dir, bool(resume), restarts,
                         channels_last=channels_last, compile=compile_mode, compile_fallback=bool(compile_fallback),
                         shard=shard_mode, shard_offload=bool(shard_offload),
                         activation_checkpointing=bool(activation_checkpointing),
                         checkpoint_async=bool(checkpoint_async))


_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str, flag: str) -> int:
    """``500M``, ``8G``, ``1.5GiB``, ``123456`` → bytes; :class:`TrainSettingsError` that says how to write it."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text).lower())
    if not match:
        raise TrainSettingsError(f"{flag} takes a size such as 500M, 8G or 1.5GiB (got {text!r}).")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def _shard_mode(shard: str | None, offload: bool, checkpointing: bool) -> str | None:
    mode = shard.strip().lower() if shard is not None else None
    if mode is not None and mode not in SHARD_CHOICES:
        raise TrainSettingsError(f"--shard is full (every rank holds a shard; --shard alone) or hybrid (sharded within "
                                 f"a node, replicated across nodes, with --nodes) (got {shard!r}).")
    for flag, given in (("--shard-offload", offload), ("--activation-checkpointing", checkpointing)):
        if given and mode is None:
            raise TrainSettingsError(f"{flag} acts on sharded models, so it needs --shard (such as --shard {flag}).")
    return mode


def _compile_mode(text: str | None) -> str | None:
    if text is None:
        return None
    mode = text.strip().lower()
    if mode not in COMPILE_CHOICES:
        raise TrainSettingsError(f"--compile takes a torch.compile mode ({', '.join(COMPILE_MODES)}) or, to find what "
                                 f"breaks a compile, the backend aot_eager or eager (got {text!r}); "
                                 "--compile alone means default.")
    return mode


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
