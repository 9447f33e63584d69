"""The training context of one cell on one rank: settings, device, precision, accumulation, prepared objects.

The worker opens a :class:`TrainContext` before a cell runs (:func:`begin`, with the cell's
:class:`~nbtrain.wire.settings.TrainSettings` from its Job) and closes it afterwards (:func:`end`), so
nothing prepared in one cell leaks into the next one on a warm rank. ``nbtrain.prepare()``,
``nbtrain.backward()``, ``nbtrain.save_checkpoint()`` and the rest find it with :func:`current`.

This module is the floor of ``rank/train/``: it imports only what builds a context (:mod:`.amp`'s dtype and
scaler, :mod:`.accumulate`'s window, :mod:`.stepmeter`, :mod:`.history_saves`' account, the settings) and every
other module imports it — prepare, data, optim, checkpoint, steps — so none of them needs an import inside a function
to dodge a cycle.
What they share beyond the context lives here too (:class:`PreparedError`).

Outside a ``%%distributed`` cell — a script started by ``torchrun`` — :func:`current` builds a context
from the environment (``LOCAL_RANK``, and in place of the magic's options the ``NBTRAIN_*`` variables that
:class:`~nbtrain.wire.settings.TrainOptions` declares: ``NBTRAIN_AMP``, ``NBTRAIN_GRAD_ACCUM``,
``NBTRAIN_CHECKPOINT``, ``NBTRAIN_CHANNELS_LAST``, ``NBTRAIN_COMPILE``, ``NBTRAIN_SHARD``), parsed by the
same declarations as the cell's line, so the same training code runs in both places.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ...wire.settings import TrainSettings, settings_from_environment
from . import amp, stepmeter
from .accumulate import Accumulation
from .history_saves import SavedHistory

_active: TrainContext | None = None


class PreparedError(TypeError):
    """prepare() was given something it cannot prepare, or the same thing twice."""


@dataclass(frozen=True)
class SaveGroup:
    """The ranks that write a checkpoint together: this rank's place among them, how many they are, and whether they
    write at all — every rank of the run, or under ``--ft`` one replica group for all (:mod:`.ft_cell`)."""

    rank: int
    size: int
    writes: bool = True


class TrainContext:
    def __init__(self, settings: TrainSettings, device, rank: int, world_size: int) -> None:
        self.settings = settings
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.amp_dtype = amp.resolve_dtype(settings.amp, device)
        self.scaler = amp.make_scaler(self.amp_dtype, device)
        self.scaler_update_pending = False
        self.accum = Accumulation(settings.grad_accum)
        self.models: list = []
        self.optimizers: list = []
        self.loaders: list = []
        self.schedulers: list = []
        self.prepared: weakref.WeakSet = weakref.WeakSet()  # originals already prepared in this cell
        self.step = 0  # optimizer steps taken (accumulation windows completed)
        self.steps_skipped = 0  # fp16 steps the GradScaler skipped (inf/NaN gradients)
        self.epoch = 0  # the epoch nbtrain.epochs() is in; where a resumed run starts
        self.resume_epoch = 0  # where nbtrain.epochs() starts: the saved epoch when resuming
        self.epochs_used = False  # nbtrain.epochs() drives the epoch loop
        self.resume: dict | None = None  # a loaded checkpoint, applied to each object as it is prepared
        self.resume_path: str | None = None
        self.auto_resume_checked = False  # see nbtrain.rank.train.checkpoint.auto_resume
        self.pending_save: Callable[[], object] | None = None  # --checkpoint-async: waits for the save in progress
        self.pending_removal: Callable[[], object] | None = None  # waits for older shard folders' removal
        self.saved_history = SavedHistory()  # which logged points each checkpoint's history file holds
        self.sharded_params: dict[int, object] = {}  # id of a parameter before --shard -> the sharded one (rank/train/shard.py)
        self.meter = stepmeter.for_device(rank, device, self.amp_dtype, world_size)  # step rate, MFU, data wait
        self._save_group: Callable[[], SaveGroup] | None = None  # --ft: its replica groups decide who writes

    def save_group(self) -> SaveGroup:
        """Who writes a checkpoint now (:class:`SaveGroup`)."""
        if self._save_group is not None:
            return self._save_group()
        return SaveGroup(self.rank, self.world_size if self.distributed else 1)

    def save_with(self, group: Callable[[], SaveGroup]) -> None:
        """``--ft``: every replica group holds the same state, and ``group()`` says which one writes it."""
        self._save_group = group

    @property
    def distributed(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def autocast(self):
        return amp.autocast_context(self.amp_dtype, self.device)

    def flush_scaler_update(self) -> None:
        """GradScaler.update() once after every optimizer of a window has stepped (as torch's recipe asks)."""
        if self.scaler is not None and self.scaler_update_pending:
            self.scaler.update()
        self.scaler_update_pending = False

    def __reduce__(self):
        raise TypeError("the training state belongs to its rank; bring back plain values (state.step, state.epoch)")

    def count_step(self, skipped: bool) -> None:
        """An accumulation window closed with an optimizer step (``skipped``: fp16 found inf/NaN gradients)."""
        self.step += 1
        self.steps_skipped += int(skipped)

    def scaler_stepped(self) -> None:
        """An optimizer stepped through the GradScaler: its update is due once the window's last one has."""
        self.scaler_update_pending = True

    def resume_from(self, state: dict, path: str) -> None:
        """A checkpoint was loaded: where the run goes on (step, epoch), applied to objects as they are prepared."""
        self.resume, self.resume_path = state, path
        self.step = int(state["step"])
        self.steps_skipped = int(state.get("steps_skipped", 0))
        self.epoch = self.resume_epoch = int(state["epoch"])

    def caught_up(self, step: int) -> None:
        """--ft: this group copied a peer's state in the middle of the run; its step counter goes on from the peer's."""
        self.step = step

    def mark_resume_checked(self) -> None:
        """The cell's checkpoint was looked for (loaded or not): the automatic resume does not look again."""
        self.auto_resume_checked = True

    def first_epoch(self) -> int:
        """Where ``nbtrain.epochs()`` starts (the saved epoch once, when resuming; then 0)."""
        start, self.resume_epoch = self.resume_epoch, 0
        return start

    def enter_epoch(self, epoch: int) -> None:
        self.epoch, self.epochs_used = epoch, True

    def save_in_background(self, wait: Callable[[], object]) -> None:
        """``wait`` finishes what the last save left going on in the background — its write under
        --checkpoint-async — (the next save and the cell's end call it)."""
        self.pending_save = wait

    def remove_in_background(self, wait: Callable[[], object]) -> None:
        """``wait`` finishes the removal of the shard folders the last save no longer names: the next save calls
        it once its own shards are written (by then it is long over), the cell's end before it ends."""
        self.wait_for_removal()
        self.pending_removal = wait

    def wait_for_removal(self) -> None:
        wait, self.pending_removal = self.pending_removal, None
        if wait is not None:
            wait()

    def wait_for_save(self) -> None:
        """The last save's background part, finished (a background write's error raised here)."""
        wait, self.pending_save = self.pending_save, None
        if wait is not None:
            wait()

    def close(self) -> None:
        self.wait_for_save()  # a cell ends, or is stopped, with its last checkpoint written
        self.wait_for_removal()  # and the folders it no longer names gone
        self.meter.close([loader.describe() for loader in self.loaders])
        for objects in (self.models, self.optimizers, self.loaders, self.schedulers):
            objects.clear()
        self.sharded_params.clear()
        self.resume = None


def unwrapped(obj):
    """What a prepared wrapper pickles into (``__reduce__``): the object it wraps, which is what goes back
    to the notebook — the kernel has no training context to rebuild the wrapper in."""
    return obj


@contextlib.contextmanager
def scope(settings: TrainSettings | None, device, rank: int, world_size: int) -> Iterator[TrainContext]:
    """The training context of a cell (the worker enters it around each cell): prepared models and loaders do not
    outlive it."""
    global _active
    _active = TrainContext(settings or TrainSettings(), device, rank, world_size)
    try:
        yield _active
    finally:
        reset()


def reset() -> None:
    """Close the current context: a cell's at its end, or the one a script under torchrun made on first use (the
    next :func:`current` builds a fresh one)."""
    global _active
    context, _active = _active, None
    if context is not None:
        context.close()


def current() -> TrainContext:
    """The context of the running cell; outside a cell, one built from the environment (torchrun)."""
    global _active
    if _active is None:
        _active = _from_environment()
    return _active


def _from_environment() -> TrainContext:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    settings = settings_from_environment()
    return TrainContext(settings, device, rank, world)
