"""A small transformer-like model and its training cell, shared by the --shard tests."""

from __future__ import annotations

from helpers.runhelp import run_cell

MODEL = """
import torch, nbtrain
from torch import nn
import torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))

class Net(nn.Module):
    def __init__(self, width=32, depth=3):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)
    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

torch.manual_seed(0)
X, Y = torch.randn(256, 8), torch.randint(0, 4, (256,))
"""

TRAIN = MODEL + """
torch.manual_seed(1)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
model, opt = nbtrain.prepare(model, opt)
x, y = X[rank::world_size], Y[rank::world_size]
losses = []
for step in range(STEPS):
    for micro in range(K):
        part = slice(micro * len(x) // K, (micro + 1) * len(x) // K)
        loss = F.cross_entropy(model(x[part]), y[part])
        nbtrain.backward(loss)
    nbtrain.clip_grad_norm_(model, 1.0)
    opt.step(); opt.zero_grad()
    total = loss.detach().clone()
    torch.distributed.all_reduce(total)
    losses.append(total.item() / world_size)
checksum = sum(float(p.full_tensor().double().sum()) if hasattr(p, "full_tensor") else float(p.double().sum())
               for p in model.parameters())
kind = type(model).__name__
"""


def train(pools, steps=30, k=1, **options):
    source = TRAIN.replace("STEPS", str(steps)).replace("K)", f"{k})").replace("// K", f"// {k}")
    options = {"out": "losses,checksum,kind,model", **options}
    return run_cell(pools, source, grad_accum=k, **options)


# Each epoch one step on the whole batch (on every rank: the curve is the same at any world size), then a save.
CURVE = MODEL + """
torch.manual_seed(1)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
model, opt = nbtrain.prepare(model, opt)
curve = []
for epoch in nbtrain.epochs(EPOCHS):
    loss = F.cross_entropy(model(X), Y)
    nbtrain.backward(loss)
    opt.step(); opt.zero_grad()
    curve.append(round(loss.item(), 6))
    nbtrain.save_checkpoint()   # under --checkpoint-async it returns once the shards are copied
"""


# A language model whose head shares the embedding's weight (as GPT-2's does), trained EPOCHS epochs with a save each.
TIED_LM = """
import torch, nbtrain
from torch import nn
import torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)
    def forward(self, x):
        return x + torch.tanh(self.linear(x))

class LM(nn.Module):
    def __init__(self, vocab=50, width=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(2))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight
    def forward(self, tokens):
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

torch.manual_seed(0)
T = torch.randint(0, 50, (32, 8))
lm = LM()
opt = torch.optim.AdamW(lm.parameters(), lr=1e-2)
lm, opt = nbtrain.prepare(lm, opt)
tied_on_the_ranks = lm.head.weight is lm.emb.weight
for epoch in nbtrain.epochs(EPOCHS):
    loss = F.cross_entropy(lm(T[:, :-1]).flatten(0, 1), T[:, 1:].flatten())
    nbtrain.backward(loss); opt.step(); opt.zero_grad()
    nbtrain.save_checkpoint()
weights = lm.emb.weight.full_tensor().clone()
"""
