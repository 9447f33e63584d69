"""nbtrain's layering, read from its source: kernel side → wire ← rank side (docs/architecture.md).

Every ``import`` in ``nbtrain/**/*.py`` is read with :mod:`ast` — function-level imports too, since a
lazy import is still a dependency — and resolved to the nbtrain module it names. Modules are grouped by
package (``nbtrain/kernel/*`` is ``launch``; a top-level module such as ``kernel/magics.py`` is its own node;
``nbtrain/__init__.py``, the public facade, is ``nbtrain``). The rules:

* no cycle between packages;
* the rank side (``worker``, ``train``) never imports the kernel side (``launch``, ``dashboard``,
  ``server``, ``magics``), nor the kernel side the rank side: what both need lives in ``wire``;
* the node side (``node``: the agent that runs a machine's ranks for a kernel elsewhere) imports neither the
  kernel side nor the rank side, and neither imports it — they meet only in ``wire``;
* ``wire``, the format both sides share, imports neither side;
* inside ``rank/train/`` no two modules import each other, even through others;
* inside ``kernel/`` every module lives in a sub-package, and a sub-package imports only those below it in
  :data:`LAUNCH_LAYERS` (relay → observers → diagnostics → request → ranks → lifecycle).

Each failure names the file, line and import that breaks the rule. The drawing of these layers in
docs/architecture.md is checked to name only modules that exist.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "nbtrain"
KERNEL_SIDE = {"launch", "cluster", "dashboard", "server", "magics"}
RANK_SIDE = {"worker", "train"}
LAUNCH_LAYERS = ("relay", "observers", "diagnostics", "request", "ranks", "lifecycle")  # lowest first
NODE_SIDE = {"node"}  # python -m nbtrain.node: the agent on another machine, between the kernel and its ranks


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported nbtrain module, dotted
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.target}"


def module_name(path: Path) -> str:
    parts = ["nbtrain", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def resolve(dotted: str) -> str:
    """The deepest nbtrain module that ``dotted`` (a module or a name inside one) names."""
    parts = dotted.split(".")
    while parts and not is_module(".".join(parts)):
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    source = module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    rel = str(path.relative_to(ROOT.parent))
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [f"{module}.{alias.name}" for alias in node.names] if module else []
        else:
            continue
        for name in names:
            if name == "nbtrain" or name.startswith("nbtrain."):
                found.append(Import(source, resolve(name), rel, node.lineno))
    return found


def all_imports() -> list[Import]:
    return [imp for path in sorted(ROOT.rglob("*.py")) for imp in imports_of(path)]


def package_of(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "nbtrain"


def package_edges() -> dict[tuple[str, str], list[Import]]:
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in all_imports():
        pair = (package_of(imp.source), package_of(imp.target))
        if pair[0] != pair[1]:
            edges.setdefault(pair, []).append(imp)
    return edges


def find_cycle(edges) -> list[str] | None:
    """One cycle of the directed graph ``edges`` (pairs), as a closed path of nodes, or None."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def explain(cycle: list[str], edges) -> str:
    return "\n".join(f"  {a} → {b}: {edges[(a, b)][0]}" for a, b in zip(cycle, cycle[1:], strict=False))


def test_the_scan_sees_lazy_and_relative_imports(tmp_path):
    found = {(i.source, i.target) for i in all_imports()}
    assert ("nbtrain.kernel.magics", "nbtrain.kernel.lifecycle.entry") in found  # from .launch.lifecycle import entry
    assert ("nbtrain.kernel.dashboard", "nbtrain.common.words") in found  # from .. import words
    assert ("nbtrain", "nbtrain.rank.train.prepare") in found  # inside a function of the facade
    assert find_cycle({("a", "b"), ("b", "c"), ("c", "a")}) == ["a", "b", "c", "a"]
    assert find_cycle({("a", "b"), ("b", "c")}) is None


def test_no_cycle_between_packages():
    edges = package_edges()
    cycle = find_cycle(edges)
    assert cycle is None, f"packages import each other: {' → '.join(cycle)}\n{explain(cycle, edges)}"


def test_rank_side_never_imports_the_kernel_side():
    wrong = [f"{imp} ({package_of(imp.source)} runs in a rank; {package_of(imp.target)} is the kernel's)"
             for (a, b), imps in package_edges().items() if a in RANK_SIDE and b in KERNEL_SIDE for imp in imps]
    assert not wrong, "the rank side imports the kernel side:\n" + "\n".join(wrong)


def test_kernel_side_never_imports_the_rank_side():
    wrong = [f"{imp} ({package_of(imp.source)} runs in the kernel; {package_of(imp.target)} is the ranks'; "
             "put what both need in nbtrain/wire)"
             for (a, b), imps in package_edges().items() if a in KERNEL_SIDE and b in RANK_SIDE for imp in imps]
    assert not wrong, "the kernel side imports the rank side:\n" + "\n".join(wrong)


def test_node_side_is_apart_from_kernel_and_ranks():
    wrong = [f"{imp} ({package_of(imp.source)} and {package_of(imp.target)} run in different processes, on "
             "different machines; they share only nbtrain/wire)"
             for (a, b), imps in package_edges().items()
             if (a in NODE_SIDE and b in KERNEL_SIDE | RANK_SIDE) or (b in NODE_SIDE and a != b) for imp in imps]
    assert not wrong, "the node side is tangled with another side:\n" + "\n".join(wrong)


def test_wire_imports_neither_side():
    wrong = [f"{imp} (wire is shared by both sides; move what it needs into wire)"
             for (a, b), imps in package_edges().items() if a == "wire" and b in KERNEL_SIDE | RANK_SIDE | NODE_SIDE
             for imp in imps]
    assert not wrong, "the wire format depends on one side:\n" + "\n".join(wrong)


def test_no_module_cycle_inside_train():
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in all_imports():
        if imp.source.startswith("nbtrain.rank.train.") and imp.target.startswith("nbtrain.rank.train.") and imp.source != imp.target:
            edges.setdefault((imp.source, imp.target), []).append(imp)
    cycle = find_cycle(edges)
    assert cycle is None, f"train modules import each other: {' → '.join(cycle)}\n{explain(cycle, edges)}"


def test_the_architecture_page_names_modules_that_exist():
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"\b((?:launch|cluster|node|wire|worker|train|dashboard|server|gpu)(?:/[a-z_]+)+\.py)\b", page))
    assert {"wire/protocol.py", "kernel/request/inputs.py", "rank/train/state.py"} <= named
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {', '.join(missing)}"


def launch_layer(dotted: str) -> str:
    """``relay`` for ``nbtrain.kernel.relay.output``; ``""`` for ``nbtrain.kernel`` itself."""
    parts = dotted.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "launch" else ""


def test_launch_is_split_into_its_sub_packages():
    loose = sorted(p.name for p in (ROOT / "launch").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly in nbtrain/kernel/ (put each in the sub-package it belongs to): {loose}"
    subs = sorted(p.name for p in (ROOT / "launch").iterdir() if (p / "__init__.py").is_file())
    assert subs == sorted(LAUNCH_LAYERS)


def test_launch_sub_packages_import_only_those_below():
    wrong = []
    for imp in all_imports():
        source, target = launch_layer(imp.source), launch_layer(imp.target)
        if source and target and LAUNCH_LAYERS.index(target) > LAUNCH_LAYERS.index(source):
            wrong.append(f"{imp} (launch.{source} sits below launch.{target})")
    assert not wrong, "a launch sub-package imports one above it:\n" + "\n".join(wrong)
