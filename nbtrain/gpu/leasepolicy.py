"""The administrator's policy for GPU leases on a shared server: at most so many GPUs per user at once.

It is a TOML file, ``/etc/nbtrain/policy.toml`` (``NBTRAIN_POLICY`` names another)::

    max_gpus_per_user = 4
    show_notebooks = false   # others see who holds a GPU, not in which notebook (default: true)

No file, no limit. A file nbtrain cannot use (not TOML, an unknown key, a value that is not a positive whole
number) refuses every run that would lease GPUs, saying what is wrong and where, rather than letting anyone past
a limit the administrator meant to set. The limit is kept by nbtrain's runs among themselves, as the leases are:
a process that ignores nbtrain is not held by it (NVML shows it, and ``--gpus auto`` passes over its GPUs).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass

from nbtrain.common.words import count

DEFAULT_PATH = "/etc/nbtrain/policy.toml"
KEYS = ("max_gpus_per_user", "show_notebooks")


class PolicyError(ValueError):
    """The policy refuses the run, or cannot be read; the message says which, and what to do."""


@dataclass(frozen=True)
class Policy:
    path: str
    max_gpus_per_user: int | None = None  # None: no limit
    show_notebooks: bool = True  # other users see a lease's notebook file name (never its folder)

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
    limit = table.get("max_gpus_per_user")
    if limit is not None and (type(limit) is not int or limit < 1):
        raise PolicyError(f"The GPU policy {path}: max_gpus_per_user must be a whole number of GPUs, 1 or more "
                          f"(got {limit!r}). Ask the administrator to fix it.")
    shown = table.get("show_notebooks", True)
    if type(shown) is not bool:
        raise PolicyError(f"The GPU policy {path}: show_notebooks must be true or false (got {shown!r}). Ask the "
                          "administrator to fix it.")
    return Policy(path, limit, shown)
