"""Check --shard on this machine's GPUs: FSDP2 + bf16 + NCCL through prepare(), the model back, DCP save and resume.

    python scripts/verify_gpu_sharded.py            # one rank per GPU (RANKS=N to choose), NCCL, bf16
    python scripts/verify_gpu_sharded.py --cpu      # the same path on CPU ranks (gloo), to check the script

Runs the same training cell four times through nbtrain.kernel.lifecycle.entry.run_source: DDP, --shard, --shard for half
the epochs, then --shard --checkpoint-async resuming from that checkpoint; prints each curve, what came back
and the peak GPU memory, then whether the sharded losses match DDP's, the sharded step split holds *comm* (FSDP2's reduce-scatter), and
the resumed curve the straight one.
Last, a small language model whose head shares the embedding's weight, trained under --shard and resumed from
its checkpoint: whether the tie holds on the ranks and in the model that comes back each time.
Record the command and its output in docs/gpu-verification.md.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

from nbtrain.gpu import nvml
from nbtrain.kernel.lifecycle.entry import run_source
from nbtrain.kernel.request.config import LaunchRequest

CPU = "--cpu" in sys.argv
MODEL = '''
import torch, nbtrain
from torch import nn
import torch.nn.functional as F
class Block(nn.Module):
    def __init__(self, w):
        super().__init__(); self.norm, self.up, self.down = nn.LayerNorm(w), nn.Linear(w, 4 * w), nn.Linear(4 * w, w)
    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))
class Net(nn.Module):
    def __init__(self, w=1024, depth=8):
        super().__init__(); self.embed = nn.Linear(64, w); self.layers = nn.ModuleList(Block(w) for _ in range(depth)); self.head = nn.Linear(w, 10)
    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
torch.manual_seed(0)
X, Y = torch.randn(512, 64, device=device), torch.randint(0, 10, (512,), device=device)
torch.manual_seed(1)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, opt = nbtrain.prepare(model, opt)
curve = []
for epoch in nbtrain.epochs(EPOCHS):
    loss = F.cross_entropy(model(X), Y)
    nbtrain.backward(loss); nbtrain.clip_grad_norm_(model, 1.0); opt.step(); opt.zero_grad()
    curve.append(round(loss.item(), 4))
    nbtrain.save_checkpoint()
where = str(next(model.parameters()).device)
peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
'''
ranks = int(os.environ.get("RANKS", "0")) or (2 if CPU else len(nvml.visible_gpus()) or 1)
tmp = tempfile.mkdtemp()
TIED = '''
import torch, nbtrain
from torch import nn
import torch.nn.functional as F
class LM(nn.Module):
    def __init__(self, vocab=512, width=256):
        super().__init__(); self.emb = nn.Embedding(vocab, width); self.mid = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False); self.head.weight = self.emb.weight
    def forward(self, tokens):
        return self.head(torch.tanh(self.mid(self.emb(tokens))))
torch.manual_seed(0)
T = torch.randint(0, 512, (64, 33), device=device)
lm = LM()
opt = torch.optim.AdamW(lm.parameters(), lr=1e-3)
lm, opt = nbtrain.prepare(lm, opt)
tied_on_the_ranks = lm.head.weight is lm.emb.weight
for epoch in nbtrain.epochs(EPOCHS):
    loss = F.cross_entropy(lm(T[:, :-1]).flatten(0, 1), T[:, 1:].flatten())
    nbtrain.backward(loss); opt.step(); opt.zero_grad()
    nbtrain.save_checkpoint()
'''


def tied(epochs: int) -> bool:
    """The tied model trained to ``epochs`` under --shard (resuming from the last call's checkpoint)."""
    ns: dict = {}
    run_source(TIED.replace("EPOCHS", str(epochs)), LaunchRequest(nprocs=ranks, cpu=CPU, keep_alive=600, out="lm,tied_on_the_ranks",
               shard="full", amp="bf16", checkpoint=os.path.join(tmp, "tied")), ns, write=lambda stream, text: print(text, end="", flush=True))
    back = ns["lm"].head.weight is ns["lm"].emb.weight
    print(f"tied LM to epoch {epochs}: tied on the ranks {ns['tied_on_the_ranks']}, tied in the model back {back}, "
          f"parameters back {len(list(ns['lm'].parameters()))} (3 when tied)", flush=True)
    return bool(ns["tied_on_the_ranks"]) and back


def run(epochs, **options):
    ns: dict = {}
    started = time.perf_counter()
    result = run_source(MODEL.replace("EPOCHS", str(epochs)), LaunchRequest(nprocs=ranks, cpu=CPU, keep_alive=600, out="curve,model,where,peak", **options),
                        ns, write=lambda stream, text: print(text, end="", flush=True))
    ns["split"] = next((f["split"] for f in result.setup.get(0, []) if "split" in f), {})
    print(f"[{options}] {time.perf_counter() - started:.1f} s: curve {ns['curve']}, back: {type(ns['model']).__name__} "
          f"on {next(ns['model'].parameters()).device}, params on the ranks: {ns['where']}, peak GPU memory {ns['peak'] / 2**20:.0f} MiB", flush=True)
    return ns
ddp = run(6, amp="bf16", checkpoint=os.path.join(tmp, "ddp"))
straight = run(6, shard="full", amp="bf16", checkpoint=os.path.join(tmp, "a"))
first = run(3, shard="full", amp="bf16", checkpoint=os.path.join(tmp, "b"))
then = run(6, shard="full", amp="bf16", checkpoint=os.path.join(tmp, "b"), checkpoint_async=True)
print("sharded = DDP losses (bf16):", straight["curve"], ddp["curve"])
split = straight["split"]  # FSDP2's reduce-scatter wait at backward's end, timed by CUDA events on a GPU
print("the sharded step split sums to 100 % and holds comm:", abs(sum(split.values()) - 100.0) < 0.1 and "comm" in split,
      " · ".join(f"{share:.1f} % {phase}" for phase, share in split.items()))
print("resumed curve equals the straight one:", first["curve"] + then["curve"] == straight["curve"], first["curve"] + then["curve"])
ties = [tied(2), tied(4)]
print("tied weights stay tied under --shard, back in the notebook and after a resume:", all(ties))
