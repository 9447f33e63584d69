"""Speed settings of prepared models: channels_last memory format and ``torch.compile``.

**channels_last** (``--channels-last`` / ``--no-channels-last``; left out: automatic). Convolutions under
AMP on NVIDIA GPUs run on tensor cores in NHWC order; a model kept in PyTorch's default NCHW order pays
for a transpose around every convolution (ResNet-50 bf16 on an H100: 2109 img/s NCHW, 3779 img/s NHWC).
So by default a model holding a ``Conv2d`` (or a 2-D transposed convolution) is converted with
``model.to(memory_format=torch.channels_last)`` when it runs on a GPU under autocast; ``--channels-last``
converts it anywhere (CPU included), ``--no-channels-last`` never. The prepared model's forward then
turns 4-D floating-point tensor arguments into channels_last (a no-op when they already are), so batches
moved with ``x.to(device)`` need nothing more; 4-D outputs come back in the default layout, so code that
``view()``s them works as before. Memory format never changes a value, only the order in memory.

A model of its own that calls ``.view()`` on a convolution's output fails in channels_last ("view size is
not compatible with input tensor's size and stride"). Under the automatic choice that first forward is
retried once in the default layout, the model stays there, and the run says why (use ``reshape`` or
``flatten`` to keep the speed-up); with ``--channels-last`` given, the error is the user's to see.

**torch.compile** (``--compile [MODE]``). The plain module is compiled in place (``module.compile()``), before
the DDP wrapper, so its ``state_dict`` keys, checkpoints and the model brought back to the notebook are
unchanged. Compiling is lazy: it happens on the first forward, which is timed and reported as the compile
time (dashboard and summary). Warm ranks keep the compiled code between cells, as torch keeps it per
process; a cell that defines its model class again compiles again (new code). A compile that fails raises
:class:`CompileError` naming the cause; with ``--compile-fallback`` the model runs uncompiled instead and the
run says why. DDP over a channels_last or compiled model is given ``gradient_as_bucket_view=True`` (unless
the cell passes it): gradients are then views into DDP's buckets, which removes the copy and the "grad
strides do not match bucket view strides" warning that 1×1 convolutions raise in those layouts.

What was decided for each model is sent to the kernel once (:func:`report`), as a
:class:`~nbtrain.wire.protocol.Setup` message: it is what the summary's first line and the bottleneck
advisor read.
"""

from __future__ import annotations

import sys
import time

import torch

from . import metrics

CONV_TYPES = (torch.nn.Conv2d, torch.nn.ConvTranspose2d)
VIEW_ERROR = "view size is not compatible with input tensor's size and stride"


class CompileError(RuntimeError):
    """torch.compile failed on a prepared model's first forward; the message names the cause."""


def has_convolutions(model: torch.nn.Module) -> bool:
    return any(isinstance(m, CONV_TYPES) for m in model.modules())


def channels_last_wanted(setting: bool | None, device: torch.device, amp_dtype, model: torch.nn.Module) -> bool:
    """``--channels-last`` given: yes; ``--no-channels-last``: no; left out: a conv model under AMP on a GPU."""
    if setting is not None:
        return setting and has_convolutions(model)
    return device.type == "cuda" and amp_dtype is not None and has_convolutions(model)


def to_memory_format(model: torch.nn.Module, channels_last: bool) -> torch.nn.Module:
    return model.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def inputs_to_channels_last(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """4-D floating-point tensors among the forward's arguments, in channels_last (no copy when they are)."""
    return tuple(_nhwc(a) for a in args), {k: _nhwc(v) for k, v in kwargs.items()}


def _nhwc(value):
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    return value


def outputs_to_default_layout(value):
    """4-D tensors in (nested tuples, lists, dicts of) outputs back in the default layout, so view() works."""
    if isinstance(value, torch.Tensor):
        return value.contiguous() if value.dim() == 4 else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(outputs_to_default_layout(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(outputs_to_default_layout(v) for v in value)
    if isinstance(value, dict):
        return {k: outputs_to_default_layout(v) for k, v in value.items()}
    return value


def compile_in_place(model: torch.nn.Module, choice: str) -> None:
    """``model.compile()`` with a mode, or with a tracing-only backend (aot_eager, eager)."""
    if choice in ("aot_eager", "eager"):
        model.compile(backend=choice)
    else:
        model.compile(mode=choice)


def compiled(model: torch.nn.Module) -> bool:
    """Whether torch.compile runs ``model`` or any module in it: ``torch.compile(model)`` (an OptimizedModule) or
    ``module.compile()``, by the cell itself or by ``--compile``."""
    return any(type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None
               for module in model.modules())


def uncompile(model: torch.nn.Module) -> None:
    model._compiled_call_impl = None  # what nn.Module.compile() set; the module calls its own forward again


def is_compile_failure(exc: BaseException) -> bool:
    """An error raised by torch.compile's machinery (dynamo, a backend), not by the model's own code."""
    try:
        from torch._dynamo import exc as dynamo_exc
    except ImportError:  # pragma: no cover - torch without dynamo
        return False
    return isinstance(exc, (dynamo_exc.TorchDynamoException, dynamo_exc.BackendCompilerFailed))


def compile_cause(exc: BaseException) -> str:
    """The first line of what went wrong, without torch's advice paragraphs."""
    inner = exc.__cause__ or getattr(exc, "inner_exception", None) or exc
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0] if text else ''}".rstrip(": ")


class ModelSpeed:
    """What was decided for one prepared model, and the first forward that compiles it."""

    def __init__(self, index: int, channels_last: bool, auto: bool, compile_choice: str | None, fallback: bool,
                 facts: dict, loud: bool = True):
        self.index = index
        self.loud = loud  # rank 0 says what it stepped back from; the others decide alike, silently
        self.channels_last = channels_last
        self.auto = auto  # channels_last chosen automatically: may step back on a view() error
        self.compile = compile_choice
        self.fallback = fallback
        self.first_call = True
        self.facts: dict = {**facts, "model": index, "channels_last": channels_last, "compile": compile_choice}

    def prepare_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return inputs_to_channels_last(args, kwargs) if self.channels_last else (args, kwargs)

    def finish_outputs(self, out):
        return outputs_to_default_layout(out) if self.channels_last else out

    def first_forward(self, module: torch.nn.Module, call, args: tuple, kwargs: dict):
        """Run the first forward: time the compile, step back from channels_last or compile where allowed."""
        self.first_call = False
        started = time.perf_counter()
        try:
            out = self._call_with_layout_retry(module, call, args, kwargs)
        except Exception as exc:
            if self.compile is None or not is_compile_failure(exc):
                raise
            cause = compile_cause(exc)
            if not self.fallback:
                raise CompileError(f"torch.compile (--compile {self.compile}) failed on the model's first forward: "
                                   f"{cause}. Run without --compile, or add --compile-fallback to run uncompiled "
                                   "when compiling fails.") from exc
            uncompile(module)
            self.facts["compile_error"] = cause
            self._note(f"torch.compile failed ({cause}); the model runs uncompiled (--compile-fallback)")
            args, kwargs = self.prepare_args(args, kwargs)
            out = call(*args, **kwargs)
        if self.compile is not None and "compile_error" not in self.facts:
            self.facts["compile_s"] = round(time.perf_counter() - started, 3)
        report(self.facts)
        return out

    def _call_with_layout_retry(self, module, call, args, kwargs):
        try:
            shaped_args, shaped_kwargs = self.prepare_args(args, kwargs)
            return call(*shaped_args, **shaped_kwargs)
        except RuntimeError as exc:
            if not (self.auto and self.channels_last and VIEW_ERROR in str(exc)):
                raise
        self.channels_last = False
        self.facts["channels_last"] = False
        self.facts["channels_last_off"] = "the model calls view() on a convolution's output"
        to_memory_format(module, channels_last=False)
        self._note("channels_last is off for this model: it calls .view() on a convolution's output (reshape() or "
              "flatten() there keeps channels_last and its speed-up)")
        return call(*args, **kwargs)


    def _note(self, text: str) -> None:
        if self.loud:
            print(f"nbtrain: {text}", file=sys.stderr, flush=True)


def report(facts: dict) -> None:
    """Send what was decided for a model to the kernel (nothing outside a ``%%distributed`` cell)."""
    metrics.send_setup(facts)
