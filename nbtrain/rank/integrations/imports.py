"""Run a function on a module once it is imported: at once if it already is, otherwise right after its import."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterator

Install = Callable[[types.ModuleType], Callable[[], None]]  # gets the module, returns how to undo it


@contextlib.contextmanager
def after_import(name: str, install: Install) -> Iterator[None]:
    """``install(module)`` when ``name`` is imported (now or later, until the scope ends); undone at the end."""
    undo: list[Callable[[], None]] = []
    finder = _AfterImport(name, lambda module: undo.append(install(module)))
    module = sys.modules.get(name)
    if module is not None:
        undo.append(install(module))
    else:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for step in reversed(undo):
            step()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` as the other finders would, and runs ``then(module)`` once the module has executed."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one import; and the search below must not find this finder again
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader, then: Callable[[types.ModuleType], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.then(module)
