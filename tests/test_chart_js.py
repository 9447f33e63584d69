"""The dashboard chart's JavaScript, checked where it lives: its JSDoc types by tsc (labextension/tsconfig.chart.json)
and its data joining, thinning and smoothing by node's own test runner (labextension/chart/test/)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers.chartbuild import ensure_node_modules

INJECTED = '\n/** @type {number} */\nexport const nbtInjected = "not a number";\n'


def _tsc(labextension: Path, config: str) -> subprocess.CompletedProcess:
    return subprocess.run(["node", str(labextension / "node_modules/typescript/bin/tsc"), "-p", config],
                          cwd=labextension, capture_output=True, text=True, timeout=300)


def test_the_charts_javascript_type_checks():
    labextension = ensure_node_modules()
    done = _tsc(labextension, "tsconfig.chart.json")
    assert done.returncode == 0, f"tsc found type errors in labextension/chart:\n{done.stdout}{done.stderr}"


@pytest.mark.slow  # a second whole type check
def test_a_type_error_in_any_chart_file_fails_the_check():
    labextension = ensure_node_modules()
    sources = sorted((labextension / "chart").glob("*.js"))
    assert all(p.read_text().startswith("// @ts-check") for p in sources), "every chart file starts with // @ts-check"
    # A copy inside labextension/ (so its node_modules resolve), each file with a wrong type added at its end.
    scratch = Path(tempfile.mkdtemp(prefix=".typecheck-", dir=labextension))
    try:
        shutil.copytree(labextension / "chart", scratch / "chart")
        for path in (scratch / "chart").glob("*.js"):
            path.write_text(path.read_text() + INJECTED)
        config = json.loads((labextension / "tsconfig.chart.json").read_text())
        (scratch / "tsconfig.json").write_text(json.dumps({"extends": "../tsconfig.chart.json",
                                                           "include": config["include"]}))
        done = _tsc(labextension, str(scratch / "tsconfig.json"))
    finally:
        shutil.rmtree(scratch)
    assert done.returncode != 0
    flagged = {line.split("(")[0].split("/")[-1] for line in done.stdout.splitlines() if "error TS2322" in line}
    assert flagged == {p.name for p in sources}, done.stdout


def test_the_charts_javascript_tests_pass():
    labextension = ensure_node_modules()
    done = subprocess.run(["node", "--test", "chart/test/"], cwd=labextension, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"node --test chart/test/ failed:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert "# fail 0" in done.stdout and "# pass 0" not in done.stdout
