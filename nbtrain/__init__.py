"""nbtrain: distributed PyTorch training from a Jupyter cell.

``%load_ext nbtrain`` registers the magics; ``%%distributed N`` runs a cell as N DDP ranks. Importing
nbtrain does nothing else: no torch import, no NVML, no processes until a cell asks for them.
"""

__version__ = "0.1.0"


def log(step=None, reduce=None, **values):
    """Inside a ``%%distributed`` cell: record metrics (numbers or tensors) for the dashboard and ``history``.

    ``nbtrain.log(loss=loss)`` does not wait for the GPU; values are sent in batches a few times a second.
    ``reduce="mean"`` logs the mean over all ranks (every rank calls it; one asynchronous all-reduce).
    """
    from .rank.train.metrics import log as _log

    _log(step, reduce, **values)


def prepare(*objects, **ddp_kwargs):
    """Move models to the rank's device and wrap them in DDP (with ``--amp`` autocast), make optimizers
    accumulation- and GradScaler-aware, shard DataLoaders with a DistributedSampler. Returns them in order.

    ``model, opt, loader = nbtrain.prepare(model, opt, loader)``; keyword arguments go to DDP. See docs/training.md.
    """
    from .rank.train.prepare import prepare as _prepare

    return _prepare(*objects, **ddp_kwargs)


def backward(loss, **kwargs):
    """Backward of one micro-step: ``loss / K`` under ``--grad-accum K``, GradScaler-scaled under fp16."""
    from .rank.train.steps import backward as _backward

    _backward(loss, **kwargs)


def autocast():
    """``with nbtrain.autocast():`` the cell's mixed precision (``--amp``) for code that does not use prepare()."""
    from .rank.train.steps import autocast as _autocast

    return _autocast()


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """Clip gradients at the end of an accumulation window (unscaled first under fp16); None on micro-steps."""
    from .rank.train.steps import clip_grad_norm_ as _clip

    return _clip(parameters, max_norm, norm_type)


def save_checkpoint(path=None, **extra):
    """Save the prepared models, optimizers, schedulers, GradScaler, loader positions, RNG and step counters.

    Call it on every rank; rank 0 writes ``--checkpoint DIR``/checkpoint.pt atomically. ``extra`` values are saved too.
    """
    from .rank.train.checkpoint import save_checkpoint as _save

    return _save(path, **extra)


def load_checkpoint(path=None):
    """Restore a checkpoint into the prepared objects (and those prepared later); returns its epoch, step, extra.

    With ``--checkpoint DIR`` this happens by itself when the cell starts and DIR holds a checkpoint.
    """
    from .rank.train.checkpoint import load_checkpoint as _load

    return _load(path)


def epochs(total):
    """``for epoch in nbtrain.epochs(10):`` — like range(10), but starts at the saved epoch when the cell resumes."""
    from .rank.train.checkpoint import epochs as _epochs
    from .rank.train.preempt_checkpoint import at_epoch_end

    return _epochs(total, between=at_epoch_end)


def training_state():
    """The cell's training context: ``.step``, ``.epoch``, ``.amp_dtype``, ``.scaler``, ``.accum.k``, ``.device``."""
    from .rank.train.state import current

    return current()


def breakpoint(rank=0):
    """Inside a ``%%distributed`` cell, on every rank: stop rank ``rank`` in pdb (its prompt under the cell);
    the other ranks wait for it outside any collective, so no collective timeout fires while you debug."""
    from .rank.train.debug import breakpoint as _breakpoint

    _breakpoint(rank)


def track(tracker):
    """Follow every later ``%%distributed`` cell of this kernel with ``tracker`` (an ``nbtrain.Tracker``: MLflow,
    W&B, …): it gets each run's start, every rank's logged series and the end. Returns it; see ``untrack``."""
    from .kernel.observers.trackers import track as _track

    return _track(tracker)


def runs():
    """This kernel's ``%%distributed`` runs, one row each: the cell, the options that differed, start, duration,
    world size, steps, the final and best value of each logged series, how it ended, its checkpoint, its GPU-hours
    (core-hours on the CPU) and their cost at ``--price-per-gpu-hour``. Shows as a table; ``.to_dicts()`` and
    ``.to_csv(path)`` give the rows, ``.to_pandas()`` a DataFrame and ``.plot("loss")`` each run's loss (pandas)."""
    from IPython import get_ipython

    from .kernel.observers.runlog import RunLog

    magics = getattr(get_ipython(), "_nbtrain_magics", None)
    return (magics.pools.runs if magics is not None else RunLog()).table()


def attach(run_id=None, background=False, force=False):
    """Follow a ``%%distributed --detach`` run from this kernel, as ``%distributed_attach [RUN_ID] [--background]
    [--force]`` does: with no id, your only running detached run (if none runs, the one that finished last)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("nbtrain.attach() follows a run in a notebook (an IPython kernel); none runs here")
    if getattr(shell, "_nbtrain_magics", None) is None:
        shell.extension_manager.load_extension("nbtrain")  # as %load_ext nbtrain (the panel's "Follow here" relies on it)
    words = [run_id] if run_id else []
    words += (["--background"] if background else []) + (["--force"] if force else [])
    return shell.run_line_magic("distributed_attach", " ".join(words))


def untrack(tracker):
    """Stop following cells with a tracker given to ``nbtrain.track``."""
    from .kernel.observers.trackers import untrack as _untrack

    _untrack(tracker)


def __getattr__(name):
    if name == "Tracker":  # the base class of experiment trackers, imported only when asked for
        from .kernel.observers.trackers import Tracker

        return Tracker
    if name == "last_run":  # the latest %%distributed --background run's handle (None before the first)
        from IPython import get_ipython

        magics = getattr(get_ipython(), "_nbtrain_magics", None)
        return magics.last_run if magics is not None else None
    raise AttributeError(f"module 'nbtrain' has no attribute {name!r}")


def load_ipython_extension(ipython):
    from .kernel.cluster.tokens import sweep_tokens
    from .kernel.observers.registry import sweep_records
    from .common.leftovers import sweep_quietly, sweep_temp
    from .kernel.magics import DistributedMagics
    from .wire.shm import sweep_orphans

    from .kernel.cluster.detached_runs import running_note
    from .wire.runfolder import sweep_ended

    sweep_quietly(sweep_orphans, sweep_temp, sweep_records, sweep_tokens, sweep_ended)  # what killed kernels and agents
    # left behind, and detached runs that ended more than NBTRAIN_RUNS_KEEP_DAYS ago
    note = running_note()
    if note:
        print(note)

    magics = DistributedMagics(ipython)
    ipython.register_magics(magics)
    ipython._nbtrain_magics = magics
    magics.pools.starter.start_zygote()  # in the background: the first cell's ranks are forked, torch imported


def unload_ipython_extension(ipython):
    magics = getattr(ipython, "_nbtrain_magics", None)
    if magics is not None:
        magics.pools.shutdown()
        magics.pools.starter.close()
        magics.cluster.close()  # joined nodes: their agents exit
        del ipython._nbtrain_magics
