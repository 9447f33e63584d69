"""Two checkouts share the cached environment, and each one's commands run its own code.

scripts/venv.sh keeps one environment per dependency spec outside the clone, so a second clone of the same
project reuses it. A second checkout's set-up must not turn the first checkout's kernels, ranks and agents into
the second's code: each checkout's scripts put their own nbtrain first, in the test process and in every
process it starts, and no checkout's set-up re-points the environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # runs the checkouts' own scripts and a pytest of their own

PROBE = '''
import subprocess, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def test_this_process_and_its_children_import_this_checkouts_nbtrain():
    import nbtrain
    assert Path(nbtrain.__file__).resolve().is_relative_to(HERE), nbtrain.__file__
    child = subprocess.run([sys.executable, "-c", "import nbtrain; print(nbtrain.__file__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(child).resolve().is_relative_to(HERE), child
'''


def _checkout(folder: Path) -> Path:
    """A copy of this checkout's scripts, project file and package (its built JavaScript included)."""
    for name in ("scripts", "nbtrain"):
        shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", folder / "pyproject.toml")
    (folder / "tests").mkdir()
    (folder / "tests" / "test_where.py").write_text(PROBE)
    return folder


def _editable_targets(venv: Path) -> dict[str, str]:
    """What the environment's own path files point at (an editable install's target among them)."""
    site = next((venv / "lib").glob("python*/site-packages"))
    return {p.name: p.read_text() for p in site.glob("*.pth")}


def test_a_second_checkouts_setup_leaves_the_first_running_its_own_code(tmp_path):
    first, second = _checkout(tmp_path / "first"), _checkout(tmp_path / "second")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HATCH_JUPYTER_BUILDER_SKIP_NPM"] = "1"  # the copies carry the built JavaScript; no npm here
    venv = Path(subprocess.run(["bash", str(first / "scripts" / "venv.sh")], env=env, capture_output=True,
                               text=True, check=True).stdout.strip())
    before = _editable_targets(venv)
    subprocess.run(["bash", str(second / "scripts" / "venv.sh")], env=env, capture_output=True, check=True)
    assert _editable_targets(venv) == before, "setting up a second checkout re-pointed the shared environment"
    done = subprocess.run(["bash", str(first / "scripts" / "test.sh"), "-q", "-p", "no:cacheprovider",
                           str(first / "tests" / "test_where.py")], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]


def test_the_checkout_under_test_is_the_one_imported():
    import nbtrain

    assert Path(nbtrain.__file__).resolve().is_relative_to(ROOT), (nbtrain.__file__, sys.path[:3])
