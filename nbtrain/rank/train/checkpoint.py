"""Checkpoints: ``nbtrain.save_checkpoint()`` and resuming, by hand or when a cell starts.

**Saving.** Every rank calls ``nbtrain.save_checkpoint()`` (it gathers each rank's RNG state, so it is a
collective, like ``barrier()``); rank 0 writes one file, ``DIR/checkpoint.pt`` for ``--checkpoint DIR``
or the ``path`` given. The file holds the prepared models (plain ``state_dict``, without DDP's
``module.`` prefix), optimizers, LR schedulers, the GradScaler, each prepared DataLoader's position
(epoch, batches read), the step and epoch counters, every rank's RNG states (Python, NumPy, torch CPU and
CUDA), metric step counters, and whatever ``**extra`` you pass (tensors and plain values). The series logged with
``nbtrain.log()`` go to a file beside it, ``PATH.history-<id>``, that each save appends what was logged since the
last save to (:mod:`.history_saves`): a save costs the same at the millionth step as at the first.

**Reading** (:func:`read_checkpoint`) runs no code: ``torch.load(weights_only=True)`` rebuilds only tensors and
plain values (so the NumPy RNG state is saved as tensors), and a file another user owns, or that group or others
may write, is refused first (:mod:`nbtrain.wire.checkpoint_files`); a ``--shard``
folder is read through :mod:`.dcp_reading`, and the history file by :mod:`.history_file`, which parses numbers and
unpickles nothing.

It is written atomically (:mod:`.checkpoint_write`): to a temporary file in the same directory, flushed and
``fsync``-ed, then ``os.replace``-d over the old checkpoint, and the directory is ``fsync``-ed. A rank killed while saving
leaves the previous checkpoint intact (and a temporary file, removed by the next save). If rank 0
cannot write, every rank raises the same :class:`CheckpointError`.

**Resuming.** A cell run with ``--checkpoint DIR`` whose DIR holds a checkpoint resumes automatically
(``--no-resume`` starts over): the checkpoint is loaded at the first ``prepare()`` (or ``epochs()`` /
``load_checkpoint()``), and each model, optimizer, scheduler and loader gets its saved state as it is
prepared — in the order they were prepared when saved. RNG states, the step counter, the GradScaler and
metric steps are restored at load, and each rank sends the series saved with the checkpoint to the kernel
before anything it logs next — so ``history`` holds the whole curve of every attempt, continued.
``nbtrain.epochs(n)`` then starts at the saved epoch. ``nbtrain.load_checkpoint(path)`` does the same by hand and returns a
:class:`Checkpoint` with ``epoch``, ``step`` and your ``extra`` values.

Under ``--shard`` the models and optimizers go to a DCP folder beside the file
(``checkpoint.pt.shards-<step>-<id>``), each rank writing its own shards; the file names the folder once every
rank has written, and older folders are removed then. DCP re-shards on load: a sharded checkpoint resumes at
another world size, or into a run without ``--shard``, and a checkpoint without shards into a sharded run
(:mod:`.shard`).

Gradients accumulated inside an unfinished ``--grad-accum`` window are not saved: save between windows
(after ``optimizer.step()``), as the usual end-of-epoch save does.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...wire.checkpoint_files import SHARDS, ForeignCheckpointError, beside, refuse_foreign_checkpoint
from ...common.words import checkpoint_position
from . import dcp_resume, history_file, metrics, save_gather, shard, superseded
from .history_saves import HistoryFile, HistoryPlan
from .rng_state import rng_state, set_rng_state
from .plain_gather import broadcast_text, gather_plain
from .checkpoint_write import StagedFile, writable_by_owner_only, write_atomic
from .state import SaveGroup, TrainContext, current

FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, read or applied; the message says which and why."""


@dataclass(frozen=True)
class _Save:
    """One save_checkpoint() call: the file, who writes it, and the history file rank 0 appends to."""

    target: str
    group: SaveGroup
    history: HistoryPlan


@dataclass
class Checkpoint:
    path: str
    epoch: int
    step: int
    extra: dict = field(default_factory=dict)


def save_checkpoint(path: str | None = None, **extra) -> str:
    """Save everything prepared in this cell (call it on every rank); returns the file's path."""
    context = current()
    target = _target(context, path)
    context.wait_for_save()  # --checkpoint-async: one save at a time, in order
    if context.accum.backward_used and not context.accum.at_boundary():
        warnings.warn("save_checkpoint() inside a gradient-accumulation window: the gradients accumulated so far "
                      "are not saved. Save after optimizer.step().", stacklevel=2)
    context.flush_scaler_update()
    group = context.save_group()
    if not group.writes:
        return target  # --ft: another replica group, which holds the same state, writes it
    token, history = save_gather.rank0s_plan(context.device, group,
                                             context.saved_history.plan(target) if group.rank == 0 else None)
    save = _Save(target, group, history)
    mine: dict[str, object] = {"rank": context.rank, "rng": rng_state(context.device),
                               "metric_steps": metrics.step_counters(), "history": _logged_since(context, save)}
    sharded = any(shard.is_sharded(m) for m in context.models)
    folder = _shards_folder(context, target, token) if sharded else None
    if folder is not None and context.settings.checkpoint_async and path is None:
        return _save_in_background(context, save, mine, extra, folder)
    if sharded or group.size <= 1:  # --shard: the ranks' states reach rank 0 while DCP writes (_save_now)
        ranks = [mine]
    else:
        ranks = gather_plain(mine, context.device) or [mine]  # on rank 0; the others' snapshot is never written
    snapshot = _snapshot(context, ranks, extra, shard.checkpoint_entries(context, folder) if folder else None)
    error = _save_now(context, save, snapshot, folder)
    error = _rank0s_error(context.device, group, error)
    if error:
        raise CheckpointError(f"rank 0 could not write the checkpoint {target}: {error}. The previous checkpoint "
                              "there is unchanged; free disk space (or give --checkpoint another directory) and "
                              "save again.")
    return target


def _target(context: TrainContext, path: str | None) -> str:
    if path is not None:
        path = os.path.abspath(os.path.expanduser(path))
        return os.path.join(path, "checkpoint.pt") if os.path.isdir(path) else path
    if context.settings.checkpoint_path is None:
        raise CheckpointError("save_checkpoint() needs a place to write: run the cell with --checkpoint DIR, "
                              "or pass a path, such as nbtrain.save_checkpoint('runs/exp1/checkpoint.pt').")
    return context.settings.checkpoint_path


def _logged_since(context: TrainContext, save: _Save) -> torch.Tensor:
    """What this rank logged since the save that the history file it goes to last took, as history chunks."""
    lengths, delta = metrics.logged_since(context.saved_history.sent_by(save.target, save.history))
    context.saved_history.sending(save.target, save.history, lengths)
    data = history_file.encode(context.rank, delta)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def _rank0s_error(device, group: SaveGroup, error: str | None) -> str | None:
    """Rank 0's error in writing the file, on every rank: its length first, its words only when there is one."""
    if group.size <= 1:
        return error
    return broadcast_text(error if group.rank == 0 else None, device) or None


def _shards_folder(context: TrainContext, target: str, token: str) -> str:
    """--shard: every rank writes its shards to a new DCP folder beside the checkpoint file, which names it only
    once all are written — a save killed half-way leaves the previous checkpoint, and its folder, as they were.
    ``token``: rank 0's random part of the folder's name, the same on every rank."""
    return os.path.join(os.path.dirname(target), f"{os.path.basename(target)}{SHARDS}{context.step}-{token}")


def _save_now(context: TrainContext, save: _Save, snapshot: dict, folder: str | None) -> str | None:
    """Each rank writes its shards to ``folder`` (under --shard) while rank 0 appends the ranks' new history to its
    file and writes the file that will name them under a temporary name; the file replaces the old one once every
    rank's shards are written. Under --shard the ranks' own states reach rank 0 with their DCP plans, and the file is
    begun once the plan is agreed (:mod:`.save_planner`). Returns rank 0's error in writing the file (a failed DCP
    write raises on every rank, and the old file stays)."""
    staged: list[StagedFile | None] = []

    def begin(whole: Callable[[], dict]) -> None:
        staged.append(StagedFile(lambda: context.saved_history.write(save.target, save.history, whole()),
                                 save.target) if save.group.rank == 0 else None)

    if folder is None:
        begin(lambda: snapshot)
    try:
        if folder is not None:
            shard.save_states(context, folder, planned=lambda parts: begin(lambda: save_gather.with_every_rank(
                snapshot, parts)), part=save_gather.part_for_rank0(save.group, snapshot))
            if not staged:  # DCP calls finish_plan on every rank; should a later one not, the parts come after it
                begin(save_gather.after_the_write(save.group, snapshot))
    except BaseException:
        for file in staged:
            if file is not None:
                file.discard()
        raise
    if staged[0] is None:
        return None
    try:
        staged[0].put_in_place(first=lambda: writable_by_owner_only(folder) if folder is not None else None)
        named = {context.saved_history.in_place(save.target), os.path.basename(folder) if folder else None}
        context.wait_for_removal()  # the last save's (long over): listed after it, nothing is removed twice
        superseded.remove_later(context, save.target, {name for name in named if name})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _save_in_background(context: TrainContext, save: _Save, mine: dict, extra: dict, folder: str) -> str:
    """--checkpoint-async: the shards are copied now and written in the background; rank 0 writes the file that
    names them once DCP has finished (every rank's part), and the next wait raises what went wrong. Training waits
    for one collective of its own, rank 0's name for the shard folder: the ranks' RNG states and metric counters
    (``mine``, taken now) reach rank 0 in the background, over the background saves' own group."""
    # taken before DCP's write starts: its thread takes the GIL from whatever training still does here
    snapshot = _snapshot(context, [mine], extra, shard.checkpoint_entries(context, folder))  # its "ranks": every
    failure: list[str] = []  # rank's, once gathered
    finished = threading.Event()  # done() is over: the file written, older folders removed (rank 0)

    def done(error: str | None) -> None:
        try:
            snapshot["ranks"] = save_gather.gathered_on_rank0(save.group, mine, shard.background_group())  # every rank
            if error is None and save.group.rank == 0:
                writable_by_owner_only(folder)
                write_atomic(context.saved_history.write(save.target, save.history, snapshot), save.target)
                named = context.saved_history.in_place(save.target)
                superseded.remove(superseded.superseded(save.target, {os.path.basename(folder), named or ""}))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if error:
                failure.append(error)
            finished.set()

    shard.save_states(context, folder, done)
    written = context.pending_save
    assert written is not None  # set by the background save

    def wait() -> None:
        # The future's callbacks run after its result is set: wait for done() itself too. Rank 0 joins the next
        # save's collective only after this, so no rank writes a folder that rank 0 is still clearing.
        with contextlib.suppress(Exception):  # its error is the one done() recorded
            written()
        finished.wait()
        if failure:
            raise CheckpointError(f"the background save of {save.target} failed: {failure[0]}. The previous checkpoint "
                                  "there is unchanged.")
    context.save_in_background(wait)
    return save.target


def _snapshot(context: TrainContext, ranks: list, extra: dict, states: tuple[list, list] | None = None) -> dict:
    positions = [loader.position() for loader in context.loaders]
    if positions:
        epoch = positions[0]["epoch"]
    else:  # no prepared loader: assume the save ends the epoch nbtrain.epochs() is in
        epoch = context.epoch + 1 if context.epochs_used else context.epoch
    return {
        "format": FORMAT,
        "models": states[0] if states else [getattr(m, "module", m).state_dict() for m in context.models],
        "optimizers": states[1] if states else [o.state_dict() for o in context.optimizers],
        "schedulers": [s.state_dict() for s in context.schedulers],
        "scaler": context.scaler.state_dict() if context.scaler is not None else None,
        "loaders": positions,
        "epoch": epoch,
        "step": context.step,
        "logged_step": max(ranks[0]["metric_steps"].values(), default=context.step),  # where rank 0's series go on
        "steps_skipped": context.steps_skipped,
        "ranks": ranks,
        "extra": dict(extra),
        "saved_at": time.time(),
    }


def own_snapshot(context: TrainContext) -> dict:
    """This rank's training state as a checkpoint holds it — no collective, nothing written: what a ``--ft``
    replica group hands a peer that copies it (tensors and plain values only; its logged series stay its own)."""
    mine = {"rng": rng_state(context.device), "metric_steps": metrics.step_counters()}
    if not any(shard.is_sharded(model) for model in context.models):
        return _snapshot(context, [mine], {})
    # --shard hybrid: this rank's slices, which its peer of the same group rank holds in every group
    models = [dcp_resume.local_shards(m) if shard.is_sharded(m) else shard.plain(m).state_dict() for m in context.models]
    optimizers = []
    for optimizer in context.optimizers:
        owner, inner = shard.owner_of(context, optimizer), getattr(optimizer, "optimizer", optimizer)
        optimizers.append(dcp_resume.local_shards(owner, inner) if owner is not None and shard.is_sharded(owner)
                          else optimizer.state_dict())
    return _snapshot(context, [mine], {}, (models, optimizers))


def resume_from_peer(context: TrainContext, state: dict, peer: str) -> None:
    """A peer's :func:`own_snapshot`, for a ``--ft`` replica group that is behind. At its first ``prepare()`` (a
    group that joins late) it is applied to each object as it is prepared, as a checkpoint is. In the middle of the
    run (a step the others committed and this group did not) it goes into what is prepared at once, and each loader
    passes over the batches the peer read beyond it (a failed attempt costs each group a batch, and the groups' failed
    attempts differ). Its RNG and metric steps are this rank's from now on."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"the state copied from {peer} is not an nbtrain training state.")
    if context.models or context.optimizers:
        dcp_resume.restore(context, "", list(zip(context.models, state["models"], strict=True)),
                           list(zip(context.optimizers, state["optimizers"], strict=True)))
        for scheduler, saved in zip(context.schedulers, state["schedulers"], strict=True):
            scheduler.load_state_dict(saved)
        if context.scaler is not None and state.get("scaler"):
            context.scaler.load_state_dict(state["scaler"])
        context.caught_up(int(state["step"]))
        for loader, position in zip(context.loaders, state["loaders"], strict=False):
            loader.catch_up(position)
    else:
        context.resume_from(state, peer)
    set_rng_state(state["ranks"][0]["rng"], context.device)
    metrics.restore_step_counters(state["ranks"][0]["metric_steps"])


# ------------------------------------------------------------------------------------------ loading
def load_checkpoint(path: str | None = None) -> Checkpoint | None:
    """Load a checkpoint into what is prepared now and what is prepared later; None if there is none yet."""
    context = current()
    if path is None:
        if context.resume is not None and context.resume_path is not None:  # both set together
            return _info(context.resume, context.resume_path)
        default = context.settings.checkpoint_path
        if default is None:
            raise CheckpointError("load_checkpoint() needs a file: run the cell with --checkpoint DIR, or pass a path.")
        if not os.path.exists(default):
            return None
        context.mark_resume_checked()
        return load_for_resume(context, default, announce=True)
    target = _target(context, path)
    if not os.path.exists(target):
        raise CheckpointError(f"no checkpoint at {target}.")
    context.mark_resume_checked()
    return load_for_resume(context, target, announce=False)


def auto_resume(context: TrainContext) -> None:
    """With --checkpoint DIR holding a checkpoint, load it once (applied as objects are prepared)."""
    if context.auto_resume_checked:
        return
    context.mark_resume_checked()
    path = context.settings.checkpoint_path
    if context.settings.resume and path and os.path.exists(path) and context.resume is None:
        load_for_resume(context, path, announce=True)


def load_for_resume(context: TrainContext, path: str, announce: bool) -> Checkpoint:
    state = read_checkpoint(path, context.device)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a checkpoint written by nbtrain.save_checkpoint().")
    context.resume_from(state, path)
    if context.scaler is not None and state.get("scaler"):
        context.scaler.load_state_dict(state["scaler"])
    entry, own = _rank_entry(context, state.get("ranks") or [])
    if entry is not None:
        set_rng_state(entry["rng"], context.device)
        metrics.restore_step_counters(entry["metric_steps"])
    if entry is not None and own:
        _restore_history(context, path, state, entry)
    elif state.get("history"):  # another rank's series: this rank sends all of its own at the next save
        _resumed_history(context, path, state, None)
    restore_prepared(context, list(enumerate(context.models)), list(enumerate(context.optimizers)))
    for index, scheduler in enumerate(context.schedulers):
        restore_scheduler(context, scheduler, index)
    for index, loader in enumerate(context.loaders):
        restore_loader(context, loader, index)
    if announce and context.rank == 0:
        print(f"nbtrain: resuming from {path} ({checkpoint_position(context.epoch, context.step, state.get('logged_step'))})",
              flush=True)
        for step, folder in _unfinished_saves(path, state):
            print(f"nbtrain: the save at step {step} did not finish (the run was stopped, or a rank died, while it "
                  f"wrote {os.path.basename(folder)}): it is dropped, and this run resumes from the save before it, "
                  f"at step {state['step']}. The next save removes the unfinished folder.", flush=True)
    return _info(state, path)


def _restore_history(context: TrainContext, path: str, state: dict, entry: dict) -> None:
    """This rank's logged series, to the kernel before anything it logs next; later saves to ``path`` append to the
    history file it came from. A damaged or missing history file costs the curves, not the resume."""
    if "metric_history" in entry:  # a checkpoint that holds its series itself, as nbtrain wrote them before
        metrics.restore_history(entry["metric_history"])
        return
    if not state.get("history"):
        return
    try:
        history = HistoryFile.from_entry(state["history"])
        series = history_file.read_rank(os.path.join(os.path.dirname(path), history.name(path)), history.length,
                                        context.rank, metrics.logged_names())  # those are not restored
    except (history_file.HistoryFileError, KeyError, TypeError, ValueError) as exc:
        print(f"nbtrain: rank {context.rank}: the metric history of {path} cannot be read ({exc}): the curves "
              "logged before it are not restored; the training state is.", flush=True)
        return
    restored = metrics.restore_history({name: {"steps": steps, "times": times, "values": values}
                                        for name, (steps, times, values) in series.items()})
    _resumed_history(context, path, state, restored)  # a series not restored is sent again whole


def _resumed_history(context: TrainContext, path: str, state: dict, restored: dict[str, int] | None) -> None:
    with contextlib.suppress(KeyError, TypeError, ValueError):  # an entry that does not say: the next save starts a file
        context.saved_history.resumed(path, HistoryFile.from_entry(state["history"]), restored)


def _rank_entry(context: TrainContext, ranks: list) -> tuple[dict | None, bool]:
    """This rank's part of a checkpoint's ``ranks``, and whether it saved it itself: its own entry, or — a checkpoint
    written by one ``--ft`` replica group — the entry of the same place in that group (its RNG and metric steps, not
    its logged series, which are another rank's)."""
    for entry in ranks:
        if entry.get("rank") == context.rank:
            return entry, True
    place = context.save_group().rank
    if place >= len(ranks):
        return None, False
    return ranks[place], "rank" not in ranks[place]  # older checkpoints' entries are in rank order, without it


def _unfinished_saves(path: str, state: dict) -> list[tuple[int, str]]:
    """``--shard`` saves begun after the checkpoint's own and never named by it: (step, folder), oldest first. A
    folder is named ``checkpoint.pt.shards-<step>-<id>`` before its shards are written, the file only after."""
    named = {entry["dcp"] for entry in state.get("models", []) if isinstance(entry, dict) and "dcp" in entry}
    found = []
    for folder in beside(path, (SHARDS,)):
        step = os.path.basename(folder)[len(os.path.basename(path)) + len(SHARDS):].split("-")[0]
        if os.path.basename(folder) not in named and step.isdigit() and int(step) > int(state["step"]):
            found.append((int(step), folder))
    return sorted(found)


def read_checkpoint(path: str, device="cpu") -> dict:
    """The checkpoint file's content: tensors and plain values only — ``weights_only=True`` unpickles nothing
    else, so a planted or altered file runs no code — and only from a file this user alone can write."""
    try:
        refuse_foreign_checkpoint(path)
    except ForeignCheckpointError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        what = f"a reference to {found.group(1)}" if found else "something other than tensors and plain values"
        raise CheckpointError(
            f"the checkpoint {path} holds {what}, which nbtrain does not unpickle (a pickle can run code). If you "
            "saved it yourself with save_checkpoint(**extra), allow its class in the cell before it resumes — "
            "torch.serialization.add_safe_globals([TheClass]) — or save plain values (numbers, strings, lists, "
            "dicts, tensors); otherwise delete the file or run with --no-resume.") from None
    except Exception as exc:
        raise CheckpointError(f"could not read the checkpoint {path} ({type(exc).__name__}: {exc}); "
                              "delete it or run with --no-resume.") from exc


def _info(state: dict, path: str) -> Checkpoint:
    return Checkpoint(path, int(state["epoch"]), int(state["step"]), dict(state.get("extra") or {}))


def _saved(context: TrainContext, kind: str, index: int):
    saved = (context.resume or {}).get(kind, [])
    if index >= len(saved):
        raise CheckpointError(f"the checkpoint {context.resume_path} holds {len(saved)} {kind}, but this cell prepares "
                              f"more; prepare the same objects as the run that saved it, or use --no-resume.")
    return saved[index]


def restore_model(context: TrainContext, module, index: int) -> None:
    restore_prepared(context, [(index, module)], [])


def restore_prepared(context: TrainContext, models: list[tuple[int, object]], optimizers: list[tuple[int, object]]) -> None:
    """The saved state of each ``(index, model)`` and ``(index, optimizer)`` into it — a ``--shard`` checkpoint's
    models and optimizers read together, in one DCP load (:mod:`.dcp_resume`)."""
    if context.resume is None or not (models or optimizers):
        return
    try:
        dcp_resume.restore(context, os.path.dirname(context.resume_path or ""),
                           [(model, _saved(context, "models", index)) for index, model in models],
                           [(optimizer, _saved(context, "optimizers", index)) for index, optimizer in optimizers])
    except pickle.UnpicklingError as exc:  # a DCP folder holding more than tensors and plain values
        raise CheckpointError(f"{exc}. Delete it or run with --no-resume.") from None
    except RuntimeError as exc:
        what = " and ".join(f"{kind} {', '.join(str(index) for index, _ in objects)}"
                            for kind, objects in (("model", models), ("optimizer", optimizers)) if objects)
        raise CheckpointError(f"{what} {'does' if len(models) + len(optimizers) == 1 else 'do'} not match the "
                              f"checkpoint {context.resume_path}: {exc}\nUse another --checkpoint directory or "
                              "--no-resume for a different model.") from None


def restore_scheduler(context: TrainContext, scheduler, index: int) -> None:
    scheduler.load_state_dict(_saved(context, "schedulers", index))


def restore_loader(context: TrainContext, loader, index: int) -> None:
    loader.restore_position(_saved(context, "loaders", index))


def epochs(total: int, between: Callable[[TrainContext], None] | None = None):
    """``for epoch in nbtrain.epochs(10):`` — range(10), starting at the saved epoch when the cell resumes.

    ``between(context)`` runs after each epoch's body, before the next epoch is entered: a save there ends the
    epoch, everything its body logged included (a preemption's boundary, :mod:`nbtrain.rank.train.preempt_checkpoint`)."""
    context = current()
    auto_resume(context)
    for epoch in range(context.first_epoch(), int(total)):
        if between is not None and context.epochs_used:
            between(context)
        context.enter_epoch(epoch)
        yield epoch
