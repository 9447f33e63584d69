"""Reading a ``--shard`` checkpoint's DCP folder without unpickling anything but its own layout and plain values.

``torch.distributed.checkpoint``'s file reader unpickles the folder's ``.metadata`` with :func:`pickle.load`
and each non-tensor value (an optimizer's ``lr``, ``betas``, ``step`` counts) with ``torch.load(weights_only=False)``:
whoever could write the folder would run code in every rank that resumes from it. nbtrain reads the folder with
:func:`load`, DCP's own ``load`` given two replacements:

* :class:`_LayoutReader` reads ``.metadata`` with an unpickler that finds only the classes DCP's layout is made
  of (its metadata dataclasses, ``torch.Size``, dtypes and layouts, a path) — anything else is refused before
  it is called;
* :class:`_PlainValuesPlanner` reads each stored value with ``torch.load(weights_only=True)`` where DCP's planner
  would unpickle it with ``weights_only=False``, so only tensors and plain values are read.

Tensors themselves DCP already reads with ``weights_only=True``.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch

METADATA_FILE = ".metadata"  # DCP's name for the folder's layout
_LAYOUT_MODULES = ("torch.distributed.checkpoint.metadata",)
_LAYOUT_CLASSES = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
                   ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "Path"),
                   ("collections", "OrderedDict")}


class UnexpectedContent(pickle.UnpicklingError):
    """A DCP folder holds something that is not DCP's layout or a plain value."""


class _LayoutUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _LAYOUT_MODULES or (module, name) in _LAYOUT_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnexpectedContent(f"{module}.{name} is not part of a checkpoint's layout")


def read_layout(folder: str):
    """The folder's ``.metadata``, unpickled with only DCP's layout classes available."""
    with open(os.path.join(folder, METADATA_FILE), "rb") as file:
        return _LayoutUnpickler(file).load()


def read_checked_layout(folder: str):
    """:func:`read_layout`, its refusal saying which checkpoint it is about."""
    try:
        return read_layout(folder)
    except UnexpectedContent as exc:
        raise _refused(folder, exc) from None


def load(state: dict, folder: str, layout=None) -> None:
    """``dcp.load(state, checkpoint_id=folder)``, reading nothing but the layout, tensors and plain values;
    ``layout``: the folder's, when the caller has read it already."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=_layout_reader(folder, layout), planner=_plain_values_planner())
    except CheckpointException as exc:  # DCP gathers each rank's error: say ours plainly
        refused = [error for error, _ in exc.failures.values() if isinstance(error, UnexpectedContent)]
        if refused:
            raise _refused(folder, refused[0]) from None
        raise


def _refused(folder: str, error: Exception) -> UnexpectedContent:
    return UnexpectedContent(f"the sharded checkpoint {folder} holds what nbtrain does not unpickle (a pickle can run "
                             f"code): {error}")


def _layout_reader(folder: str, layout=None):
    import dataclasses

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _LayoutReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            if kwargs.get("rank") is not None:
                raise UnexpectedContent("a per-rank DCP layout; nbtrain writes one layout per folder")
            read = layout if layout is not None else read_layout(folder)
            meta = dataclasses.replace(read.storage_meta or StorageMeta(), load_id=self.load_id)  # as DCP's reader
            return dataclasses.replace(read, storage_meta=meta)

    return _LayoutReader(folder)


def _plain_values_planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class _PlainValuesPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            try:
                loaded = torch.load(value, weights_only=True)  # refuses any global not a tensor's or a plain value's
            except pickle.UnpicklingError as exc:
                raise UnexpectedContent(f"{read_item.dest_index.fqn} is not a plain value: {exc}") from None
            # where DCP's own load_bytes puts what it unpickles (with weights_only=False: a second, unsafe read)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return _PlainValuesPlanner()
