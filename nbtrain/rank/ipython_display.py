"""IPython's display functions, routed to the cell in a rank.

Without IPython's shell (a rank has none), ``IPython.display.display`` prints the object's repr —
``<IPython.core.display.HTML object>`` on every rank. :func:`route_ipython_display` makes IPython's
``display`` and ``publish_display_data`` those of :mod:`.display` (rank 0's output shown in the cell,
the others' dropped) the moment IPython's ``IPython.core.display_functions`` module is loaded, before any
other module takes names from it: ``from IPython.display import display, HTML`` in a cell, in a module
it imports, or inside a library shows like the cell's own ``display``. Everything IPython defines on
top of them (``HTML(...)``, ``Image(...)``, ``Markdown(...)``, ``display_markdown``, ``DisplayHandle``)
goes through them.

A rank that never imports IPython never loads it: the routing waits on an import hook
(:class:`_RouteOnImport`) installed at the rank's start.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

from . import display

MODULE = "IPython.core.display_functions"
ROUTED = {"display": display.display, "publish_display_data": display.publish_display_data}


def route_ipython_display() -> None:
    """Route IPython's display functions to this rank's: now if IPython is loaded, else when it is."""
    module = sys.modules.get(MODULE)
    if module is not None:
        _route(module)
    elif not any(isinstance(finder, _RouteOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RouteOnImport())


def _route(module: types.ModuleType) -> None:
    for name, function in ROUTED.items():
        setattr(module, name, function)
    for other in ("IPython.display", "IPython.core.display"):  # already took the names (loaded before us)
        loaded = sys.modules.get(other)
        for name, function in ROUTED.items():
            if loaded is not None and hasattr(loaded, name):
                setattr(loaded, name, function)


class _RouteOnImport(importlib.abc.MetaPathFinder):
    """Finds IPython's display functions module as Python would, and routes it once it has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RoutingLoader(spec.loader)
        return spec


class _RoutingLoader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _route(module)

    def __getattr__(self, name):  # get_source, get_filename, …: the real loader's
        return getattr(self._loader, name)
