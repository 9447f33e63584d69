"""Prepared DataLoaders: each rank reads its own shard, a new order every epoch, resumable mid-epoch.

``prepare(loader)`` rebuilds the loader with the same dataset, batch size, workers, collate function and
options, and a :class:`ResumableSampler` (a ``DistributedSampler``): rank r of W gets every W-th sample,
shuffled if the original loader shuffled (``shuffle=True``), in order otherwise. ``pin_memory`` is turned
on when the ranks run on GPUs.

The epoch advances by itself: each time the loader is iterated again it calls ``set_epoch`` with the next
number, so every epoch has a new order (the forgotten ``set_epoch`` call that makes every epoch identical
cannot happen). ``loader.epoch`` is the epoch of the pass in progress (or the next one).

Before it hands out a batch with no accumulation window open, it is where a preemption notice's checkpoint is
saved (:mod:`nbtrain.rank.train.preempt_checkpoint`): the previous step and what was logged for it are done.

While it is iterated, the loader knows which batch is its last, so a gradient-accumulation window never
spans two epochs (:mod:`nbtrain.rank.train.accumulate`). Its position (epoch, batches read) is saved in
checkpoints; a loader resumed mid-epoch skips the batches already seen by index, without loading them.

Starting a pass draws the seed of the loader's workers. A plain DataLoader takes it from the global RNG,
which would make the random stream of the training (dropout) depend on when loaders were iterated; a
prepared loader (without a ``generator=`` of yours) takes it from its own generator, seeded by
(sampler seed, epoch, rank), so a resumed run draws the same random numbers as an uninterrupted one.

Loaders it cannot shard are refused with the reason: an ``IterableDataset`` (shard the stream yourself),
a custom ``sampler`` or ``batch_sampler``, a loader that already has a ``DistributedSampler``.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from . import ft_cell, preempt_checkpoint
from .checkpoint import restore_loader
from .state import PreparedError, TrainContext, unwrapped


class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start its next pass some samples in (to resume mid-epoch)."""

    skip = 0  # samples of this rank's shard to leave out of the next pass

    def __iter__(self):
        indices = super().__iter__()
        skip, self.skip = self.skip, 0
        for _ in range(skip):
            next(indices, None)
        return indices


class PreparedLoader(DataLoader):
    epoch = 0  # the epoch of the pass in progress, else of the next pass
    batches_read = 0  # batches of the current pass handed out (counting skipped ones when resumed)
    pass_finished = True
    at_last_batch = False
    _context: TrainContext | None = None
    _own_generator = False
    # what prepare_loader() builds it with (DataLoader declares them wider)
    sampler: ResumableSampler
    batch_size: int
    _original: DataLoader

    def __iter__(self):
        if not self.pass_finished:  # a pass was left early (break): the next one is a new epoch
            self.epoch += 1
        self.sampler.set_epoch(self.epoch)
        if self._own_generator:  # worker seeds from (seed, epoch, rank), not from the global RNG: see module doc
            self.generator.manual_seed(self.sampler.seed + 1_000_003 * self.epoch + self.sampler.rank)
        skip_batches, self.batches_read = self._resume_batches, 0
        self._resume_batches = 0
        if skip_batches:
            self.sampler.skip = skip_batches * self.batch_size
            self.batches_read = skip_batches
        self.pass_finished, self.at_last_batch = False, False
        return self._batches(super().__iter__())

    _resume_batches = 0

    def _batches(self, iterator):
        """Yield the batches one ahead, so the last one is known when it is handed out."""
        accum = self._context.accum if self._context is not None else None
        if accum is not None:
            accum.active_loaders.append(self)
        try:
            current = self._next(iterator)
            while current is not _END:
                if self._context is not None and accum is not None and (accum.closing or not accum.backward_used):
                    if (ft := ft_cell.active()) is not None:
                        ft.boundary()  # --ft: the step's quorum, where a peer's copy holds this loader's position
                        iterator, current = self._caught_up(iterator, current)
                        if current is _END:
                            break
                    preempt_checkpoint.at_boundary(self._context)  # a notice: the checkpoint goes here (rank/train/preempt_checkpoint.py)
                following = self._next(iterator)
                self.at_last_batch = following is _END
                self.batches_read += 1
                yield current
                current = following
            self.pass_finished = True
            self.epoch += 1
        finally:
            self.at_last_batch = False
            if accum is not None and self in accum.active_loaders:
                accum.active_loaders.remove(self)

    def catch_up(self, position: dict) -> None:
        """--ft: this group copied a peer's state in the middle of the run, at this step's boundary; the peer's loader
        was at ``position`` there (:meth:`_caught_up` moves on to it)."""
        self._peer_position = position

    _peer_position: dict | None = None

    def _caught_up(self, iterator, current):
        """After :meth:`catch_up`: this loader moves to the peer's position, so that every group reads as many batches
        — a group with batches left when the others finish would take steps alone. Behind the peer in the same pass,
        the batches the peer read beyond it are passed over (the peer's committed steps stand for them); the peer in
        a later pass ends this one (``_END``), and the next starts at the peer's batch; ahead of the peer in the same
        pass (more failed attempts than the peer's attempts), the pass starts again at the peer's batch, and the
        batches of the failed attempts are read again. Returns the iterator and the batch to hand out. A peer in an
        earlier pass leaves it where it is: the pass it would go back to is over in the cell's own loop."""
        peer, self._peer_position = self._peer_position, None
        if peer is None:
            return iterator, current
        epoch, batches = int(peer["epoch"]), int(peer.get("batches", 0))
        if epoch > self.epoch:
            self._resume_batches = batches
            return iterator, _END
        if epoch == self.epoch and batches < self.batches_read:
            return self._rewound(batches)
        while epoch == self.epoch and self.batches_read < batches and current is not _END:
            self.batches_read += 1  # passed over: the peer's committed steps stand for it
            current = self._next(iterator)
        return iterator, current

    def _rewound(self, batches: int):
        """This pass again from its ``batches``-th batch: a new iterator of the same epoch's order (the sampler's
        order depends on the seed and the epoch alone), and its first batch."""
        self.sampler.set_epoch(self.epoch)
        self.sampler.skip = batches * self.batch_size
        self.batches_read = batches
        iterator = super().__iter__()
        return iterator, self._next(iterator)

    def _next(self, iterator):
        """The next batch, its wait counted as the step's data wait (rank/train/stepmeter.py)."""
        started = time.perf_counter()
        if self._context is not None:
            self._context.meter.split.backward_ended()  # the wait is not backward's (accumulation's micro-steps)
        batch = next(iterator, _END)
        if self._context is not None:
            self._context.meter.data_waited(time.perf_counter() - started)
            if batch is not _END:
                self._context.meter.batch_read(batch)
        return batch

    def describe(self) -> dict:
        """What the advisor says of a slow loader: its workers and pinning."""
        return {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
                "persistent_workers": self.persistent_workers}

    def position(self) -> dict:
        """Where the loader is, for a checkpoint: the epoch to resume in and the batches already read."""
        if self.pass_finished:
            return {"epoch": self.epoch, "batches": 0}
        return {"epoch": self.epoch, "batches": self.batches_read}

    def restore_position(self, position: dict) -> None:
        self.epoch = int(position["epoch"])
        self._resume_batches = int(position.get("batches", 0))
        self.pass_finished = True

    def __reduce__(self):  # brought back to the notebook: the loader prepare() was given
        return (unwrapped, (self._original,))


_END = object()


def prepare_loader(context: TrainContext, loader: DataLoader) -> PreparedLoader:
    shuffle = _check_shardable(loader)
    sampler = ResumableSampler(loader.dataset, num_replicas=context.world_size, rank=context.rank,
                               shuffle=shuffle, drop_last=loader.drop_last)
    options = dict(
        batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
        collate_fn=loader.collate_fn, pin_memory=loader.pin_memory or context.device.type == "cuda",
        drop_last=loader.drop_last, timeout=loader.timeout, worker_init_fn=_worker_init(context, loader),
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator or torch.Generator(),
        persistent_workers=loader.persistent_workers,
    )
    if loader.num_workers > 0:
        options["prefetch_factor"] = loader.prefetch_factor
    for name in ("in_order",):  # newer DataLoader options, copied when this torch has them
        if hasattr(loader, name):
            options[name] = getattr(loader, name)
    prepared = PreparedLoader(loader.dataset, **options)
    prepared._context = context
    prepared._own_generator = loader.generator is None
    prepared._original = loader
    if context.resume is not None:
        restore_loader(context, prepared, len(context.loaders))
    context.loaders.append(prepared)
    return prepared


def _worker_init(context: TrainContext, loader: DataLoader):
    """The loader's worker_init_fn; in a ``--checkpoint`` cell its workers outlive an outside SIGTERM, so the rank
    can save a preemption notice's checkpoint (:func:`nbtrain.rank.train.preempt_checkpoint.loader_worker_init`)."""
    if context.settings.checkpoint_path is None or loader.num_workers == 0:
        return loader.worker_init_fn
    return preempt_checkpoint.loader_worker_init(loader.worker_init_fn)


def _check_shardable(loader: DataLoader) -> bool:
    """Whether the loader shuffles; raise if it cannot be rebuilt with a DistributedSampler."""
    if isinstance(loader.dataset, IterableDataset):
        raise PreparedError("prepare() cannot shard a DataLoader over an IterableDataset: give each rank its own "
                            "part of the stream (torch.distributed.get_rank()) and do not prepare that loader.")
    if isinstance(loader.sampler, DistributedSampler):
        raise PreparedError("this DataLoader already has a DistributedSampler; pass the loader without it "
                            "(prepare() adds one), or do not prepare the loader.")
    if loader.batch_size is None:
        raise PreparedError("prepare() rebuilds a DataLoader from its batch_size, but this one uses a batch_sampler; "
                            "shard it yourself or build the loader with batch_size=...")
    if not isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
        raise PreparedError(f"this DataLoader uses a custom sampler ({type(loader.sampler).__name__}), which prepare() "
                            "cannot split across ranks; wrap it in a DistributedSampler yourself and do not prepare the loader.")
    if isinstance(loader.sampler, RandomSampler) and (loader.sampler.replacement or loader.sampler._num_samples is not None):
        raise PreparedError("this DataLoader samples with replacement or a num_samples; prepare() shards with "
                            "DistributedSampler, which cannot do that. Build the loader with shuffle=True instead.")
    return isinstance(loader.sampler, RandomSampler)
