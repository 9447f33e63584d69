"""Static analysis of a ``%%distributed`` cell: which notebook names it reads and which it assigns.

The kernel must send each rank exactly the notebook names the cell needs and bring back the names the
cell defines. Both come from the cell's syntax tree, without running it:

* **reads** — names the cell may read from the notebook. Top-level statements are walked in order: a
  name loaded before any top-level statement bound it is a read (``model = model.to(device)`` reads the
  notebook's ``model``). Names used as globals inside functions, lambdas, classes and comprehensions
  defined in the cell are reads unless the cell binds them at top level somewhere (a function usually
  refers to a model the cell creates later). Conservative on purpose: sending one name too many costs a
  little time, one too few breaks the run.
* **assigns** — every name bound at the cell's top level (assignment, import, ``def``, ``class``,
  ``for``/``with`` targets, walrus), in first-bound order; the default set brought back from rank 0.
* **deletes** — names the cell's top-level code deletes (``del buf``, and ``except E as exc``'s ``exc``, which
  Python deletes when the clause ends). They stay in the default set (a
  name deleted and bound again comes back), but one that is gone when the cell ends is not reported as
  missing: the cell meant it.

From these, :func:`names_to_send` keeps the reads the notebook defines, minus what a rank provides itself
(:data:`~nbtrain.wire.names.RUNTIME_NAMES`) and IPython's own names (``In``, ``_``, ``_i3``);
:func:`names_to_return` is ``--out`` when given, else the assigns minus those and private ``_names``.

A syntax error is reported with the line number of the cell as the user sees it (the magic's own line
counts, as in the tracebacks' ``Cell line N``) — also a line Python's message names ("… after 'for'
statement on line 2") — so the error points at the right line before any process starts.
"""

from __future__ import annotations

import ast
import re
import symtable
from dataclasses import dataclass

from ...wire.names import RUNTIME_NAMES
from .mistakes import UserInputError

# `try` and, from Python 3.11, `try ... except*` (ast.TryStar, with the same fields).
_TRY_NODES = tuple(getattr(ast, name) for name in ("Try", "TryStar") if hasattr(ast, name))

CELL_FILENAME = "<%%distributed cell>"
# "expected an indented block after 'for' statement on line 1": the message names a line of its own
_LINE_IN_MESSAGE = re.compile(r"(\bon line )(\d+)")
IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "display", "exit", "quit", "_ih", "_oh", "_dh", "_", "__", "___"})


class CellSyntaxError(UserInputError):
    """The cell is not valid Python; the message names the cell line."""


@dataclass(frozen=True)
class CellInfo:
    source: str
    line_offset: int  # lines before the cell body (the %%distributed line), for error messages
    reads: tuple[str, ...]
    assigns: tuple[str, ...]
    code: ast.Module
    deletes: tuple[str, ...] = ()


def analyse_cell(source: str, line_offset: int = 1) -> CellInfo:
    """Parse the cell body and return what it reads and assigns; raise CellSyntaxError if invalid."""
    try:
        tree = ast.parse(source, filename=CELL_FILENAME)
        table = symtable.symtable(source, CELL_FILENAME, "exec")
    except SyntaxError as exc:
        line = (exc.lineno or 0) + line_offset
        text = (exc.text or "").rstrip("\n")
        pointer = f"\n    {text}" if text.strip() else ""
        message = _LINE_IN_MESSAGE.sub(lambda m: f"{m[1]}{int(m[2]) + line_offset}", exc.msg)
        raise CellSyntaxError(f"SyntaxError in the cell, line {line}: {message}{pointer}") from None

    assigns = _top_level_bindings(tree)
    reads = _ordered_reads(tree)
    bound_anywhere = set(assigns)
    for name in _nested_global_reads(table):
        if name not in bound_anywhere and name not in reads:
            reads.append(name)
    return CellInfo(source, line_offset, tuple(reads), tuple(assigns), tree, tuple(_top_level_deletions(tree)))


def _ordered_reads(tree: ast.Module) -> list[str]:
    """Names loaded by module-level code before a module-level statement bound them (in source order)."""
    bound: set[str] = set()
    reads: list[str] = []

    def note(node: ast.AST | None) -> None:
        for name in _loads_in_scope(node) if node is not None else ():
            if name not in bound and name not in reads:
                reads.append(name)

    def bind(node: ast.expr | None) -> None:
        if node is not None:
            bound.update(_bindings_of(ast.Assign(targets=[node], value=ast.Constant(None))))

    def block(body: list[ast.stmt]) -> None:
        for stmt in body:
            statement(stmt)

    def statement(stmt: ast.stmt) -> None:
        # Compound statements: header first, then their bodies in order (a `with ... as f:` binds f for its body).
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            note(stmt.iter)
            bind(stmt.target)
            block(stmt.body)
            block(stmt.orelse)
        elif isinstance(stmt, (ast.While, ast.If)):
            note(stmt.test)
            block(stmt.body)
            block(stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                note(item.context_expr)
                bind(item.optional_vars)
            block(stmt.body)
        elif isinstance(stmt, _TRY_NODES):
            block(stmt.body)
            for handler in stmt.handlers:
                note(handler.type)
                if handler.name:
                    bound.add(handler.name)
                block(handler.body)
            block(stmt.orelse)
            block(stmt.finalbody)
        else:
            note(stmt)
            bound.update(_bindings_of(stmt))

    block(tree.body)
    return reads


def _loads_in_scope(node: ast.AST) -> list[str]:
    """Names loaded by ``node`` in the module scope itself (nested scopes are handled by symtable)."""
    names: list[str] = []

    def visit(n: ast.AST) -> None:
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            names.append(n.id)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            names.append(n.target.id)  # x += 1 reads x first
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # Decorators, defaults and annotations run in the enclosing scope; the body does not.
            args = n.args
            for d in [*getattr(n, "decorator_list", []), *args.defaults, *args.kw_defaults]:
                if d is not None:
                    visit(d)
            return
        if isinstance(n, ast.ClassDef):
            for d in [*n.decorator_list, *n.bases, *(k.value for k in n.keywords)]:
                visit(d)
            return
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            visit(n.generators[0].iter)  # the first iterable is evaluated in the enclosing scope
            return
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(node)
    return names


def _nested_global_reads(table: symtable.SymbolTable) -> list[str]:
    """Globals referenced from functions, lambdas, classes and comprehensions in the cell."""
    found: list[str] = []

    def walk(t: symtable.SymbolTable) -> None:
        for child in t.get_children():
            for sym in child.get_symbols():
                if sym.is_referenced() and (sym.is_global() or (child.get_type() == "class" and not sym.is_assigned())):
                    if sym.get_name() not in found:
                        found.append(sym.get_name())
            walk(child)

    walk(table)
    return found


def _bindings_of(stmt: ast.AST) -> list[str]:
    """Names a top-level statement binds in the module scope, in order."""
    names: list[str] = []

    def target(t: ast.AST) -> None:
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for elt in t.elts:
                target(elt)
        elif isinstance(t, ast.Starred):
            target(t.value)

    def visit(n: ast.AST) -> None:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(n.name)
            return
        if isinstance(n, ast.Lambda) or isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for alias in n.names:
                if alias.name != "*":
                    names.append(alias.asname or alias.name.split(".")[0])
            return
        if isinstance(n, ast.Assign):
            for t in n.targets:
                target(t)
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and (getattr(n, "value", None) is not None or isinstance(n, ast.AugAssign)):
            target(n.target)
        elif isinstance(n, (ast.For, ast.AsyncFor)):
            target(n.target)
        elif isinstance(n, (ast.With, ast.AsyncWith)):
            for item in n.items:
                if item.optional_vars is not None:
                    target(item.optional_vars)
        elif isinstance(n, ast.NamedExpr):
            target(n.target)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.append(n.name)
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(stmt)
    return names


def _top_level_bindings(tree: ast.Module) -> list[str]:
    out: list[str] = []
    for stmt in tree.body:
        for name in _bindings_of(stmt):
            if name not in out:
                out.append(name)
    return out


def imported_only(info: CellInfo) -> set[str]:
    """The names the cell binds at its top level by import statements alone (``import time``, ``from torch import
    nn``): the run brings back the same module or object the notebook would import, never a newer value."""
    imported: set[str] = set()
    other: set[str] = set()
    for stmt in info.code.body:
        (imported if isinstance(stmt, (ast.Import, ast.ImportFrom)) else other).update(_bindings_of(stmt))
    return imported - other


def _top_level_deletions(tree: ast.Module) -> list[str]:
    """Names ``del``-eted in the module scope (also inside top-level ``if``/``for``/``with``/``try``)."""
    out: list[str] = []

    def visit(n: ast.AST) -> None:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return  # their ``del`` acts on their own scope
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Del) and n.id not in out:
            out.append(n.id)
        if isinstance(n, ast.ExceptHandler) and n.name and n.name not in out:
            out.append(n.name)  # Python deletes ``except E as name``'s name when the clause ends
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(tree)
    return out


def names_to_send(info: CellInfo, namespace: dict) -> list[str]:
    """The cell's free names that the notebook defines, minus nbtrain's runtime and IPython's own."""
    return [
        n for n in info.reads
        if n in namespace and n not in RUNTIME_NAMES and n not in IPYTHON_NAMES
        and not (n.startswith("__") and n.endswith("__")) and not (n.startswith("_i") and n[2:].isdigit())
    ]


def names_to_return(info: CellInfo, out_names: tuple[str, ...] | None) -> tuple[str, ...]:
    """The names to bring back from rank 0: ``--out`` if given, else what the cell assigns (minus the runtime's)."""
    if out_names is not None:
        return out_names
    return tuple(n for n in info.assigns if n not in RUNTIME_NAMES and not n.startswith("_"))
