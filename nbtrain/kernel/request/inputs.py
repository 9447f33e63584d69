"""The cell's inputs, packed in the kernel — and, when they cannot be sent, which variable and why.

:func:`pack_inputs` looks the names a cell reads up in the notebook and pickles them once, in the format
of :mod:`nbtrain.wire.payload` (large tensors to shared memory). When the pickle fails, each name is tried
alone to name the culprits: a :class:`PayloadError` names every variable that cannot be sent, with its
type and the reason — for a function, which of the globals (or captured variables) it uses cannot be
pickled — before any process is involved. The explanation is the kernel's alone, so it lives here and
not in the format the ranks share.
"""

from __future__ import annotations

import types

from ...wire.payload import Inputs, pickle_error, pickle_inputs, reason, type_name
from .mistakes import UserInputError


class PayloadError(UserInputError):
    """A notebook variable the cell reads cannot be sent to the ranks."""


def pack_inputs(namespace: dict, names) -> Inputs:
    """Pickle ``names`` from ``namespace`` once for all ranks; raise PayloadError naming any culprit."""
    values = {n: namespace[n] for n in names if n in namespace}
    try:
        return pickle_inputs(values)
    except Exception as exc:
        raise _explain_failure(values, exc) from None


def _explain_failure(values: dict, original: Exception) -> PayloadError:
    """Try each variable alone: name every one that cannot be sent, and why (a function: which global)."""
    culprits = [(name, value, exc) for name, value in values.items() if (exc := pickle_error(value)) is not None]
    if not culprits:
        return PayloadError(f"Cannot send the notebook variables to the ranks: {reason(original)}")
    if len(culprits) == 1:
        name, value, exc = culprits[0]
        return PayloadError(f"Cannot send the notebook variable '{name}' ({type_name(value)}) to the ranks: "
                            f"{_why(value, exc)}.\nCreate it inside the %%distributed cell instead, or delete it "
                            f"from the notebook if the cell does not need it.")
    listed = "".join(f"\n  '{name}' ({type_name(value)}): {_why(value, exc)}" for name, value, exc in culprits)
    return PayloadError(f"Cannot send {len(culprits)} notebook variables to the ranks:{listed}\nCreate them inside "
                        f"the %%distributed cell instead, or delete them from the notebook if the cell does not need them.")


def _why(value, exc: Exception, depth: int = 0) -> str:
    """The reason; for a function sent by value, which global (or captured variable) cannot be pickled."""
    if isinstance(value, types.FunctionType) and depth < 3:
        for kind, name, captured in _captured(value):
            inner = pickle_error(captured)
            if inner is not None:
                return (f"it uses the {kind} '{name}' ({type_name(captured)}), which cannot be pickled: "
                        f"{_why(captured, inner, depth + 1)}")
    return reason(exc)


def _captured(func: types.FunctionType):
    """What cloudpickle sends with a function: the globals its code names, and its closure's cells."""
    names: list[str] = []
    codes = [func.__code__]
    while codes:
        code = codes.pop()
        names += [n for n in code.co_names if n in func.__globals__ and n not in names]
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for name in names:
        yield "global", name, func.__globals__[name]
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or (), strict=True):
        try:
            yield "captured variable", name, cell.cell_contents
        except ValueError:  # an empty cell
            continue
