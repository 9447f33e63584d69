"""nbtrain's layering, read from its source: one package per process, and what processes share (docs/architecture.md).

Every ``import`` in ``nbtrain/**/*.py`` is read with :mod:`ast` — function-level imports too, since a
lazy import is still a dependency — and resolved to the nbtrain module it names. The first folder under
``nbtrain/`` says which process a module runs in:

* ``kernel`` — the notebook's kernel: the magics, the request, the ranks' group, a run, the dashboard, several
  machines' hub; ``rank`` — one rank's process (and ``rank/train``, the cell's training helpers);
  ``node`` — the agent that runs a machine's ranks for a kernel elsewhere; ``server`` — the Jupyter server's
  extension behind the lab's panel;
* ``wire`` (what processes must agree on: messages, payloads, options), ``gpu`` (NVML) and ``common`` (small
  helpers) are shared, and import no process's package; ``nbtrain/__init__.py`` is the public facade.

The rules:

* no cycle between packages;
* no process's package imports another's — they meet only in the shared packages — except that the server reads
  the run records the kernel writes through :data:`SERVER_READS`, and the agent of a detached run on several
  machines drives its nodes with the kernel's modules in :data:`RELAY_DRIVES`;
* inside ``rank/train/`` no two modules import each other, even through others;
* inside ``kernel/`` every module but ``magics.py`` lives in a sub-package, and a sub-package imports only those
  below it in :data:`KERNEL_LAYERS`;
* no two modules share a file name, but each process's ``main.py``/``__main__.py``: one name, one job.

Each failure names the file, line and import that breaks the rule. docs/architecture.md's tables name every
module, and only modules that exist.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "nbtrain"
PROCESSES = {"kernel", "rank", "node", "server"}  # the first folder under nbtrain/: the process a module runs in
SHARED = {"wire", "gpu", "common"}
KERNEL_LAYERS = ("relay", "observers", "diagnostics", "ranks", "request", "lifecycle", "cluster", "dashboard",
                 "background", "magics")  # lowest first
SERVER_READS = {"nbtrain.kernel.observers.events", "nbtrain.kernel.observers.registry"}  # the run records the kernel writes
SAME_NAME_ALLOWED = {"__init__.py", "__main__.py", "main.py"}
# the agent of a --detach --nodes run stands in for the kernel before its nodes: it drives them with the kernel's own
# NodePool (node/relay.py), not a second copy of it
RELAY_DRIVES = {"nbtrain.kernel.cluster.group", "nbtrain.kernel.cluster.hub", "nbtrain.kernel.cluster.slurm",
                "nbtrain.kernel.cluster.ssh", "nbtrain.kernel.ranks.pool", "nbtrain.kernel.ranks.spec"}


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
    assert ("nbtrain.kernel.magics", "nbtrain.kernel.lifecycle.entry") in found  # from .lifecycle import entry
    assert ("nbtrain.kernel.dashboard", "nbtrain.common.words") in found  # from ...common import words
    assert ("nbtrain", "nbtrain.rank.train.prepare") in found  # inside a function of the facade
    assert find_cycle({("a", "b"), ("b", "c"), ("c", "a")}) == ["a", "b", "c", "a"]
    assert find_cycle({("a", "b"), ("b", "c")}) is None


def test_no_cycle_between_packages():
    edges = package_edges()
    cycle = find_cycle(edges)
    assert cycle is None, f"packages import each other: {' → '.join(cycle)}\n{explain(cycle, edges)}"


def test_no_process_imports_another_process():
    wrong = [f"{imp} ({package_of(imp.source)} and {package_of(imp.target)} run in different processes; what both "
             "need belongs in nbtrain/wire, nbtrain/gpu or nbtrain/common)"
             for (a, b), imps in package_edges().items() if a in PROCESSES and b in PROCESSES for imp in imps
             if not (a == "server" and imp.target in SERVER_READS)
             and not (imp.source == "nbtrain.node.relay" and imp.target in RELAY_DRIVES)]
    assert not wrong, "a process imports another's package:\n" + "\n".join(wrong)


def test_shared_packages_import_no_process():
    wrong = [f"{imp} ({package_of(imp.source)} is shared by every process; move what it needs into it)"
             for (a, b), imps in package_edges().items() if a in SHARED and b in PROCESSES for imp in imps]
    assert not wrong, "a shared package depends on one process:\n" + "\n".join(wrong)


def test_every_module_is_in_a_process_or_a_shared_package():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly in nbtrain/ (put each under the process it runs in, or common/): {loose}"
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(PROCESSES | SHARED)


def test_no_two_modules_share_a_name():
    seen: dict[str, list[str]] = {}
    for path in ROOT.rglob("*.py"):
        if path.name not in SAME_NAME_ALLOWED:
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, f"modules with the same name (give each a name for its own job): {twice}"


def test_no_module_cycle_inside_train():
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in all_imports():
        if imp.source.startswith("nbtrain.rank.train.") and imp.target.startswith("nbtrain.rank.train.") and imp.source != imp.target:
            edges.setdefault((imp.source, imp.target), []).append(imp)
    cycle = find_cycle(edges)
    assert cycle is None, f"train modules import each other: {' → '.join(cycle)}\n{explain(cycle, edges)}"


def named_in_architecture_page() -> set[str]:
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    return set(re.findall(r"\b((?:kernel|rank|node|server|wire|gpu|common)(?:/[a-z_]+)*/[a-z_]+\.py)\b", page))


def test_the_architecture_page_names_modules_that_exist():
    named = named_in_architecture_page()
    assert {"wire/protocol.py", "kernel/request/inputs.py", "rank/train/state.py"} <= named
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {', '.join(missing)}"


def test_the_architecture_page_names_every_module():
    named = named_in_architecture_page()
    modules = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if p.name != "__init__.py"}
    unnamed = sorted(modules - named)
    assert not unnamed, f"docs/architecture.md's tables do not name: {', '.join(unnamed)} (add a row each)"


def kernel_layer(dotted: str) -> str:
    """``relay`` for ``nbtrain.kernel.relay.output``, ``magics`` for ``nbtrain.kernel.magics``; ``""`` outside."""
    parts = dotted.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "kernel" else ""


def test_the_kernel_is_split_into_its_sub_packages():
    loose = sorted(p.stem for p in (ROOT / "kernel").glob("*.py") if p.name != "__init__.py")
    assert loose == ["magics"], f"modules directly in nbtrain/kernel/ (put each in its sub-package): {loose}"
    subs = sorted(p.name for p in (ROOT / "kernel").iterdir() if (p / "__init__.py").is_file())
    assert subs == sorted(set(KERNEL_LAYERS) - {"magics"})


def test_kernel_sub_packages_import_only_those_below():
    wrong = []
    for imp in all_imports():
        source, target = kernel_layer(imp.source), kernel_layer(imp.target)
        if source and target and KERNEL_LAYERS.index(target) > KERNEL_LAYERS.index(source):
            wrong.append(f"{imp} (kernel.{source} sits below kernel.{target})")
    assert not wrong, "a kernel sub-package imports one above it:\n" + "\n".join(wrong)
