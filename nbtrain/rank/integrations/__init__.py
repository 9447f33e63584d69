"""Training libraries' own loops report to nbtrain: their logged scalars become the cell's series.

Each integration uses its library's public extension point and nothing else: Hugging Face's ``Trainer``
gets a ``TrainerCallback`` (:mod:`nbtrain.rank.integrations.huggingface`), Lightning's ``Trainer`` a ``Callback``
from nbtrain's entry point (:mod:`nbtrain.rank.integrations.lightning`). The library's code is never
patched; a callback is added to the list the library itself reads its default callbacks from, for the
length of a cell, and removed again when the cell ends.

A cell may import the library before or after the cell starts: :func:`scope` registers at once when the
library is already imported, and otherwise waits for its import (:mod:`nbtrain.rank.integrations.imports`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import huggingface, lightning
from .imports import after_import

_INTEGRATIONS = {huggingface.MODULE: huggingface.install}


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """A cell's integrations: each library the cell uses reports to nbtrain until the cell ends."""
    with contextlib.ExitStack() as installed:
        installed.enter_context(lightning.scope())  # Lightning asks for callbacks through its entry point
        for module, install in _INTEGRATIONS.items():
            installed.enter_context(after_import(module, install))
        yield
