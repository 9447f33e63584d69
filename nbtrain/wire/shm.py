"""Large tensors and arrays travel through shared memory, once, not once per rank — both ways.

**Inputs (kernel → ranks).** The kernel writes each large CPU tensor's storage (or NumPy array) into its own
file in ``/dev/shm`` and pickles a small handle instead of the bytes. Each rank maps that file
*copy-on-write* (``MAP_PRIVATE``): all ranks read the same physical pages, so four ranks cost one copy,
and a rank that writes into its tensor gets private pages, so ranks never see each other's changes — the
semantics of an ordinary pickled copy, without the copies. Tensors that are views of one storage are
written once and stay views of one storage. The files are removed by the kernel as soon as every rank has
loaded its namespace (a mapping outlives the file's name), and in any case when the run ends.

**Results (rank 0 → kernel).** Rank 0 writes large result tensors the same way, into files named with a
prefix the kernel chose for the job; the kernel maps each one (``MAP_SHARED``: it is then the file's only
user, so this costs no copy and no copy-on-write) and removes its name at once. A result whose storage is
an *unmodified* mapping of an input file (``big.view(-1, 256)`` of a ``big`` that came from the notebook)
is not written at all: rank 0 sends a reference (:class:`InputView`) and the kernel rebuilds the view on
the notebook's original tensor, so such a result shares memory with it. "Unmodified" is read from
``/proc/self/pagemap``: a page a rank wrote to is a private anonymous page, no longer the file's.

**No leaks.** Every file is named ``nbtrain-<kernel pid>-…`` and is registered with its owner *before* it
is created; a write goes in :data:`CHUNK_BYTES` pieces (so the stop button lands promptly) and any
exception, ``KeyboardInterrupt`` included, removes the partial file. When the kernel dies without
cleaning up, its ranks remove its files on their way out (:func:`abandon_and_sweep`) and the next
``%load_ext nbtrain`` removes the files of any dead kernel (:func:`sweep_orphans`).
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass

from ..common.leftovers import my_entries
from ..common.pids import as_pid

SHARE_THRESHOLD_BYTES = 256 * 1024
CHUNK_BYTES = 64 * 1024 * 1024
_NAME = re.compile(r"nbtrain-(\d+)-")
_PAGE = mmap.PAGESIZE
# madvise(MADV_POPULATE_READ): map a range's pages for reading in one call (Linux 5.14; Python names it from 3.12)
_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22 if sys.platform == "linux" else None)

# Held while a file is created and written; a rank whose kernel died takes it for good before sweeping,
# so no file can appear after the sweep. ``_abandoned`` makes a write in progress stop at its next chunk.
_WRITE_LOCK = threading.Lock()
_abandoned = threading.Event()


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def owner_prefix(pid: int | None = None) -> str:
    """Every shared-memory file of the kernel ``pid`` starts with this path."""
    return os.path.join(shm_dir(), f"nbtrain-{os.getpid() if pid is None else pid}-")


def new_result_prefix() -> str:
    """A prefix for one job's result files (written by rank 0, removed by the kernel)."""
    return f"{owner_prefix()}r{secrets.token_hex(4)}-"


@dataclass(frozen=True)
class SharedFile:
    """One file of bytes: an input (mapped copy-on-write by ranks) or a result (mapped once, then removed)."""

    path: str
    nbytes: int
    result: bool = False

    def __reduce__(self):
        return _map_file, (self.path, self.nbytes, self.result)


@dataclass(frozen=True)
class InputView:
    """A result tensor that is an untouched view of an input file: rebuilt on the notebook's original."""

    path: str
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool
    parameter: bool


def _torch():
    import torch

    return torch


def _dtype(name: str):
    return getattr(_torch(), name.split(".", 1)[1])


class SharedArena:
    """The writing side (the kernel for inputs, rank 0 for results): writes files, remembers, removes them.

    ``dry`` arenas only say what they would write (to find which value fails to pickle, cheaply).
    """

    def __init__(self, prefix: str | None = None, *, result: bool = False, dry: bool = False) -> None:
        self.prefix = prefix or owner_prefix()
        self.result, self.dry = result, dry
        self.paths: list[str] = []
        self.written = 0  # bytes written to its files, for the summary (the inputs' share of a run's time)
        self.originals: dict[str, object] = {}  # input path -> the notebook's untyped storage it holds
        self._files: dict[tuple, SharedFile] = {}

    def _write(self, raw: memoryview) -> SharedFile:
        path = f"{self.prefix}{secrets.token_hex(8)}"
        if not self.dry:
            write_file(path, raw, self.paths)
            self.written += raw.nbytes
        return SharedFile(path, raw.nbytes, self.result)

    def share_tensor(self, tensor, *, parameter: bool = False):
        """``(rebuild, args)`` for pickling ``tensor`` (CPU, strided) through a file."""
        torch = _torch()
        storage = tensor.untyped_storage()
        nbytes = tensor.numel() * tensor.element_size()
        key: tuple
        if nbytes and storage.nbytes() <= 2 * nbytes:  # the whole storage: views of it stay views of one file
            key = ("storage", storage.data_ptr(), storage.nbytes())
            if key not in self._files:
                whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
                self._files[key] = self._write(memoryview(whole.numpy()))
                if not self.result:
                    self.originals[self._files[key].path] = storage
            offset, stride = tensor.storage_offset(), tuple(tensor.stride())
        else:  # a small view of a big storage: only its own bytes
            key = ("view", tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), str(tensor.dtype))
            if key not in self._files:
                flat = tensor.detach().contiguous().reshape(-1)
                raw = memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
                self._files[key] = self._write(raw)
            offset, stride = 0, tuple(torch.empty(tensor.shape, device="meta").stride())
        return _tensor_on, (self._files[key], offset, tuple(tensor.shape), stride, str(tensor.dtype),
                            tensor.requires_grad, parameter)

    def share_array(self, array):
        import numpy as np

        contiguous = np.ascontiguousarray(array)
        shared = self._write(contiguous.reshape(-1).view(np.uint8).data)
        return _array_on, (shared, contiguous.dtype.str, tuple(contiguous.shape))

    def unlink(self) -> None:
        """Remove the files' names; whoever mapped them keeps the mappings."""
        for path in self.paths:
            _remove(path)
        self.paths.clear()

    close = unlink


def write_file(path: str, raw: memoryview, registry: list[str]) -> None:
    """Create ``path`` (0600, O_EXCL) with ``raw``'s bytes; registered in ``registry`` before it exists,
    removed again if anything — KeyboardInterrupt too — stops the write."""
    view = raw.cast("B")
    with _WRITE_LOCK:
        if _abandoned.is_set():
            raise OSError("nbtrain: the kernel is gone; not writing shared memory")
        registry.append(path)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            try:
                for start in range(0, len(view), CHUNK_BYTES):
                    chunk = view[start:start + CHUNK_BYTES]
                    while len(chunk):
                        chunk = chunk[os.write(fd, chunk):]
                    if _abandoned.is_set():
                        raise OSError("nbtrain: the kernel is gone; not writing shared memory")
            finally:
                os.close(fd)
        except BaseException:
            _remove(path)
            registry.remove(path)
            raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ------------------------------------------------------------------------------------ the reading side

# Input files this process (a rank) has mapped for the current job: (start address, end, path, mmap ref).
_mapped_inputs: list[tuple[int, int, str, weakref.ref]] = []


def begin_inputs() -> None:
    """A new job: forget the previous job's input mappings (their files are not the kernel's any more)."""
    _mapped_inputs.clear()


def node_path(path: str) -> str:
    """Where an input file is on this machine: on a node, its agent wrote the kernel's files under its own prefix
    (``NBTRAIN_SHM_REMAP=<kernel prefix>=<node prefix>``); elsewhere the path itself."""
    old, _, new = os.environ.get("NBTRAIN_SHM_REMAP", "").partition("=")
    return new + path[len(old):] if old and new and path.startswith(old) else path


def _map_file(path: str, nbytes: int, result: bool):
    """An untyped storage over the file's bytes: copy-on-write for inputs; shared and unlinked for results."""
    torch = _torch()
    if nbytes == 0:
        if result:
            _remove(path)
        return torch.UntypedStorage(0)
    fd = os.open(path if result else node_path(path), os.O_RDWR if result else os.O_RDONLY)
    try:
        flags = mmap.MAP_SHARED if result else mmap.MAP_PRIVATE
        buffer = mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
        if result:
            _remove(path)  # the mapping is now the bytes' only owner
    if not result:
        _read_in(buffer)
    bytes_ = torch.frombuffer(buffer, dtype=torch.uint8)
    if not result:
        start = bytes_.data_ptr()
        _mapped_inputs.append((start, start + nbytes, path, weakref.ref(buffer)))
    return bytes_.untyped_storage()


def _read_in(buffer: mmap.mmap) -> None:
    """Map every page of an input file now, for reading: the pages stay the file's (a read copies nothing), and
    their cost — the inputs' transfer into this rank — is paid while the job's names arrive, not in the cell's
    first step, where the cold start's split would count it."""
    if _POPULATE_READ is not None:
        try:
            buffer.madvise(_POPULATE_READ)
            return
        except OSError:  # a kernel before 5.14, or a sandbox without it: touch a byte of each page instead
            pass
    with memoryview(buffer) as whole, whole[::_PAGE] as pages:
        pages.tobytes()


def _tensor_on(storage, storage_offset, shape, stride, dtype, requires_grad, parameter):
    """``storage`` is what a :class:`SharedFile` unpickles to: one mapping, shared by every view of it."""
    tensor = _torch().empty(0, dtype=_dtype(dtype)).set_(storage, storage_offset, shape, stride)
    return _finish(tensor, requires_grad, parameter)


def _finish(tensor, requires_grad: bool, parameter: bool):
    if parameter:
        return _torch().nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(True) if requires_grad else tensor


def _array_on(storage, dtype: str, shape):
    import numpy as np

    data = _torch().empty(0, dtype=_torch().uint8).set_(storage).numpy()
    return data.view(np.dtype(dtype)).reshape(shape)


def input_view(tensor) -> InputView | None:
    """On a rank: an :class:`InputView` if ``tensor`` lies in an input file's mapping it never wrote to."""
    storage_ptr = tensor.untyped_storage().data_ptr()
    for start, end, path, alive in _mapped_inputs:
        if start <= storage_ptr < end and alive() is not None:
            byte_offset = tensor.data_ptr() - start
            if byte_offset % tensor.element_size() or not _untouched(tensor):
                return None
            torch = _torch()
            return InputView(path, byte_offset // tensor.element_size(), tuple(tensor.shape), tuple(tensor.stride()),
                             str(tensor.dtype), tensor.requires_grad, isinstance(tensor, torch.nn.Parameter))
    return None


def _untouched(tensor) -> bool:
    """No page under ``tensor`` became private (written to) — read from /proc/self/pagemap."""
    if tensor.numel() == 0:
        return True
    extent = sum((size - 1) * step for size, step in zip(tensor.shape, tensor.stride(), strict=True)) + 1
    first = tensor.data_ptr() // _PAGE
    last = (tensor.data_ptr() + extent * tensor.element_size() - 1) // _PAGE
    import numpy as np

    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            pagemap.seek(first * 8)
            data = pagemap.read((last + 1 - first) * 8)
    except OSError:
        return False
    if len(data) < (last + 1 - first) * 8:
        return False
    entries = np.frombuffer(data, dtype=np.uint64)
    present, swapped, file_page = (entries >> np.uint64(b) & np.uint64(1) for b in (63, 62, 61))
    # a written page of a private file mapping is an anonymous page: present and not a file page, or swapped
    return not bool(((present == 1) & (file_page == 0)).any() or swapped.any())


def rebuild_input_view(ref: InputView, originals: dict):
    """In the kernel: ``ref`` as a view of the notebook's original tensor (they share memory)."""
    storage = originals.get(ref.path)
    if storage is None:
        raise ValueError("it refers to an input the kernel no longer holds")
    tensor = _torch().empty(0, dtype=_dtype(ref.dtype)).set_(storage, ref.storage_offset, ref.shape, ref.stride)
    return _finish(tensor.detach(), ref.requires_grad, ref.parameter)


# ------------------------------------------------------------------------------------------- sweeping


def sweep_prefix(prefix: str) -> int:
    """Remove this user's files whose path starts with ``prefix``; how many were removed."""
    folder, start = os.path.split(prefix)
    return sum(_unlink(path) for path, _ in my_entries(folder, re.compile(re.escape(start))))


def abandon_and_sweep(kernel_pid: int, wait_s: float = 5.0) -> None:
    """On a rank whose kernel is gone: stop writing for good, then remove the kernel's files."""
    _abandoned.set()
    _WRITE_LOCK.acquire(timeout=wait_s)  # never released: the process is about to end
    sweep_prefix(owner_prefix(kernel_pid))


def sweep_orphans() -> int:
    """Remove this user's shared-memory files of kernels that are no longer running; how many were removed."""
    removed = 0
    for path, match in my_entries(shm_dir(), _NAME):  # /dev/shm is shared: another user's file (planted or not) is theirs
        pid = as_pid(match.group(1))
        if pid != os.getpid() and not _kernel_alive(pid, path):
            removed += _unlink(path)
    return removed


def _kernel_alive(pid: int | None, path: str) -> bool:
    """Whether the kernel ``pid`` that named ``path`` still runs: not a zombie, nor a later process that reuses
    its pid (started after the file was written). A name with no pid in it has no kernel."""
    import psutil

    if pid is None:
        return False
    try:
        written = os.lstat(path).st_mtime
        owner = psutil.Process(pid)
        return owner.status() != psutil.STATUS_ZOMBIE and owner.create_time() <= written + 1
    except psutil.NoSuchProcess:
        return False
    except (OSError, psutil.Error):
        return True  # cannot tell: leave the file to a later sweep


def _unlink(path: str) -> bool:
    """Whether ``path`` went: one that cannot be removed (a folder of that name, …) leaves the others to sweep."""
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


__all__ = ["SHARE_THRESHOLD_BYTES", "SharedArena", "SharedFile", "InputView", "owner_prefix", "new_result_prefix",
           "sweep_prefix", "sweep_orphans", "abandon_and_sweep", "input_view", "rebuild_input_view", "begin_inputs"]
