"""A detached run's tensors among its results, also as ``results.safetensors`` in the run's folder.

The names a detached cell assigns reach a kernel that attaches in the payload format, as any cell's results do.
Their tensors are also written by rank 0, at the cell's end, into the run's folder as one safetensors file: a
finished run's weights can be read there by any tool (``safetensors.torch.load_file``), without nbtrain and
without unpickling anything. Keys are the names: a tensor ``w`` is ``w``; a module's (or a dict's) entries are
``model.0.weight``; a list's items ``losses.3``. Values that are not tensors are not in the file; a tensor that
shares memory with another (tied weights) is written once per key. The file is written under a temporary name
and renamed into place, readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import torch
from torch import nn

from ..wire.runfolder import RESULTS_FOLDER_ENV

NAME = "results.safetensors"
FOLDER_ENV = RESULTS_FOLDER_ENV  # set by a detached run's agent for its ranks
VISIT_LIMIT = 1_000_000  # values looked at: a long list of numbers is not searched to its end


def write(values: dict, folder: str) -> str:
    """Write the tensors among ``values`` into ``folder``; returns a line for the run's output ("" if none)."""
    tensors = collect(values)
    if not tensors:
        return ""
    try:
        from safetensors.torch import save_file
    except ImportError:
        return (f"nbtrain: the results' tensors are not written as {NAME}: the safetensors package is missing "
                "(pip install nbtrain[safetensors]); they arrive in the notebook all the same")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{NAME}.", dir=folder)  # mode 0600
    except OSError as exc:  # the run's folder removed or full: the names still reach the notebook
        return f"nbtrain: the results' tensors could not be written as {NAME} ({type(exc).__name__}: {exc})"
    os.close(handle)
    try:
        save_file(_unshared(tensors), temporary, metadata={"names": json.dumps(sorted(values))})
        os.replace(temporary, os.path.join(folder, NAME))
    except Exception as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return f"nbtrain: the results' tensors could not be written as {NAME} ({type(exc).__name__}: {exc})"
    return ""


def collect(values: dict) -> dict[str, torch.Tensor]:
    """Every plain dense tensor among ``values``, keyed by its path (see the module docstring), on the CPU."""
    found: dict[str, torch.Tensor] = {}
    pending = [(str(name), value) for name, value in values.items()]
    entered: set[int] = set()  # containers already looked into: a dict that holds itself is entered once
    visited = 0
    while pending and visited < VISIT_LIMIT:
        key, value = pending.pop()
        visited += 1
        if isinstance(value, torch.Tensor):
            tensor = value.detach()
            if type(tensor) is torch.Tensor and tensor.layout is torch.strided:  # not a DTensor, not sparse
                found[key] = tensor.cpu()
            continue
        if id(value) in entered:
            continue
        entered.add(id(value))
        if isinstance(value, nn.Module):
            pending.extend((f"{key}.{name}", tensor) for name, tensor in value.state_dict().items())
        elif isinstance(value, dict):
            pending.extend((f"{key}.{name}", item) for name, item in value.items())
        elif isinstance(value, (list, tuple)):
            pending.extend((f"{key}.{index}", item) for index, item in enumerate(value))
    return found


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor contiguous and with memory of its own: safetensors refuses tensors that share storage."""
    seen: set[int] = set()
    out = {}
    for key, tensor in tensors.items():
        tensor = tensor.contiguous()
        storage = tensor.untyped_storage().data_ptr()
        out[key] = tensor.clone() if storage in seen else tensor
        seen.add(storage)
    return out
