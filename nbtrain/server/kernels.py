"""The kernels this Jupyter server manages, as the nbtrain routes need them: id, process id, notebook path.

Jupyter knows a kernel by its id; NVML and ``ps`` know processes by pid; people know notebooks by path.
:func:`managed_kernels` joins the three from the server's kernel manager (id → pid, from the kernel's
provisioner) and session manager (id → notebook path). :func:`owning_kernel` then answers "which kernel
does process N belong to": the kernel itself or any descendant of it — ``%%distributed`` ranks are children
of the kernel, their DataLoader workers grandchildren.

Kernels started by a remote provisioner (a gateway) have no local pid; they can still be stopped by id, but
no local process maps to them.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class KernelView:
    kernel_id: str
    pid: int | None  # the kernel process on this machine, None when it runs elsewhere
    path: str | None  # the notebook (or console/file) path of its session, None when it has no session
    name: str | None  # the session's name as the UI shows it

    def as_json(self) -> dict:
        return {"kernel_id": self.kernel_id, "kernel_pid": self.pid, "path": self.path, "name": self.name}


async def managed_kernels(kernel_manager, session_manager) -> dict[str, KernelView]:
    """Every kernel of this server by id. Cheap: in-memory kernel table plus the server's session table."""
    sessions: dict[str, dict] = {}
    if session_manager is not None:
        for session in await session_manager.list_sessions():
            kernel = session.get("kernel") or {}
            if kernel.get("id"):
                sessions[kernel["id"]] = session
    kernels = {}
    for kernel_id in kernel_manager.list_kernel_ids():
        session = sessions.get(kernel_id, {})
        kernels[kernel_id] = KernelView(kernel_id, _kernel_pid(kernel_manager, kernel_id), session.get("path"),
                                        session.get("name"))
    return kernels


def _kernel_pid(kernel_manager, kernel_id: str) -> int | None:
    try:
        provisioner = kernel_manager.get_kernel(kernel_id).provisioner
    except KeyError:  # shut down between listing and lookup
        return None
    pid = getattr(provisioner, "pid", None)
    return pid if isinstance(pid, int) else None


def owning_kernel(pid, kernels_by_pid: dict[int, KernelView]) -> KernelView | None:
    """The kernel that ``pid`` is, or descends from; None for a process outside every kernel (or gone)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None  # psutil.Process(None) would be this very process
    if pid in kernels_by_pid:
        return kernels_by_pid[pid]
    try:
        ancestors = psutil.Process(pid).parents()
    except psutil.Error:
        return None
    for ancestor in ancestors:
        if ancestor.pid in kernels_by_pid:
            return kernels_by_pid[ancestor.pid]
    return None


def by_pid(kernels: dict[str, KernelView]) -> dict[int, KernelView]:
    return {k.pid: k for k in kernels.values() if k.pid is not None}
