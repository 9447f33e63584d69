"""Dense peak FLOP/s of known GPUs, by precision: the denominator of model FLOPs utilisation (MFU).

NVIDIA's datasheets quote tensor-core peaks "with sparsity"; training runs dense, so the figures here are
the dense ones (half the sparse figure). The key is the name NVML and ``torch.cuda.get_device_name`` report.
A GPU not in the table has no peak — MFU then says "peak unknown" — never a guess from a similar card.

``fp32`` is the non-tensor-core rate (``torch.backends.cuda.matmul.allow_tf32`` off); ``tf32`` the tensor-core
rate PyTorch uses for float32 matrix products when TF32 is allowed. Values in TFLOP/s.
"""

from __future__ import annotations

import re

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")

# (pattern on the device name, {precision: dense TFLOP/s}); the first match wins, so the specific names come first.
_TABLE: tuple[tuple[str, dict[str, float]], ...] = (
    (r"\bH100\b.*\bPCIe\b", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"\bH100\b.*\bNVL\b", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"\bH100\b", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5 (H100 80GB HBM3)
    (r"\bH200\b.*\bNVL\b", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"\bH200\b", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"\bGH200\b", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"\bA100\b", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"\bL40S\b", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bRTX 4090\b", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),  # fp32 accumulation, as PyTorch
    (r"\bV100\b", {"fp16": 125.0, "fp32": 15.7}),
    (r"\bT4\b", {"fp16": 65.0, "fp32": 8.1}),
)


def dense_peak_tflops(device_name: str, precision: str) -> float | None:
    """The GPU's dense peak for ``precision`` (one of :data:`PRECISIONS`), or None when nbtrain does not know it."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    for pattern, peaks in _TABLE:
        if re.search(pattern, device_name):
            return peaks.get(precision)
    return None
