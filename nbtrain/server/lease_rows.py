"""Who holds which GPU, and who waits, as the ``/nbtrain/gpus`` route tells the JupyterLab panel.

Every nbtrain kernel on the machine leases the GPUs its runs use in one shared directory (:mod:`nbtrain.gpu.leases`)
and waits its turn there (:mod:`nbtrain.gpu.leasequeue`); this module reads both for the panel. What a user sees of
another user's lease is their user name and the notebook's file name alone — never its folder, kernel or pid —
and not even the file name where the administrator's policy sets ``show_notebooks = false``. The route never makes
the directory: a machine where no kernel leased a GPU has none, and no leases.
"""

from __future__ import annotations

import os

from nbtrain.gpu import leasepolicy, leases
from nbtrain.server.kernels import KernelView, owning_kernel
from nbtrain.gpu.leasechoice import queue_order
from nbtrain.gpu.leasequeue import waiting


def lease_rows(environ=os.environ) -> dict:
    """``{"leases": [...], "queue": [...], "lease_error": str | None}`` (see :mod:`nbtrain.server.gpus`)."""
    directory = environ.get("NBTRAIN_LEASE_DIR") or leases.DEFAULT_DIR
    if not os.path.isdir(directory):
        return {"leases": [], "queue": [], "lease_error": None}
    try:
        leases.check_dir(directory)
        held, queued = leases.held(directory), queue_order(waiting(directory))
    except (leases.LeaseDirError, OSError) as exc:
        return {"leases": [], "queue": [], "lease_error": str(exc)}
    me, shown = os.geteuid(), _notebooks_shown(environ)
    return {"leases": [_lease_json(lease, lease.uid == me, shown) for lease in held],
            "queue": [{"user": leases.user_name(ticket.uid), "since": ticket.since, "mine": ticket.uid == me}
                      for ticket in queued],
            "lease_error": None}


def _lease_json(lease: leases.HeldLease, mine: bool, notebooks_shown: bool) -> dict:
    notebook = lease.notebook if mine else (os.path.basename(lease.notebook) if lease.notebook and notebooks_shown
                                            else None)
    return {"gpu": lease.gpu, "user": lease.user, "notebook": notebook, "since": lease.since,
            "state": lease.state.value if lease.state is not None else None, "mine": mine}


def _notebooks_shown(environ) -> bool:
    """Other users' notebook names, unless the policy hides them (or cannot be read: then hidden, to be safe)."""
    try:
        return leasepolicy.load(environ).show_notebooks
    except leasepolicy.PolicyError:
        return False


class ReleaseRefused(Exception):
    """A GPU the panel cannot give back now: ``status`` (404, 409) and a message saying why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def releasable(gpu: int, kernels_by_pid: dict[int, KernelView], environ=os.environ) -> KernelView:
    """The kernel of this server whose warm ranks hold ``gpu`` under this user's lease, idle: giving it back is
    stopping them. A lease of another user, of a cell still running, or of a process this server did not start is
    refused, saying what to do instead."""
    directory = environ.get("NBTRAIN_LEASE_DIR") or leases.DEFAULT_DIR
    held = [lease for lease in (leases.held(directory) if os.path.isdir(directory) else []) if lease.gpu == gpu]
    mine = [lease for lease in held if lease.uid == os.geteuid()]
    if not mine:
        whose = f"it is {held[0].user}'s" if held else "nobody leases it"
        raise ReleaseRefused(404, f"GPU {gpu} holds no lease of yours ({whose}); only its holder gives it back.")
    lease = mine[0]
    kernel = owning_kernel(lease.pid, kernels_by_pid)
    if kernel is None:
        raise ReleaseRefused(409, f"GPU {gpu} is leased by process {lease.pid}, not a kernel of this server: run "
                                  "%distributed_shutdown in its notebook.")
    if lease.state is not leases.LeaseState.IDLE_WARM:
        raise ReleaseRefused(409, f"a cell of {kernel.path or 'kernel ' + kernel.kernel_id[:8]} is running on GPU "
                                  f"{gpu}: stop it first (its Stop button under Training runs).")
    return kernel
