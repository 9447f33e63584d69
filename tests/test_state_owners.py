"""State is written by its owner: no module assigns attributes of an object whose class another module defines.

Every assignment ``X.attr = …`` in ``nbtrain/**/*.py`` whose target is not the method's own ``self.attr`` is read
with :mod:`ast`. It passes when ``attr`` belongs to a class of the same module (declared in the class body or
assigned as ``self.attr`` in one of its methods): that module owns the object and changes it in place. Writes
to objects that are not nbtrain's — the interpreter's hooks, IPython's, torch's, ipywidgets' traits, an SSL
context being configured — are listed in :data:`NOT_NBTRAINS` with why; an nbtrain object is changed through
a method of its owner instead (``context.count_step()``, ``outcome.record(history)``, ``hub.mark_running(node)``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nbtrain"

# (file, target) -> why the object written is not one nbtrain owns elsewhere
NOT_NBTRAINS = {
    ("nbtrain/__init__.py", "ipython._nbtrain_magics"): "the magics of one IPython shell, kept on that shell",
    ("nbtrain/kernel/cluster/tls.py", "context.minimum_version"): "an ssl.SSLContext being configured",
    ("nbtrain/wire/link.py", "context.check_hostname"): "an ssl.SSLContext being configured",
    ("nbtrain/wire/link.py", "context.verify_mode"): "an ssl.SSLContext being configured",
    ("nbtrain/wire/link.py", "context.minimum_version"): "an ssl.SSLContext being configured",
    ("nbtrain/kernel/lifecycle/entry.py", "exc.with_traceback(None)._render_traceback_"): "IPython's hook on an exception",
    ("nbtrain/kernel/lifecycle/run.py", "exc.with_traceback(None)._render_traceback_"): "IPython's hook on an exception",
    **{("nbtrain/gpu/gpm.py", f"request.{field}"): "NVML's c_nvmlGpmMetricsGet_t being filled in for its call"
       for field in ("version", "numMetrics", "sample1", "sample2", "metrics[position].metricId")},
    ("nbtrain/kernel/lifecycle/pools.py", "self._idle_timer.daemon"): "a threading.Timer before it starts",
    ("nbtrain/kernel/lifecycle/pools.py", "timer.daemon"): "a threading.Timer before it starts",
    ("nbtrain/kernel/observers/events.py", "forward.__name__"): "a function's own metadata (as functools.wraps)",
    ("nbtrain/kernel/observers/events.py", "forward.__qualname__"): "a function's own metadata (as functools.wraps)",
    ("nbtrain/rank/cellcode.py", "sys.displayhook"): "the interpreter's hook, set for the cell and restored",
    ("nbtrain/rank/cellcode.py", "warnings.formatwarning"): "the interpreter's hook, set for the cell and restored",
    ("nbtrain/rank/main.py", "sys.stdin"): "the rank process's own stdin",
    ("nbtrain/rank/zygote.py", "sys.argv"): "a rank forked from the zygote: its own command line, as a spawned one's",
    ("nbtrain/rank/prompts.py", "builtins.input"): "the interpreter's hook, set for the cell and restored",
    ("nbtrain/rank/prompts.py", "sys.stdin"): "the interpreter's hook, set for the cell and restored",
    ("nbtrain/rank/prompts.py", "sys.breakpointhook"): "the interpreter's hook, set for the cell and restored",
    ("nbtrain/rank/train/ft.py", "tm.ManagerServer"): "torchft's module, its server class swapped while one Manager is built",
    ("nbtrain/rank/train/ft.py", "quiet.propagate"): "torchft's logging.Logger, kept out of the cell in a rank",
    ("nbtrain/rank/train/ft.py", "backend._set_sequence_number_for_group"): "torch's process-group class: a no-op that "
    "warns, made a quiet one in a rank",
    ("nbtrain/rank/compat.py", "module.init_process_group"): "torch.distributed's functions, wrapped for pasted scripts",
    ("nbtrain/rank/compat.py", "module.destroy_process_group"): "torch.distributed's functions, wrapped for pasted scripts",
    ("nbtrain/rank/ipython_display.py", "spec.loader"): "an importlib ModuleSpec being built",
    ("nbtrain/rank/integrations/imports.py", "spec.loader"): "an importlib ModuleSpec being found (a post-import hook)",
    ("nbtrain/rank/train/optim.py", "self.optimizer.param_groups"): "the wrapped torch optimizer, through its wrapper",
    ("nbtrain/rank/train/optim.py", "self.optimizer.state"): "the wrapped torch optimizer, through its wrapper",
    ("nbtrain/rank/train/optim.py", "self.optimizer.defaults"): "the wrapped torch optimizer, through its wrapper",
    ("nbtrain/rank/train/optim.py", "opt._opt_called"): "torch's LR scheduler flag, set as its own step wrapper does",
    ("nbtrain/rank/train/optim.py", "step_noting_the_call._wrapped_by_lr_sched"): "torch's LR scheduler marker",
    ("nbtrain/rank/train/optim.py", "optimizer.step"): "torch's LR scheduler wraps step() the same way",
    ("nbtrain/rank/train/prepare.py", "wrapped._nbtrain_context"): "a tag on the torch module prepare() returns",
    ("nbtrain/rank/train/prepare.py", "wrapped._nbtrain_speed"): "a tag on the torch module prepare() returns",
    ("nbtrain/rank/train/speed.py", "model._compiled_call_impl"): "torch.nn.Module.compile()'s own slot",
    ("nbtrain/rank/train/data.py", "self.sampler.skip"): "the resumable sampler the prepared loader built (data.py's)",
    ("nbtrain/server/__init__.py", "manager.untracked_message_types"): "the Jupyter server's configurable list, extended",
    ("nbtrain/kernel/dashboard/kernel_status.py", "kernel._publish_status"): "ipykernel's status publisher, wrapped once",
}
WIDGET_TRAITS = ("self.widget.", "self.status.", "self.stop_button.")  # ipywidgets: traits are set to redraw
WIDGET_FILES = "nbtrain/kernel/dashboard/"


def owned_attributes(tree: ast.Module) -> set[str]:
    """Attributes that classes of this module declare: class-body names and ``self.X`` assignments."""
    owned: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        owned.update(t.id for node in cls.body for t in _targets(node) if isinstance(t, ast.Name))
        for node in ast.walk(cls):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                owned.add(node.target.id)
            for target in _targets(node):
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self":
                    owned.add(target.attr)
    return owned


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    else:
        return []
    return [e for t in found for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def foreign_writes() -> list[str]:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(), rel)
        owned = owned_attributes(tree)
        for node in ast.walk(tree):
            for target in _targets(node):
                if not isinstance(target, ast.Attribute):
                    continue
                text = ast.unparse(target)
                if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"):
                    continue
                if target.attr in owned or (rel, text) in NOT_NBTRAINS:
                    continue
                if rel.startswith(WIDGET_FILES) and text.startswith(WIDGET_TRAITS):
                    continue
                wrong.append(f"{rel}:{target.lineno} assigns {text}")
    return wrong


def test_no_module_writes_the_attributes_of_another_modules_objects():
    wrong = foreign_writes()
    assert not wrong, ("these change an object another module owns; add a method to its class and call that "
                       "(or, for an object that is not nbtrain's, list it in NOT_NBTRAINS with why):\n" + "\n".join(wrong))


def test_the_scan_finds_a_foreign_write(tmp_path):
    tree = ast.parse("class Mine:\n    def __init__(self):\n        self.count = 0\n\n"
                     "def touch(mine, theirs):\n    mine.count = 1\n    theirs.step = 2\n")
    owned = owned_attributes(tree)
    writes = [ast.unparse(t) for n in ast.walk(tree) for t in _targets(n) if isinstance(t, ast.Attribute)]
    assert "count" in owned and "step" not in owned
    assert [w for w in writes if not w.startswith("self.") and w.split(".")[-1] not in owned] == ["theirs.step"]


def test_every_listed_exception_is_still_in_the_code():
    present = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            present.update((rel, ast.unparse(t)) for t in _targets(node) if isinstance(t, ast.Attribute))
    stale = sorted(set(NOT_NBTRAINS) - present)
    assert not stale, f"NOT_NBTRAINS lists writes that are gone (remove them): {stale}"


def _state_values() -> dict[str, str]:
    """Every value of a state enum (a NamedState) in nbtrain, with its enum's name."""
    import importlib

    from nbtrain.kernel.observers.events import NamedState

    for path in PACKAGE.rglob("*.py"):  # the enums are found by importing the modules that define one
        if "(NamedState)" in path.read_text():
            importlib.import_module("nbtrain." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    found: dict[str, str] = {}
    pending = list(NamedState.__subclasses__())
    while pending:
        enum = pending.pop()
        pending += enum.__subclasses__()
        found.update({member.value: enum.__name__ for member in enum})
    return found


def test_no_state_is_compared_as_a_string_where_its_enum_exists():
    values = _state_values()
    assert {"lost", "running", "finished", "interrupted"} <= set(values)
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for operand in [node.left, *node.comparators]:
                items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                literals = [i.value for i in items if isinstance(i, ast.Constant) and i.value in values]
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {v!r} (use {values[v]})" for v in literals]
    assert not found, "states compared as strings:\n" + "\n".join(found)


def test_no_caller_probes_a_rank_group_for_its_abilities():
    """A rank group's abilities are the RankGroup protocol's methods, which every kind implements: no caller asks
    ``getattr(pool, …)``, ``hasattr(pool, …)`` or ``isinstance(pool, LocalPool)`` what kind it holds."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args and \
                    node.func.id in ("getattr", "hasattr", "isinstance"):
                subject = ast.unparse(node.args[0])
                if re.search(r"\b(pool|group)\b", subject.split(".")[-1]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "capability probes on rank groups:\n" + "\n".join(found)


KERNEL = PACKAGE / "kernel"
# (file, expression) -> why reading another object's private attribute is the owner's own business there
PRIVATE_READS = {
    ("nbtrain/kernel/lifecycle/entry.py", "exc.with_traceback(None)._render_traceback_"): "IPython's hook on an exception",
    ("nbtrain/kernel/lifecycle/run.py", "exc.with_traceback(None)._render_traceback_"): "IPython's hook on an exception",
    ("nbtrain/kernel/observers/events.py", "follower._shown_as"): "RunObserver's class-level name, declared in this module",
    ("nbtrain/kernel/observers/history.py", "other._data"): "History.copy() filling the History it just built",
    ("nbtrain/kernel/ranks/zygote_handle.py", "zygote._popen"): "ZygoteHandle.start(), a classmethod building its own instance",
    ("nbtrain/kernel/ranks/zygote_handle.py", "zygote._sock"): "ZygoteHandle.start(), a classmethod building its own instance",
    ("nbtrain/kernel/ranks/zygote_handle.py", "zygote._env"): "ZygoteHandle.start(), a classmethod building its own instance",
    ("nbtrain/kernel/ranks/zygote_handle.py", "zygote._baseline"): "ZygoteHandle.start(), a classmethod building its own instance",
    ("nbtrain/kernel/dashboard/kernel_status.py", "kernel._publish_status"): "ipykernel's status publisher, wrapped: it has no public hook",
    ("nbtrain/kernel/dashboard/kernel_status.py", "kernel._topic"): "ipykernel's status topic, the one its publisher uses",
    ("nbtrain/kernel/magics.py", "magic.parser._actions"): "argparse's declared options: the parser has no public list",
    ("nbtrain/kernel/dashboard/snapshot.py", "self.widget._repr_mimebundle_"): "IPython's display protocol, a public hook",
}


def private_accesses(tree: ast.Module) -> list[tuple[int, str]]:
    """``x._name`` (read or written) where ``x`` is not ``self`` or ``cls``; dunders are the language's own."""
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]


def test_no_module_in_the_kernel_uses_another_objects_private_attributes():
    found = []
    for path in sorted(KERNEL.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        found += [f"{rel}:{line}: {text}" for line, text in private_accesses(ast.parse(path.read_text(), rel))
                  if (rel, text) not in PRIVATE_READS]
    assert not found, ("these use another object's private attribute; give its class a method named for what "
                       "it does (or list a reasoned exception in PRIVATE_READS):\n" + "\n".join(found))


def test_the_private_scan_finds_a_watcher_calling_into_the_run():
    tree = ast.parse("class Watch:\n    def tick(self, event):\n        self._seen = 1\n        self.run._handle(event)\n")
    assert private_accesses(tree) == [(4, "self.run._handle")]


def test_every_listed_private_access_is_still_in_the_code():
    present = set()
    for path in sorted(KERNEL.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        present.update((rel, text) for _, text in private_accesses(ast.parse(path.read_text(), rel)))
    stale = sorted(set(PRIVATE_READS) - present)
    assert not stale, f"PRIVATE_READS lists accesses that are gone (remove them): {stale}"


def test_the_runs_watchers_use_only_its_methods():
    """Stopping, preemption and waiting ask the run (``_Run`` of run.py) through its methods: none of them reads
    or writes the state it keeps (``run.failures``, ``run.pool``, ``run.relay``, …)."""
    tree = ast.parse((KERNEL / "lifecycle/run.py").read_text())
    run_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_Run")
    state = {t.attr for node in ast.walk(run_class) for t in _targets(node)
             if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert {"failures", "pool", "relay", "done"} <= state
    found = []
    for name in ("stopping.py", "preemption.py", "waiting.py"):
        for node in ast.walk(ast.parse((KERNEL / "lifecycle" / name).read_text())):
            if isinstance(node, ast.Attribute) and node.attr in state and ast.unparse(node.value) in ("run", "self.run"):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "the run's state used outside run.py:\n" + "\n".join(found)
