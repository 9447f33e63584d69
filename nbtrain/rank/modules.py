"""The notebook's working directory and modules, rank side (the kernel side is :mod:`nbtrain.kernel.request.notebook_modules`).

**Before each job** (:meth:`LocalModules.enter`): change into the notebook's current directory and make
``sys.path`` the same for a warm rank as for one started now — that directory first (``python -m`` puts
the start-up directory there), then the kernel's ``sys.path`` in its order, so the ranks import what the
notebook imports, then the rank's own start-up entries the kernel lacks (never its start-up directory). Import caches are invalidated, so a module file
created since the last cell is found. This runs before the inputs are unpickled: a module sent by name
is imported from the notebook's directory.

**After each job** (:meth:`LocalModules.stamps`): one stamp — module name, file, mtime in ns, size — per
imported module that lives outside the standard library, site-packages / dist-packages and nbtrain.
A module's stamp is taken the first time it is seen, and again only when it is imported anew (a reload
gives it a new ``__spec__``), so a file edited while the ranks ran still counts as changed. The kernel
compares the stamps with the disk before it sends the next job to these ranks.
"""

from __future__ import annotations

import importlib
import os
import site
import sys
import sysconfig

from ..wire.workdir import rank_sys_path

_NBTRAIN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INSTALLED_DIRS = ("site-packages", "dist-packages")


def _installed_roots() -> tuple[str, ...]:
    """Directories whose modules are the interpreter's or an installed distribution's, not the user's."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(getattr(site, "getsitepackages", list)())
    roots.add(getattr(site, "getusersitepackages", lambda: None)())
    roots.add(_NBTRAIN)
    found = set()
    for root in filter(None, roots):  # not None or ""
        found.add(os.path.abspath(root))
        found.add(os.path.realpath(root))
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in found))


class LocalModules:
    """This rank's view of the notebook's directory and of the user's own modules."""

    def __init__(self) -> None:
        start = os.getcwd()
        self.baseline = tuple(p for i, p in enumerate(sys.path) if not (i == 0 and p in (start, "")))
        self._installed = _installed_roots()
        self._seen: dict[str, tuple[object, tuple | None]] = {}  # name -> (spec or module, stamp or None)

    def enter(self, cwd: str, kernel_path: tuple[str, ...]) -> None:
        """Run the next job in ``cwd`` with the kernel's ``sys.path`` entries too (see the module docstring)."""
        if not cwd:
            return
        os.chdir(cwd)
        sys.path[:] = rank_sys_path(cwd, kernel_path, self.baseline)
        importlib.invalidate_caches()

    def stamps(self) -> tuple[tuple, ...]:
        """``(name, path, mtime_ns, size)`` of every user-local module imported so far."""
        seen: dict[str, tuple[object, tuple | None]] = {}
        for name, module in list(sys.modules.items()):
            try:
                key = getattr(module, "__spec__", None) or module
                cached = self._seen.get(name)
                seen[name] = cached if cached is not None and cached[0] is key else (key, self._stamp(name, module))
            except Exception:  # an odd object in sys.modules (a lazy module that fails to load) is not ours
                continue
        self._seen = seen
        return tuple(stamp for _, stamp in seen.values() if stamp is not None)

    def _stamp(self, name: str, module) -> tuple | None:
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path:
            return None
        path = os.path.abspath(path)
        if self._is_installed(path):
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (name, path, st.st_mtime_ns, st.st_size)

    def _is_installed(self, path: str) -> bool:
        if any(part in _INSTALLED_DIRS for part in path.split(os.sep)):
            return True
        return path.startswith(self._installed) or os.path.realpath(path).startswith(self._installed)
