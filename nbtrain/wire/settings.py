"""The training options of ``%%distributed``, declared once, and the :class:`TrainSettings` checked from them.

``--amp``, ``--grad-accum``, ``--checkpoint``, ``--no-resume``, ``--max-restarts``, ``--channels-last`` /
``--no-channels-last``, ``--compile [MODE]``, ``--compile-fallback``, ``--shard [full|hybrid]``,
``--shard-offload``, ``--checkpoint-async`` and ``--activation-checkpointing`` are the fields of
:class:`TrainOptions`, each declared with :func:`~nbtrain.wire.options.option` (flag, help, environment
variable). The magic's request (:class:`~nbtrain.kernel.request.config.LaunchRequest`) is a subclass, so the
kernel parses them from the cell's line; a rank started outside a cell (a torchrun script calling
``nbtrain.prepare()``) reads the same declarations' ``NBTRAIN_*`` variables (:func:`settings_from_environment`).
Either way :func:`parse_train_settings` makes one frozen :class:`TrainSettings`. It travels to the ranks inside each :class:`~nbtrain.wire.protocol.Job` — not in
the pool's environment, which decides whether warm processes can be reused: changing ``--amp`` between
two cells must not cost a new pool.

:func:`parse_train_settings` validates everything before any process starts and resolves a relative
checkpoint directory against the notebook's current directory when the cell runs (``cwd``: the one
:func:`~nbtrain.kernel.request.config.resolve` captured, which the job also runs in) — one rule, whatever directory
the warm ranks were started from. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .checkpoint_files import ForeignCheckpointError, refuse_foreign_folder
from .options import option, with_env_fallbacks

AMP_CHOICES = ("auto", "bf16", "fp16", "off")
# torch.compile's modes, then two backends that trace without generating code (for finding what breaks a compile)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_DEBUG_BACKENDS = ("aot_eager", "eager")
COMPILE_CHOICES = COMPILE_MODES + COMPILE_DEBUG_BACKENDS
CHECKPOINT_FILE = "checkpoint.pt"
SHARD_CHOICES = ("full", "hybrid")  # FSDP2 over every rank; HSDP: replicated across nodes, sharded within one


@dataclass(frozen=True)
class TrainOptions:
    """The training options as given (the cell's line, or ``NBTRAIN_*`` variables): one field per option."""

    amp: str | None = option(None, "--amp", "mixed precision for nbtrain.prepare()d models: bf16, fp16, off or auto "
                             "(default: bf16 on GPUs that support it, fp16 on older GPUs, off on CPU)",
                             group="training", metavar="MODE", env="NBTRAIN_AMP")
    grad_accum: int | None = option(None, "--grad-accum", "micro-steps per optimizer step (gradient accumulation)",
                                    group="training", type=int, metavar="K", env="NBTRAIN_GRAD_ACCUM")
    checkpoint: str | None = option(
        None, "--checkpoint", "directory for nbtrain.save_checkpoint(); the cell resumes from the checkpoint there "
        "when one exists (relative to the notebook's current directory)", group="training", metavar="DIR",
        env="NBTRAIN_CHECKPOINT")
    resume: bool = option(True, "--no-resume", "with --checkpoint: start from scratch even if DIR holds a checkpoint",
                          group="training", switch=True)
    max_restarts: int | None = option(
        None, "--max-restarts", "restart the ranks from the last checkpoint up to K times when a rank dies "
        "(needs --checkpoint)", group="training", type=int, metavar="K")
    channels_last: bool | None = option(
        None, "--channels-last", "channels_last memory format for nbtrain.prepare()d models with convolutions, and "
        "their 4-D inputs (default: on under AMP on GPUs; --no-channels-last turns it off)", group="speed",
        switch=True, either_way=True, env="NBTRAIN_CHANNELS_LAST")
    compile: str | None = option(
        None, "--compile", "torch.compile nbtrain.prepare()d models; MODE is default (when left out), reduce-overhead, "
        "max-autotune or max-autotune-no-cudagraphs (aot_eager or eager: trace only, to find what breaks)",
        group="speed", metavar="MODE", choices=COMPILE_CHOICES, bare="default", env="NBTRAIN_COMPILE")
    shard: str | None = option(
        None, "--shard", "shard prepare()d models over the ranks with FSDP2 (parameters, gradients and optimizer "
        "state: each rank holds 1/N); MODE is full (when left out) or hybrid (sharded within a node, replicated "
        "across --nodes)", group="training", metavar="MODE", choices=SHARD_CHOICES, bare="full", env="NBTRAIN_SHARD")
    shard_offload: bool = option(
        False, "--shard-offload", "with --shard: keep the sharded parameters and optimizer state on the CPU",
        group="training", switch=True)
    checkpoint_async: bool = option(
        False, "--checkpoint-async", "with --shard and --checkpoint: save_checkpoint() returns once the state is copied "
        "and writes it in the background (the next save, the cell's end and the stop button wait for it)",
        group="training", switch=True)
    activation_checkpointing: bool = option(
        False, "--activation-checkpointing", "with --shard: recompute each block's activations in backward instead "
        "of keeping them (less memory, more compute)", group="training", switch=True)
    integrations: bool = option(
        True, "--no-integrations", "do not turn what Hugging Face's Trainer, Lightning's Trainer or accelerate's "
        "trackers log into the dashboard's curves and history", group="training", switch=True, env="NBTRAIN_INTEGRATIONS")
    ft: str | None = option(
        None, "--ft", "per-step fault tolerance (torchft): the ranks form replica groups (one per rank, or R with "
        "replicas=R); a group that loses a rank drops out while the others keep stepping, and new ranks take its "
        "place and copy a peer's state (needs the ft extra); keep-batch: while groups are out, the others "
        "accumulate micro-batches to keep the global batch", group="training", metavar="replicas=R,keep-batch", bare="on")
    compile_fallback: bool = option(
        False, "--compile-fallback", "with --compile: when compiling fails, say why and run the model uncompiled "
        "instead of failing the cell", group="speed", switch=True)


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
    channels_last: bool | None = None  # None: channels_last for conv models under AMP on GPUs (rank/train/speed.py)
    compile: str | None = None  # a COMPILE_CHOICES entry: torch.compile prepared models; None: do not
    compile_fallback: bool = False  # a failed compile runs the model uncompiled instead of failing the cell
    shard: str | None = None  # a SHARD_CHOICES entry: prepare() shards models with FSDP2; None: DDP
    shard_offload: bool = False  # sharded parameters and optimizer state live on the CPU (CPUOffloadPolicy)
    activation_checkpointing: bool = False  # each sharded block recomputes its activations in backward
    checkpoint_async: bool = False  # --shard: save_checkpoint() writes in the background (dcp.async_save)
    out_limit: int | None = None  # bytes: a sharded model larger than this stays on the ranks (None: no limit)
    integrations: bool = True  # Hugging Face's and Lightning's Trainers log into nbtrain (rank/integrations)
    ft: bool = False  # --ft: the ranks form torchft replica groups (rank/train/ft_cell.py)
    ft_replicas: int = 0  # --ft replicas=R: R groups of N/R ranks; 0: one group per rank
    ft_keep_batch: bool = False  # --ft keep-batch: while groups are out, the others accumulate to keep the global batch

    @property
    def checkpoint_path(self) -> str | None:
        return os.path.join(self.checkpoint_dir, CHECKPOINT_FILE) if self.checkpoint_dir else None


class TrainSettingsError(ValueError):
    """A training option is malformed; the message says how to write it."""


def parse_train_settings(options: TrainOptions, cwd: str | None = None) -> TrainSettings:
    """Check the options and build :class:`TrainSettings`; raise :class:`TrainSettingsError` if one is wrong.

    A relative ``--checkpoint`` is resolved against ``cwd`` (the notebook's directory; default: this process's).
    """
    amp, grad_accum, checkpoint, max_restarts = options.amp, options.grad_accum, options.checkpoint, options.max_restarts
    compile, compile_fallback, checkpoint_async = options.compile, options.compile_fallback, options.checkpoint_async
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
        try:
            refuse_foreign_folder(checkpoint_dir, CHECKPOINT_FILE)
        except ForeignCheckpointError as exc:
            raise TrainSettingsError(f"--checkpoint {checkpoint}: {exc}") from None
    if restarts and checkpoint_dir is None:
        raise TrainSettingsError("--max-restarts resumes the ranks from their last checkpoint, so it needs "
                                 "--checkpoint DIR (and nbtrain.save_checkpoint() in the cell).")
    compile_mode = _compile_mode(compile)
    if compile_fallback and compile_mode is None:
        raise TrainSettingsError("--compile-fallback says what to do when torch.compile fails, so it needs --compile "
                                 "(such as --compile --compile-fallback).")
    shard_mode = _shard_mode(options.shard, options.shard_offload, options.activation_checkpointing)
    if shard_mode and compile_fallback:
        raise TrainSettingsError("--compile-fallback does not go with --shard yet: a sharded model's blocks are compiled "
                                 "as they are sharded, with no uncompiled copy to fall back to. Leave it out.")
    if checkpoint_async and (shard_mode is None or checkpoint_dir is None):
        raise TrainSettingsError("--checkpoint-async writes sharded checkpoints in the background, so it needs --shard "
                                 "and --checkpoint DIR.")
    ft_replicas, ft_keep_batch = _check_ft(options, shard_mode)
    return TrainSettings(amp_mode, grad_accum, checkpoint_dir, bool(options.resume), restarts,
                         channels_last=options.channels_last, compile=compile_mode,
                         compile_fallback=bool(compile_fallback), shard=shard_mode,
                         shard_offload=bool(options.shard_offload),
                         activation_checkpointing=bool(options.activation_checkpointing),
                         checkpoint_async=bool(checkpoint_async), integrations=bool(options.integrations),
                         ft=options.ft is not None, ft_replicas=ft_replicas, ft_keep_batch=ft_keep_batch)


def _check_ft(options: TrainOptions, shard_mode: str | None) -> tuple[int, bool]:
    """``--ft [replicas=R][,keep-batch]``: R (0: a group per rank) and whether the global batch is kept, and what
    --ft does not go with yet, said before anything starts (the ranks' count is checked against R with the pool:
    nbtrain.kernel.request.ft_request)."""
    if options.ft is None:
        return 0, False
    words = [word for word in options.ft.strip().lower().replace(" ", "").split(",") if word != "on"]
    keep_batch = "keep-batch" in words
    rest = [word for word in words if word != "keep-batch"]
    found = re.fullmatch(r"replicas=(\d+)", rest[0]) if len(rest) == 1 else None
    if rest and (found is None or int(found.group(1)) < 2):
        raise TrainSettingsError(f"--ft takes nothing (a replica group per rank), replicas=R with R of 2 or more, "
                                 f"keep-batch, or both, such as %%distributed 4 --ft replicas=2,keep-batch "
                                 f"(got --ft {options.ft}).")
    if shard_mode == "full":
        raise TrainSettingsError("--ft replicates the model across its replica groups, so it shards only within each "
                                 "group: use --shard hybrid --ft (HSDP: FSDP2 inside a group, a fault-tolerant "
                                 "all-reduce across the groups), or leave --shard out.")
    return (int(found.group(1)) if found else 0), keep_batch


def settings_from_environment(environ: Mapping[str, str] | None = None) -> TrainSettings:
    """A rank started outside a cell: the training options from their declared ``NBTRAIN_*`` variables.

    :class:`~nbtrain.wire.options.OptionEnvError` or :class:`TrainSettingsError` (both ValueErrors) say which
    variable is wrong and how to write it."""
    return parse_train_settings(with_env_fallbacks(TrainOptions(), environ))


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
