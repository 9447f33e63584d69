"""Run a function once a module is imported: at once if it is already, else right after its import ends.

A finder at the front of ``sys.meta_path`` answers only for the watched module's name: it finds the real spec
through the other finders and wraps its loader so that, once the module's code has run, the waiting functions get
the module. This is how post-import hooks are usually made (wrapt's, for instance); the module itself is not
changed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable

_waiting: dict[str, list[Callable]] = {}


def after_import(name: str, then: Callable) -> None:
    """``then(module)`` once module ``name`` is imported (now, if it is)."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    if not _waiting:
        sys.meta_path.insert(0, _Watcher())
    if then not in _waiting.setdefault(name, []):
        _waiting[name].append(then)


class _Watcher(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _waiting:
            return None
        sys.meta_path.remove(self)  # the real spec, found by the finders after this one
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, fullname)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        for then in _waiting.pop(self._name, []):
            then(module)
        if not _waiting:
            sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _Watcher)]
