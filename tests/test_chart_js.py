"""The dashboard chart's JavaScript, checked where it lives: its JSDoc types by tsc (labextension/tsconfig.chart.json)
and its data joining, thinning and smoothing by node's own test runner (labextension/chart/test/)."""

from __future__ import annotations

import subprocess

from helpers.chartbuild import ensure_node_modules


def test_the_charts_javascript_type_checks():
    labextension = ensure_node_modules()
    done = subprocess.run(["node", "node_modules/typescript/bin/tsc", "-p", "tsconfig.chart.json"], cwd=labextension,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"tsc found type errors in labextension/chart:\n{done.stdout}{done.stderr}"


def test_the_charts_javascript_tests_pass():
    labextension = ensure_node_modules()
    done = subprocess.run(["node", "--test", "chart/test/"], cwd=labextension, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"node --test chart/test/ failed:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert "# fail 0" in done.stdout and "# pass 0" not in done.stdout
