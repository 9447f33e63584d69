"""The fast tier stays fast: a test that starts a kernel, node agents, a server or a browser must be marked slow.

The fast tier (``pytest -m "not slow"``) is the development loop; what makes a test slow is starting processes
that take seconds each. The helpers that start them call :func:`starts`, which fails an unmarked test at once,
saying what it started: the mark is then put where it belongs instead of the fast tier growing unnoticed. A
test that is slow for another reason is caught by its duration (``tests/conftest.py``).
"""

from __future__ import annotations

import os

import pytest

_current = {"slow": True}  # outside a test (a helper used from a script), anything may start

# An unmarked test may take this long on an idle machine (NBTRAIN_TEST_FAST_LIMIT overrides it); on a loaded one
# the limit grows with the load, so a busy machine makes no test fail by itself.
FAST_LIMIT_S = float(os.environ.get("NBTRAIN_TEST_FAST_LIMIT", "5"))


def entering(slow: bool) -> None:
    """Called by conftest before each test: whether that test is marked slow."""
    _current["slow"] = slow


def starts(what: str) -> None:
    """Fails the current test unless it is marked slow (helpers call this before starting ``what``)."""
    if not _current["slow"]:
        pytest.fail(f"this test starts {what} but is not marked slow: take a slow fixture, or mark the module "
                    "with `pytestmark = pytest.mark.slow`, so the fast tier (-m \"not slow\") stays fast", pytrace=False)


def load_factor() -> float:
    """The machine's load per core when above 1, else 1: how much longer than on an idle machine work takes now."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def fast_limit() -> float:
    """How long an unmarked test may run now: FAST_LIMIT_S, times the machine's load per core when above 1."""
    return FAST_LIMIT_S * load_factor()
