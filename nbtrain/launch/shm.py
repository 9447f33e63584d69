"""Large tensors and arrays travel to the ranks through shared memory, once, not once per rank.

The kernel writes each large CPU tensor (or NumPy array) into its own file in ``/dev/shm`` and pickles a
small :class:`SharedBlock` handle instead of the bytes. Each rank maps that file *copy-on-write*
(``MAP_PRIVATE``): all ranks read the same physical pages, so four ranks cost one copy, and a rank that
writes into its tensor gets private pages, so ranks never see each other's changes — the same semantics
as an ordinary pickled copy, without the copies.

The files are removed by the kernel as soon as every rank has loaded its namespace (a mapping outlives
the file's name), and in any case when the run ends (:meth:`SharedArena.close`).
"""

from __future__ import annotations

import mmap
import os
import secrets
import tempfile
from dataclasses import dataclass

SHARE_THRESHOLD_BYTES = 256 * 1024


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


@dataclass(frozen=True)
class SharedBlock:
    """Where a rank finds a tensor's bytes, and how to view them."""

    path: str
    nbytes: int
    dtype: str  # "torch.float32" or a NumPy dtype string
    shape: tuple[int, ...]
    kind: str  # "torch" or "numpy"
    requires_grad: bool = False
    parameter: bool = False


class SharedArena:
    """The kernel side: writes blocks, remembers them, removes them."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._by_storage: dict[tuple[int, int, tuple, str], SharedBlock] = {}
        self.bytes_shared = 0

    def _write(self, raw: memoryview) -> str:
        path = os.path.join(_shm_dir(), f"nbtrain-{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            view = raw.cast("B")
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
        finally:
            os.close(fd)
        self.paths.append(path)
        self.bytes_shared += raw.nbytes
        return path

    def share_tensor(self, tensor, *, parameter: bool = False) -> SharedBlock:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.stride()), str(tensor.dtype))
        cached = self._by_storage.get(key)
        if cached is not None and cached.shape == tuple(tensor.shape):
            return SharedBlock(**{**cached.__dict__, "requires_grad": tensor.requires_grad, "parameter": parameter})
        flat = tensor.detach().contiguous().reshape(-1)
        # A byte view of any dtype (bf16, bool, ...) without a copy.
        raw = memoryview(flat.view(-1).view(dtype=_torch().uint8).numpy()) if flat.numel() else memoryview(b"")
        block = SharedBlock(self._write(raw), flat.numel() * flat.element_size(), str(tensor.dtype),
                            tuple(tensor.shape), "torch", tensor.requires_grad, parameter)
        self._by_storage[key] = block
        return block

    def share_array(self, array) -> SharedBlock:
        import numpy as np

        contiguous = np.ascontiguousarray(array)
        path = self._write(memoryview(contiguous.reshape(-1).view(np.uint8)))
        return SharedBlock(path, contiguous.nbytes, contiguous.dtype.str, tuple(contiguous.shape), "numpy")

    def unlink(self) -> None:
        """Remove the files' names; ranks that mapped them keep their mappings."""
        for path in self.paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.paths.clear()

    close = unlink


def _torch():
    import torch

    return torch


def load_block(block: SharedBlock):
    """The rank side: map the block copy-on-write and rebuild the tensor or array around it."""
    if block.nbytes == 0:
        buffer = bytearray()
    else:
        fd = os.open(block.path, os.O_RDONLY)
        try:
            buffer = mmap.mmap(fd, block.nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    if block.kind == "numpy":
        import numpy as np

        return np.frombuffer(buffer, dtype=np.dtype(block.dtype)).reshape(block.shape)
    torch = _torch()
    dtype = getattr(torch, block.dtype.split(".", 1)[1])
    if block.nbytes == 0:
        tensor = torch.empty(block.shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(block.shape)
    if block.parameter:
        return torch.nn.Parameter(tensor, requires_grad=block.requires_grad)
    return tensor.requires_grad_(block.requires_grad) if block.requires_grad else tensor
