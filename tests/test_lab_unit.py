"""The JupyterLab extension's pure TypeScript — number forms, in-place DOM helpers, the sparkline — unit-tested
by node's own test runner: src/format.ts, dom.ts and sparkline.ts compiled (labextension/tsconfig.unit.json) into
a scratch folder beside labextension/test/*.test.cjs, on a real DOM implementation (linkedom)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers.chartbuild import ensure_node_modules

pytestmark = pytest.mark.slow  # compiles with tsc and runs node: seconds, not the unit loop's milliseconds


def test_the_labs_pure_typescript_passes_its_unit_tests(tmp_path):
    labextension = ensure_node_modules()
    compiled = subprocess.run(["node", "node_modules/typescript/bin/tsc", "-p", "tsconfig.unit.json",
                               "--outDir", str(tmp_path / "src")], cwd=labextension, capture_output=True, text=True,
                              timeout=300)
    assert compiled.returncode == 0, f"tsc -p tsconfig.unit.json failed:\n{compiled.stdout}{compiled.stderr}"
    shutil.copytree(labextension / "test", tmp_path / "test")
    (tmp_path / "node_modules").symlink_to(labextension / "node_modules", target_is_directory=True)
    done = subprocess.run(["node", "--test", "test/"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"node --test failed:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert "# fail 0" in done.stdout and "# pass 0" not in done.stdout, done.stdout[-2000:]
