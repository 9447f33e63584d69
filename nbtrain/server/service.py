"""The server side of nbtrain's JupyterLab panel: what each route computes, off the event loop.

One :class:`NbtrainService` lives in the server's tornado settings (``settings["nbtrain"]``). Its coroutines
gather the server's kernels on the event loop (in-memory tables, the session database) and do everything
that touches NVML, ``/proc`` or the run files in a small thread pool of its own, so a slow driver never
stalls the notebook server — and a hung one ties up only these two threads, not Jupyter's shared pool.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

from jupyter_core.utils import ensure_async

from nbtrain.kernel.observers.registry import read_runs, runs_dir

from .detached_rows import detached_rows, stop_detached
from .gpus import gpu_states, machine_snapshot
from .kernels import by_pid, managed_kernels
from .lease_rows import releasable
from .runs import describe_runs, gpu_processes, resolve_stop


class NbtrainService:
    def __init__(self, kernel_manager, session_manager, runs_directory: str | None = None, root_dir: str = "") -> None:
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.root_dir = root_dir  # the notebooks' root: detached runs name their notebook under it
        # Where kernels write their run records: the same runtime dir as the kernels this server starts,
        # which inherit the server's environment.
        self.runs_directory = runs_directory or runs_dir()
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nbtrain-server")

    async def _blocking(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def _kernels(self):
        return await managed_kernels(self.kernel_manager, self.session_manager)

    def _records(self) -> list[dict]:
        return read_runs(self.runs_directory)

    async def gpus(self) -> dict:
        return await self._blocking(machine_snapshot)

    async def runs(self) -> dict:
        kernels = await self._kernels()
        runs = await self._blocking(lambda: describe_runs(kernels, self._records()))
        return {"runs": runs, "detached": await self._blocking(detached_rows, self.root_dir)}

    async def processes(self) -> dict:
        kernels = await self._kernels()
        found = await self._blocking(lambda: gpu_processes(kernels, self._records(), gpu_states()))
        return {"processes": found}

    async def stop(self, kernel_id: str | None = None, pid: int | None = None) -> dict:
        """Interrupt the kernel that owns the named run (raises runs.StopRefused when there is none)."""
        kernels = await self._kernels()
        run = await self._blocking(lambda: resolve_stop(kernels, self._records(), kernel_id=kernel_id, pid=pid))
        # Exactly what the notebook's stop button does; nbtrain's kernel side turns the interrupt into
        # stopping every rank (SIGINT, then SIGTERM, then SIGKILL) within 3 s.
        await ensure_async(self.kernel_manager.interrupt_kernel(run.kernel.kernel_id))
        return {"kernel_id": run.kernel.kernel_id, "path": run.kernel.path, "run_id": run.record.get("run_id"),
                "message": "interrupt sent; the run's ranks stop within a few seconds"}

    async def stop_detached(self, run_id: object) -> dict:
        """Stop one of this user's detached runs (raises runs.StopRefused when it is not one that runs)."""
        return await self._blocking(stop_detached, run_id)

    async def release_gpu(self, gpu: int) -> dict:
        """Give back a GPU this user's idle warm ranks hold: ``%distributed_shutdown`` in their kernel (raises
        lease_rows.ReleaseRefused when that is not the way)."""
        kernels = await self._kernels()
        kernel = await self._blocking(releasable, gpu, by_pid(kernels))
        await self._run_quietly(kernel.kernel_id, "%distributed_shutdown")
        return {"gpu": gpu, "kernel_id": kernel.kernel_id, "path": kernel.path,
                "message": f"GPU {gpu} given back: the warm ranks of {kernel.path or 'the kernel'} were stopped"}

    async def _run_quietly(self, kernel_id: str, code: str, timeout: float = 30.0) -> None:
        """Run ``code`` in the kernel as a silent request (no history, no prompt number), and wait for its reply."""
        client = self.kernel_manager.get_kernel(kernel_id).client()
        client.start_channels()
        try:
            msg_id = client.execute(code, silent=True, store_history=False)
            while True:
                reply = await ensure_async(client.get_shell_msg(timeout=timeout))
                if reply["parent_header"].get("msg_id") == msg_id:
                    return
        finally:
            client.stop_channels()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
