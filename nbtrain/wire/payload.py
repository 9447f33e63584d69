"""What travels between the notebook and the ranks: the cell's inputs one way, rank 0's results back.

This module is the format both sides agree on — each direction's pickler next to its unpickler — and
imports neither side: the kernel packs inputs (through :mod:`nbtrain.kernel.request.inputs`) and unpacks results,
a rank loads inputs and packs results (:mod:`nbtrain.rank.main`).

**Inputs.** The names a cell reads (see :mod:`nbtrain.kernel.request.cell`) are looked up in the notebook's
namespace and sent as one pickle, so objects that share state keep sharing it on the ranks (an optimizer
and the model whose parameters it holds). The pickler is cloudpickle's, so functions, lambdas and classes
defined in the notebook travel by value, keeping the file names of their code (a rank's traceback names the
notebook cell that defined them); importable modules travel as their import name. Large CPU tensors and NumPy
arrays — also inside modules, dicts or lists — are swapped for shared-memory handles (:mod:`.shm`). A
CUDA tensor in the notebook is sent as a CPU copy and said so. The pickle is made once and the same bytes
go to every rank.

When the pickle fails, the kernel tries each name alone (:func:`pickle_error`) to name the culprits
(:mod:`nbtrain.kernel.request.inputs`), before any process is involved.

**Results.** On rank 0, the names to bring back are pickled together (shared objects stay shared); a
value that cannot travel is found, skipped and named, and the others still come. DDP (and ``torch.compile``) wrappers are removed, CUDA
tensors become CPU tensors (with one line saying so). Large tensors and arrays go through ``/dev/shm``
files under the job's prefix, as inputs do (:mod:`.shm`); a result that is an untouched view of an input
is sent as a reference and comes back as a view of the notebook's original tensor — sharing its memory.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import pickle
import sys
import time
import types
from dataclasses import dataclass, field

import cloudpickle

from .shm import SHARE_THRESHOLD_BYTES, InputView, SharedArena, begin_inputs, input_view, rebuild_input_view


@dataclass
class Inputs:
    data: bytes
    names: tuple[str, ...]
    arena: SharedArena
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0  # how long pickling took, the large tensors' writes to shared memory included


def _is_plain_tensor(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and type(obj) in (torch.Tensor, torch.nn.Parameter)


def _is_array(obj) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and type(obj) is np.ndarray and obj.dtype.hasobject is False


_DYNAMIC_CODE = "<dynamic-code>"  # the file name cloudpickle (3.1 on) gives every function it sends by value


def _code_keeping_its_file(code: types.CodeType):
    """A notebook function's code as cloudpickle sends it, but with its own file name (IPython's file of the cell
    that defined it): a rank's traceback then names that cell, not ``<dynamic-code>``."""
    constructor, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    return constructor, tuple(code.co_filename if arg == _DYNAMIC_CODE else arg for arg in args)


class _InputPickler(cloudpickle.Pickler):
    def __init__(self, file, arena: SharedArena, notes: list[str]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arena = arena
        self.notes = notes

    def reducer_override(self, obj):
        if _is_plain_tensor(obj):
            reduced = self._reduce_tensor(obj)
            if reduced is not None:
                return reduced
        elif _is_array(obj) and obj.nbytes >= SHARE_THRESHOLD_BYTES:
            return self.arena.share_array(obj)
        elif isinstance(obj, types.CodeType):
            return _code_keeping_its_file(obj)
        return super().reducer_override(obj)

    def _reduce_tensor(self, tensor):
        if tensor.device.type == "meta" or not _shareable(tensor):
            return None  # torch's own pickling (which explains why non-leaf tensors cannot be sent)
        if tensor.device.type != "cpu":
            note = f"a {tensor.device.type.upper()} tensor {tuple(tensor.shape)} was sent as a CPU copy; move it with .to(device)"
            if note not in self.notes:
                self.notes.append(note)
        torch, original = sys.modules["torch"], tensor
        parameter = isinstance(tensor, torch.nn.Parameter)
        if tensor.device.type != "cpu":
            tensor = tensor.detach().cpu().requires_grad_(tensor.requires_grad)
        if tensor.numel() * tensor.element_size() >= SHARE_THRESHOLD_BYTES:
            return self.arena.share_tensor(tensor, parameter=parameter)
        if tensor is original:
            return None
        return (torch.nn.Parameter, (tensor.detach(), original.requires_grad)) if parameter else (_with_grad, (tensor.detach(), original.requires_grad))


def pickle_inputs(values: dict) -> Inputs:
    """Pickle ``values`` (name → object) once for all ranks, large tensors and arrays to shared memory.

    A failure propagates as pickling raised it, after removing any file written so far; the kernel
    names the culprits (:func:`nbtrain.kernel.request.inputs.pack_inputs`).
    """
    started = time.perf_counter()
    arena = SharedArena()
    notes: list[str] = []
    buffer = io.BytesIO()
    try:
        _InputPickler(buffer, arena, notes).dump(values)
    except BaseException:  # KeyboardInterrupt mid-write too: no file may outlive this
        arena.close()
        raise
    return Inputs(buffer.getvalue(), tuple(values), arena, notes, time.perf_counter() - started)


def pickle_error(value) -> Exception | None:
    """The exception pickling ``value`` alone (as inputs are pickled) raises, or None when it travels."""
    probe = SharedArena(dry=True)  # says whether it fails without writing any bytes
    try:
        _InputPickler(io.BytesIO(), probe, []).dump(value)
        return None
    except Exception as exc:
        return exc
    finally:
        probe.close()


def type_name(value) -> str:
    """How a value's type is named in messages: ``Tensor``, ``mymod.Net``."""
    cls = type(value)
    return cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}.{cls.__qualname__}"


def reason(exc: BaseException) -> str:
    """An exception as one line for messages, its type named once."""
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def load_inputs(data: bytes) -> dict:
    begin_inputs()
    return pickle.loads(data)


# ----------------------------------------------------------------------------------------------- results


class _ResultPickler(cloudpickle.Pickler):
    """Rank 0's results: large tensors and arrays through shared-memory files (when the job gave a prefix),
    untouched views of input files as references, CUDA tensors as CPU tensors."""

    def __init__(self, file, arena: SharedArena | None):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arena = arena
        self.moved_to_cpu = False

    def persistent_id(self, obj):
        if self.arena is not None and _is_plain_tensor(obj) and obj.device.type == "cpu" and _shareable(obj):
            # None unless it is an untouched view of an input file — of any size: a small view (big[:1000])
            # shares the notebook's memory as a large one does (a reference costs less than its bytes)
            return input_view(obj)
        return None

    def reducer_override(self, obj):
        if _is_plain_tensor(obj):
            reduced = self._reduce_tensor(obj)
            if reduced is not None:
                return reduced
        elif self.arena is not None and _is_array(obj) and obj.nbytes >= SHARE_THRESHOLD_BYTES:
            with contextlib.suppress(OSError):  # /dev/shm full: the bytes go in the pickle instead
                return self.arena.share_array(obj)
        return super().reducer_override(obj)

    def _reduce_tensor(self, obj):
        torch = sys.modules["torch"]
        parameter = isinstance(obj, torch.nn.Parameter)
        tensor = obj
        if obj.device.type not in ("cpu", "meta"):
            self.moved_to_cpu = True
            tensor = obj.detach().cpu().requires_grad_(obj.requires_grad)
        if self.arena is not None and _shareable(tensor) and tensor.numel() * tensor.element_size() >= SHARE_THRESHOLD_BYTES:
            with contextlib.suppress(OSError):
                return self.arena.share_tensor(tensor, parameter=parameter)
        if tensor is obj:
            return None
        return (torch.nn.Parameter, (tensor.detach(), obj.requires_grad)) if parameter else (_with_grad, (tensor.detach(), obj.requires_grad))


def _shareable(tensor) -> bool:
    """Plain strided bytes that a file can hold (torch's own pickling explains non-leaf tensors)."""
    return (tensor.layout.__repr__() == "torch.strided" and not tensor.is_quantized and tensor.device.type != "meta"
            and not (tensor.requires_grad and not tensor.is_leaf) and not tensor.is_conj() and not tensor.is_neg())


def _with_grad(tensor, requires_grad):
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def unwrap(value):
    """The user's module inside DistributedDataParallel and torch.compile wrappers (nested up to 4 deep), so a
    result comes back as the module the notebook knows; any other value as it is. Never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    for _ in range(4):
        if isinstance(value, torch.nn.parallel.DistributedDataParallel):
            value = value.module
        elif type(value).__name__ == "OptimizedModule" and hasattr(value, "_orig_mod"):
            value = value._orig_mod
        else:
            break
    return value


@dataclass
class Results:
    bundle: bytes | None = None  # every value in one pickle, so shared objects stay shared
    names: tuple[str, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason
    missing: tuple[str, ...] = ()  # asked for, but not defined on rank 0 when the cell ended
    moved_to_cpu: list[str] = field(default_factory=list)


def _dump(value, arena: SharedArena | None) -> tuple[bytes, bool]:
    buffer = io.BytesIO()
    pickler = _ResultPickler(buffer, arena)
    pickler.dump(value)
    return buffer.getvalue(), pickler.moved_to_cpu


class StaysOnTheRanks:
    """Put in place of a result that does not travel (a sharded optimizer's state): the name is reported
    skipped with ``why``. Pickling one fails with why, should it reach a pickler anyway."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __reduce__(self):
        raise TypeError(self.why)


def pack_results(namespace: dict, names, result_prefix: str = "") -> Results:
    """Pickle rank 0's results together, so shared objects stay shared (an optimizer keeps pointing at its
    model's parameters). Values that cannot travel are found one by one, skipped and named.

    With ``result_prefix`` large tensors and arrays are written to files starting with it (the kernel
    removes them); if packing fails or is interrupted, the files written so far are removed here.
    """
    present = {n: unwrap(namespace[n]) for n in names if n in namespace}
    out = Results(missing=tuple(n for n in names if n not in namespace))
    for name, value in list(present.items()):
        if isinstance(value, StaysOnTheRanks):  # the rank's word for why: said as it is
            out.skipped[name] = value.why
            del present[name]

    def arena(dry: bool = False) -> SharedArena | None:
        return SharedArena(result_prefix, result=True, dry=dry) if result_prefix else None

    written = arena()
    try:
        try:
            out.bundle, moved = _dump(present, written)
        except Exception:
            if written is not None:
                written.unlink()
            for name, value in list(present.items()):
                try:
                    _dump(value, arena(dry=True))
                except Exception as exc:
                    out.skipped[name] = f"{type_name(value)} cannot be pickled ({reason(exc)})"
                    del present[name]
            written = arena()
            out.bundle, moved = _dump(present, written)
    except BaseException:
        if written is not None:
            written.unlink()
        raise
    out.names = tuple(present)
    if moved:
        out.moved_to_cpu = [n for n, v in present.items() if _on_gpu(v)] or ["some values"]
    return out


def _on_gpu(value) -> bool:
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        return value.device.type not in ("cpu", "meta")
    if isinstance(value, torch.nn.Module):
        return any(t.device.type not in ("cpu", "meta") for t in itertools.chain(value.parameters(), value.buffers()))
    return False


class _ResultUnpickler(pickle.Unpickler):
    """Rebuilds :class:`InputView` references on the notebook's original tensors (one object per reference)."""

    def __init__(self, file, originals: dict):
        super().__init__(file)
        self.originals = originals
        self.views: dict[InputView, object] = {}

    def persistent_load(self, pid):
        if not isinstance(pid, InputView):
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        if pid not in self.views:
            self.views[pid] = rebuild_input_view(pid, self.originals)
        return self.views[pid]


def unpack_results(results: Results, originals: dict | None = None) -> tuple[dict, dict[str, str]]:
    """Unpickle in the kernel; a value that fails here is reported, the others still arrive.

    ``originals`` (the inputs' :attr:`SharedArena.originals`) resolves results that are views of inputs:
    such a result shares memory with the notebook's original tensor, as a view of it would.
    """
    failed = dict(results.skipped)
    try:
        values = _ResultUnpickler(io.BytesIO(results.bundle), originals or {}).load() if results.bundle else {}
        return values, failed
    except Exception as exc:
        return {}, {**failed, **{n: f"could not be rebuilt in the notebook ({reason(exc)})" for n in results.names}}


__all__ = ["Inputs", "Results", "StaysOnTheRanks", "pickle_inputs", "pickle_error", "load_inputs", "pack_results",
           "unpack_results", "unwrap", "type_name", "reason"]
