"""The administrator's policy for GPU leases on a shared server: GPUs per user, idle release, reserved GPUs.

It is a TOML file, ``/etc/nbtrain/policy.toml`` (``NBTRAIN_POLICY`` names another)::

    max_gpus_per_user = 4
    show_notebooks = false       # others see who holds a GPU, not in which notebook (default: true)
    idle_release_s = 900         # a warm pool with no cell this long gives its GPUs back (the --keep-alive default)
    session_release_s = 7200     # a session idle this long is closed, its GPUs given back (default: never)
    reserved_gpus = [0]          # GPUs only these users get: --gpus auto passes over them, pinning them is refused
    reserved_for = ["teacher"]

No file, no limit. A file nbtrain cannot use (not TOML, an unknown key, a value of the wrong kind) refuses every
run that would lease GPUs, saying what is wrong and where, rather than letting anyone past
a limit the administrator meant to set. The limit is kept by nbtrain's runs among themselves, as the leases are:
a process that ignores nbtrain is not held by it (NVML shows it, and ``--gpus auto`` passes over its GPUs).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass

from nbtrain.common.words import count

DEFAULT_PATH = "/etc/nbtrain/policy.toml"
KEYS = ("max_gpus_per_user", "show_notebooks", "idle_release_s", "session_release_s", "reserved_gpus", "reserved_for")


class PolicyError(ValueError):
    """The policy refuses the run, or cannot be read; the message says which, and what to do."""


@dataclass(frozen=True)
class Policy:
    path: str
    max_gpus_per_user: int | None = None  # None: no limit
    show_notebooks: bool = True  # other users see a lease's notebook file name (never its folder)
    idle_release_s: int | None = None  # the --keep-alive of a cell that gives none (None: nbtrain's default)
    session_release_s: int | None = None  # an idle session is closed after this long (None: only by its user)
    reserved_gpus: tuple[int, ...] = ()
    reserved_for: tuple[str, ...] = ()  # the users who may have the reserved GPUs

    def may_use(self, gpu: int, user: str) -> bool:
        """Whether ``user`` may lease ``gpu``: any GPU but a reserved one, which only its users may."""
        return gpu not in self.reserved_gpus or user in self.reserved_for

    def check(self, asked: int, holding: int) -> None:
        """Raise :class:`PolicyError` unless a user holding ``holding`` GPUs may lease ``asked`` more."""
        limit = self.max_gpus_per_user
        if limit is None or holding + asked <= limit:
            return
        held = f"you hold {count('GPU', holding)} in other runs already and " if holding else ""
        raise PolicyError(f"The administrator's policy ({self.path}) lets each user hold {count('GPU', limit)} at "
                          f"once; {held}this cell asks for {asked}. Ask for fewer"
                          + (", or stop another of your runs (%distributed_shutdown in its notebook)." if holding
                             else "."))


def load(environ=os.environ) -> Policy:
    """The policy in force: the file ``NBTRAIN_POLICY`` names, else :data:`DEFAULT_PATH`; none if it is absent."""
    path = environ.get("NBTRAIN_POLICY") or DEFAULT_PATH
    try:
        with open(path, "rb") as file:
            table = tomllib.load(file)
    except FileNotFoundError:
        return Policy(path)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"The GPU policy {path} cannot be read ({exc}). Ask the administrator to fix it.") from None
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise PolicyError(f"The GPU policy {path} has keys nbtrain does not know ({', '.join(unknown)}); it knows "
                          f"{', '.join(KEYS)}. Ask the administrator to fix it.")
    return Policy(path, _whole(table, "max_gpus_per_user", path), _kind(table, "show_notebooks", bool, path, True),
                  _whole(table, "idle_release_s", path, least=0), _whole(table, "session_release_s", path),
                  tuple(_listed(table, "reserved_gpus", int, path)), tuple(_listed(table, "reserved_for", str, path)))


def _fix(path: str, key: str, wanted: str, value) -> PolicyError:
    return PolicyError(f"The GPU policy {path}: {key} must be {wanted} (got {value!r}). Ask the administrator to fix it.")


def _whole(table: dict, key: str, path: str, least: int = 1) -> int | None:
    value = table.get(key)
    if value is not None and (type(value) is not int or value < least):
        raise _fix(path, key, f"a whole number, {least} or more", value)
    return value


def _kind(table: dict, key: str, kind: type, path: str, default):
    value = table.get(key, default)
    if type(value) is not kind:
        raise _fix(path, key, "true or false" if kind is bool else kind.__name__, value)
    return value


def _listed(table: dict, key: str, kind: type, path: str) -> list:
    value = table.get(key, [])
    if type(value) is not list or any(type(item) is not kind for item in value):
        raise _fix(path, key, "a list of " + ("GPU indices" if kind is int else "user names"), value)
    return value
