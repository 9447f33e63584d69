"""First-call costs a rank would pay, paid once in the zygote before it forks (:mod:`.zygote`).

A process's first ``torch.load(weights_only=True)`` builds the unpickler's tables, and its first DCP save or load
walks code paths (planners, the file reader and writer, torch's table of tensor layouts) that later calls find
ready. A forked rank inherits what the zygote warmed: its first resume or sharded save skips those costs
(measured in a forked process: a first small DCP read took 17–20 ms, 7–12 ms after this warm-up, 2 ms after
that). Each warm-up runs on a few bytes, without a process group and without CUDA (the fork's children must be
able to initialise it), leaves no thread behind, and any failure is ignored: it is an optimisation, never a
condition of starting.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
import warnings


def warm_checkpoint_paths() -> None:
    """A ``torch.load(weights_only=True)`` of a buffer, then a tiny DCP save and load through nbtrain's reader."""
    with contextlib.suppress(Exception):
        _weights_only_load()
    with contextlib.suppress(Exception):
        _dcp_round_trip()


def warm_in_spare() -> None:
    """What a fork pays again for the warm-ups above (measured in a spare: a first ``torch.load(weights_only=True)``
    of a checkpoint file took 2.0–2.3 ms where the second took 0.6), paid by a spare rank while it waits for work."""
    with contextlib.suppress(Exception):
        _weights_only_load()


def _weights_only_load() -> None:
    import torch

    buffer = io.BytesIO()
    torch.save({"tensor": torch.zeros(2), "values": [1, 2.0, "x", (3,)]}, buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=True)


def _dcp_round_trip() -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from .train import dcp_reading

    folder = tempfile.mkdtemp(prefix="nbtrain-warm-")  # private, new: nothing planted there is read
    # DCP's writer with one thread asks torch.cuda.is_available(), which counts devices through the CUDA runtime:
    # on a GPU machine that initialises CUDA, and a forked child could not use it (here, without a driver, it
    # marks every child a "bad fork"). With two threads it does not ask; both are joined before save() returns.
    writer = dcp.FileSystemWriter(folder, thread_count=2)
    try:
        with warnings.catch_warnings():  # DCP warns that it runs without a process group: here, it should
            warnings.simplefilter("ignore")
            dcp.save({"w": torch.zeros(2), "group": {"lr": 0.1, "betas": (0.9, 0.99)}}, storage_writer=writer,
                     no_dist=True)
            dcp_reading.load({"w": torch.empty(2), "group": {"lr": 0.0, "betas": (0.0, 0.0)}}, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
