"""Xid errors — the driver's reports of a GPU fault (a lost context, a double-bit ECC error, a GPU fallen off
the bus) — counted per GPU while something watches, such as a run's dashboard.

:class:`XidWatcher` registers every GPU for NVML's critical Xid events (``nvmlEventSetCreate``,
``nvmlDeviceRegisterEvents`` with ``nvmlEventTypeXidCriticalError``) and waits for them on a daemon thread of
its own, :data:`WAIT_MS` at a time (``nvmlEventSetWait_v2``; the bindings release the GIL while NVML waits),
never on the kernel's main thread. A GPU that cannot be registered — some boards, MIG, VMs, a driver without
the permission — reads N/A, with NVML's reason. :meth:`XidWatcher.close` returns at once: the thread ends after
the wait it is in (at most :data:`WAIT_MS`) and frees the event set itself — a run's end never waits for it (it
used to join the thread: half a second on every cell with a dashboard).
"""

from __future__ import annotations

import ctypes
import threading

XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
WAIT_MS = 500


def _address(handle) -> int:
    """A device handle as a number: NVML's event names its device by a pointer equal to the GPU's handle."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (ctypes.ArgumentError, TypeError):  # not a ctypes pointer (a stand-in's handle): the object itself
        return id(handle)


class XidWatcher:
    def __init__(self, lib, gpus) -> None:
        self._lib = lib
        self._lock = threading.Lock()
        self.counts: dict[int, int] = {}  # GPU index -> Xid errors seen since the watcher started
        self.last: dict[int, int] = {}  # GPU index -> the last Xid code
        self.reasons: dict[int, str] = {}  # GPU index -> why its Xid errors cannot be watched
        self._index: dict[int, int] = {}  # handle address -> GPU index
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set = self._register(gpus)
        if self._index:
            self._thread = threading.Thread(target=self._loop, name="nbtrain-xid-events", daemon=True)
            self._thread.start()

    def _register(self, gpus):
        try:
            event_set = self._lib.nvmlEventSetCreate()
        except Exception as exc:
            self.reasons = {gpu.index: f"NVML events unavailable ({exc})" for gpu in gpus}
            return None
        kind = getattr(self._lib, "nvmlEventTypeXidCriticalError", XID_CRITICAL)
        for gpu in gpus:
            try:
                self._lib.nvmlDeviceRegisterEvents(gpu.handle, kind, event_set)
            except Exception as exc:
                self.reasons[gpu.index] = f"Xid events not reported ({exc})"
                continue
            self._index[_address(gpu.handle)] = gpu.index
            self.counts[gpu.index] = 0
        return event_set

    def _loop(self) -> None:
        try:
            self._watch()
        finally:
            self._free()  # here, after the last wait: the set is never freed under a wait that still uses it

    def _watch(self) -> None:
        timeout = getattr(self._lib, "NVMLError_Timeout", ())
        while not self._stop.is_set():
            try:
                event = self._lib.nvmlEventSetWait_v2(self._set, WAIT_MS)
            except timeout:
                continue
            except Exception as exc:  # the driver went away: say so instead of spinning
                with self._lock:
                    for index in self.counts:
                        self.reasons[index] = f"Xid events stopped ({exc})"
                return
            found = self._index.get(_address(event.device))
            if found is not None:
                with self._lock:
                    self.counts[found] += 1
                    self.last[found] = int(event.eventData)

    def read(self, index: int) -> tuple[int | None, int | None, str | None]:
        """(errors so far, the last Xid code, why N/A) for GPU ``index``."""
        with self._lock:
            return self.counts.get(index), self.last.get(index), self.reasons.get(index)

    def close(self) -> None:
        """Stop watching, without waiting for the thread (see the module docstring)."""
        self._stop.set()
        if self._thread is None:
            self._free()

    def _free(self) -> None:
        with self._lock:
            event_set, self._set = self._set, None
        if event_set is not None:
            try:
                self._lib.nvmlEventSetFree(event_set)
            except Exception:
                pass  # the driver is gone: nothing to free
