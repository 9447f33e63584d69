"""Writes notebooks/sharded_finetune.ipynb: a model trained sharded (``--shard``), resumed at another rank count,
brought back whole, and a model too large for the notebook built on the meta device.

    python scripts/make_sharded_notebook.py

Kept as code, like the other notebook generators. It runs on the CPU by default (2 ranks, gloo) and on GPUs
with ``DEVICE_OPTION = ''``; tests/test_notebooks.py executes it.
"""

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebook_cells import parameters, write

MODEL = (
    "import torch\nfrom torch import nn\nimport torch.nn.functional as F\n\n"
    "class Block(nn.Module):\n"
    "    \"\"\"One transformer layer: causal self-attention, then an MLP, each with a residual.\"\"\"\n"
    "    def __init__(self, width, heads):\n"
    "        super().__init__()\n"
    "        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)\n"
    "        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)\n"
    "        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))\n\n"
    "    def forward(self, x):\n"
    "        n = x.shape[1]\n"
    "        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)\n"
    "        h = self.norm1(x)\n"
    "        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]\n"
    "        return x + self.mlp(self.norm2(x))\n\n"
    "class TinyGPT(nn.Module):\n"
    "    def __init__(self, vocab, width=64, layers=4, heads=4, context=32):\n"
    "        super().__init__()\n"
    "        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)\n"
    "        self.layers = nn.ModuleList(Block(width, heads) for _ in range(layers))\n"
    "        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)\n\n"
    "    def forward(self, idx):\n"
    "        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))\n"
    "        for layer in self.layers:\n"
    "            x = layer(x)\n"
    "        return self.head(self.norm(x))\n\n"
    "TEXT = ('the quick brown fox jumps over the lazy dog. ' * 40 +\n"
    "        'a sharded model trains like any other: every rank holds a slice. ' * 40)\n"
    "chars = sorted(set(TEXT))\n"
    "encode = lambda s: torch.tensor([chars.index(c) for c in s])\n"
    "decode = lambda t: ''.join(chars[i] for i in t)\n"
    "data = encode(TEXT)\n"
    "CONTEXT = 32\n"
    "starts = torch.arange(0, len(data) - CONTEXT - 1, 3)\n"
    "X = torch.stack([data[s:s + CONTEXT] for s in starts])\n"
    "Y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts])\n"
    "print(f'{len(chars)} characters, {len(X)} training windows of {CONTEXT}')")

TRAIN = (
    "%%distributed {RANKS} --shard {DEVICE_OPTION} --checkpoint {CHECKPOINT}\n"
    "import nbtrain\n"
    "from torch.utils.data import DataLoader, TensorDataset\n\n"
    "torch.manual_seed(0)\n"
    "model = TinyGPT(len(chars), context=CONTEXT)\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=3e-3)\n"
    "loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)\n"
    "model, opt, loader = nbtrain.prepare(model, opt, loader)   # FSDP2: each rank holds 1/world_size\n"
    "for epoch in nbtrain.epochs(EPOCHS):\n"
    "    for x, y in loader:\n"
    "        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())\n"
    "        nbtrain.backward(loss)\n"
    "        nbtrain.clip_grad_norm_(model, 1.0)\n"
    "        opt.step(); opt.zero_grad()\n"
    "        nbtrain.log(loss=loss)\n"
    "    nbtrain.save_checkpoint()                                 # DCP: every rank writes its own shards\n"
    "    if rank == 0:\n"
    "        print(f'epoch {epoch}: loss {loss.item():.3f}')\n"
    "final_loss = loss.item()")

cells = [
    new_markdown_cell(
        "# A model trained sharded\n\n"
        "`%%distributed N --shard` trains the cell's model with FSDP2: each of the N ranks holds 1/N of the "
        "parameters, gradients and optimizer state, and gathers a layer's parameters only while it computes "
        "that layer. The cell is the one you would write for DDP; only the option changes. Checkpoints are "
        "sharded too (`torch.distributed.checkpoint`), and a run resumes from them at another number of ranks.\n\n"
        "Everything here runs on the CPU by default (gloo); on a GPU machine set `DEVICE_OPTION = ''`."),
    parameters(
        "RANKS = 2\n"
        "DEVICE_OPTION = '--cpu'            # '' on GPUs: NCCL, a GPU per rank, bf16\n"
        "CHECKPOINT = 'runs/sharded_finetune'\n"
        "EPOCHS = 2"),
    new_code_cell("%load_ext nbtrain"),
    new_markdown_cell("A small GPT-like model and a character-level data set, defined in the notebook (no download)."),
    new_code_cell(MODEL),
    new_markdown_cell(
        "## Train, sharded\n\n"
        "The cell prints what sharding did (measured on rank 0: how many blocks, the parameters each rank "
        "holds). `nbtrain.save_checkpoint()` writes each rank's shards; re-running the cell resumes."),
    new_code_cell(TRAIN),
    new_code_cell(
        "print(f'back in the notebook: {type(model).__name__} (the plain module, whole), loss {final_loss:.3f}')\n"
        "assert type(model).__name__ == 'TinyGPT'"),
    new_markdown_cell(
        "## Resume at another rank count\n\n"
        "Two more epochs on one rank, from the checkpoint the two ranks wrote: DCP re-shards on load, so the "
        "model, the optimizer's moments and the step go on where they were."),
    new_code_cell(TRAIN.replace("{RANKS}", "1").replace("nbtrain.epochs(EPOCHS)", "nbtrain.epochs(EPOCHS + 2)")),
    new_markdown_cell("## Use it in the notebook\n\nThe model came back as an ordinary module: generate some text."),
    new_code_cell(
        "model.eval()\n"
        "idx = encode('the quick ')[None]\n"
        "with torch.no_grad():\n"
        "    for _ in range(40):\n"
        "        idx = torch.cat([idx, model(idx[:, -CONTEXT:])[:, -1].argmax(-1, keepdim=True)], 1)\n"
        "print(repr(decode(idx[0].tolist())))"),
    new_markdown_cell(
        "## A model that does not fit the notebook\n\n"
        "Built on the meta device, a model has a shape but no storage: this one would take "
        "hundreds of MB, and the notebook holds none of it. `prepare()` gives each rank storage for its own "
        "shards only and initialises them (`reset_parameters()`); no process ever holds the whole model."),
    new_code_cell(
        "with torch.device('meta'):\n"
        "    big = TinyGPT(len(chars), width=512, layers=12, context=CONTEXT)\n"
        "print(f'{sum(p.numel() for p in big.parameters()) / 1e6:.0f}M parameters, on {next(big.parameters()).device}')"),
    new_code_cell(
        "%%distributed {RANKS} --shard {DEVICE_OPTION} --out big_loss\n"
        "import nbtrain\n"
        "big = nbtrain.prepare(big)\n"
        "big_loss = F.cross_entropy(big(X[:8]).flatten(0, 1), Y[:8].flatten()).item()"),
    new_code_cell("print(f'the untrained big model: loss {big_loss:.2f}')"),
]

write(cells, "sharded_finetune")
