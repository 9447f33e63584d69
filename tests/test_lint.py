"""Lint and types, checked with every test run: ``ruff check`` and ``mypy`` as pyproject.toml configures them.

Both run from the checkout's root (whatever the current directory) with this interpreter, so they use the
versions the ``test`` extras pin and see the package the tests import. A failure shows the tools' own
report: fix the code, or — where a finding is not worth a change — silence that one line with a narrow
``# noqa: CODE`` / ``# type: ignore[code]`` and a comment saying why.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_tool(module: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed in {sys.prefix}: it comes with the test extras "
                    "(pip install -e '.[test]', or bash scripts/venv.sh)")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


def test_ruff_finds_nothing():
    done = run_tool("ruff", "check", "--output-format", "concise", "--no-fix")
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"


@pytest.mark.slow
def test_mypy_finds_no_type_errors():
    # The paths come from [tool.mypy] files; --config-file makes that table the one used.
    done = run_tool("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-color-output")
    assert done.returncode == 0, f"mypy found type errors:\n{done.stdout}{done.stderr}"
