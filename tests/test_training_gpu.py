"""GPU paths of the training features: fp16 with the GradScaler, bf16 autocast, NCCL. Skipped without CUDA.

Runs on 1 rank per GPU (up to 2). ``nbtrain.log(reduce=...)`` on NCCL and prepare()'s pin_memory are
checked here too.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from helpers.runhelp import DTYPE_PROBE, run_cell  # noqa: E402

pytestmark = pytest.mark.timeout(300)
NPROCS = min(2, torch.cuda.device_count())


ON_GPUS = dict(nprocs=NPROCS, cpu=False)


def test_fp16_gradscaler_skips_an_inf_step_on_gpu(pools):
    ns, _ = run_cell(pools, """
import torch, nbtrain
net = torch.nn.Linear(16, 1)
model, opt = nbtrain.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
state = nbtrain.training_state()
x = torch.randn(8, 16, device=device)
before = [p.detach().clone() for p in net.parameters()]
nbtrain.backward(model(x).sum() * float("inf"))
opt.step(); opt.zero_grad()
after_inf = [p.detach().clone() for p in net.parameters()]
nbtrain.backward(model(x).pow(2).mean())
opt.step(); opt.zero_grad()
after_good = [p.detach().clone() for p in net.parameters()]
result = (all(torch.equal(a, b) for a, b in zip(before, after_inf)),
          any(not torch.equal(a, b) for a, b in zip(after_inf, after_good)),
          state.steps_skipped, type(state.scaler).__name__, str(state.amp_dtype), str(next(net.parameters()).device))
""", **ON_GPUS, amp="fp16", out="result")
    skipped_unchanged, good_changed, skipped, scaler, dtype, where = ns["result"]
    assert (skipped_unchanged, good_changed, skipped, scaler, dtype) == (True, True, 1, "GradScaler", "torch.float16")
    assert where.startswith("cuda")


def test_default_amp_on_gpu_and_bf16_inside_forward(pools):
    ns, _ = run_cell(pools, "import torch, nbtrain\n" + DTYPE_PROBE + """
model = nbtrain.prepare(probe)
out = model(torch.randn(4, 8, device=device))
expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
result = (probe.seen == expected, str(out.dtype))
""", **ON_GPUS, out="result")
    assert ns["result"] == (True, "torch.float32")


def test_nccl_prepare_loader_and_reduced_metrics(pools):
    _, result = run_cell(pools, """
import torch, nbtrain
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
data = TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
model, opt, loader = nbtrain.prepare(net, torch.optim.AdamW(net.parameters()), DataLoader(data, batch_size=16, shuffle=True))
assert loader.pin_memory
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss = F.cross_entropy(model(x), y)
    nbtrain.backward(loss)
    opt.step(); opt.zero_grad()
    nbtrain.log(loss=loss, reduce="mean")
    nbtrain.log(rank_mean=torch.tensor(float(rank), device=device), reduce="mean")
""", **ON_GPUS, amp="bf16", grad_accum=2)
    assert result.backend == "nccl"
    steps = 256 // NPROCS // 16
    assert len(result.history.series("loss")) == steps
    assert result.history.series("rank_mean").values == [sum(range(NPROCS)) / NPROCS] * steps
