"""A second, unprivileged Unix user for the attack tests: files planted and processes run as someone else.

Attacks on a shared machine come from another local user, so the tests that perform them run the attacker's
part under a real second account (created with ``useradd`` the first time, as root). Off root the tests that
need it skip, saying why.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

import pytest

NAME = "nbtrain-attacker"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second Unix user needs root (useradd, setuid)")


def attacker() -> pwd.struct_passwd:
    """The attacker's account, created if this machine does not have it yet."""
    try:
        return pwd.getpwnam(NAME)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME], check=True,
                       capture_output=True)
        return pwd.getpwnam(NAME)


def run_as_attacker(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``args`` run as the attacker (no supplementary groups), in ``/`` unless ``cwd`` is given."""
    who = attacker()
    kwargs.setdefault("cwd", "/")
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 60)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", **kwargs.pop("env", {})}
    return subprocess.run(args, user=who.pw_uid, group=who.pw_gid, extra_groups=[], env=env, **kwargs)


def attacker_python() -> str:
    """A Python the attacker can run: the system's (this one may sit in root's private home)."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def python_as_attacker(code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """A standard-library Python snippet run as the attacker (``sys.argv[1:]`` are ``args``)."""
    return run_as_attacker([attacker_python(), "-I", "-c", code, *args], **kwargs)


def plant(path: str, content: bytes = b"", mode: int = 0o644) -> str:
    """A file the attacker creates at ``path`` (in a sticky, world-writable folder such as /tmp)."""
    done = python_as_attacker("import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, "
                              "int(sys.argv[2], 8)); os.write(fd, bytes.fromhex(sys.argv[3])); os.close(fd)",
                              path, oct(mode), content.hex())
    if done.returncode:
        raise RuntimeError(f"the attacker could not create {path}: {done.stderr}")
    return path
