"""The dashboard chart's JavaScript bundle, rebuilt when its sources changed, so no test runs yesterday's chart.

The bundle (``nbtrain/kernel/dashboard/static/chart.js``, git-ignored) is made by ``jlpm build:chart`` in
``labextension/`` (esbuild: ``labextension/chart/*.js`` and uPlot from npm). :func:`ensure_chart_bundle`
compares its time with its sources' and, when it is missing or older, installs the npm packages if they
are absent and rebuilds it (a fraction of a second). An installed nbtrain (a wheel, no ``labextension/``
beside it) carries its bundle and is left alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def _jlpm() -> str:
    found = shutil.which("jlpm", path=str(Path(sys.executable).parent)) or shutil.which("jlpm")
    if found is None:
        raise RuntimeError("jlpm (JupyterLab's yarn) is needed to build the dashboard's chart: pip install jupyterlab")
    return found


def chart_sources(checkout: Path) -> list[Path]:
    sources = checkout / "labextension"
    return sorted((sources / "chart").glob("*.js")) + [sources / "package.json"]


def ensure_chart_bundle() -> Path:
    """The bundle the imported nbtrain serves, rebuilt first if older than its sources."""
    from nbtrain.kernel.dashboard.chart import BUNDLE

    checkout = BUNDLE.resolve().parents[4]
    labextension = checkout / "labextension"
    if not (labextension / "chart").is_dir():
        return BUNDLE  # an installed nbtrain: its bundle came with the wheel
    newest = max(p.stat().st_mtime for p in chart_sources(checkout))
    if BUNDLE.exists() and BUNDLE.stat().st_mtime >= newest:
        return BUNDLE
    ensure_node_modules(labextension)
    done = subprocess.run([_jlpm(), "build:chart"], cwd=labextension, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"jlpm build:chart failed in {labextension}:\n{done.stdout}\n{done.stderr}")
    return BUNDLE


def ensure_node_modules(labextension: Path = CHECKOUT / "labextension") -> Path:
    """``labextension/`` with its npm packages installed (esbuild, typescript, uPlot, linkedom, …): installed again
    when one that package.json names is missing (a checkout whose node_modules predates a new one)."""
    spec = json.loads((labextension / "package.json").read_text())
    wanted = {**spec.get("dependencies", {}), **spec.get("devDependencies", {})}
    if not all((labextension / "node_modules" / name).is_dir() for name in wanted):
        subprocess.run([_jlpm(), "install"], cwd=labextension, check=True, capture_output=True)
    return labextension


def node_join(pairs: list[tuple[dict | None, dict]]) -> list[dict]:
    """The chart's own ``joinSeries`` (labextension/chart/data.js) run by node over ``(base, tail)`` pairs whose
    columns are lists of floats: the series the browser would draw after each."""
    ensure_node_modules()
    lines = "".join(json.dumps(pair) + "\n" for pair in pairs)
    done = subprocess.run(["node", str(Path(__file__).with_name("join_series.mjs"))], input=lines,
                          capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"node could not join the series:\n{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines()]
