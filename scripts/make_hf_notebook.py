"""Writes notebooks/hf_finetune.ipynb: a tiny Hugging Face model, built from a config (no download), fine-tuned by
its own ``Trainer`` in a ``%%distributed`` cell, with the Trainer's logs as the dashboard's curves.

    python scripts/make_hf_notebook.py

Kept as code, like the other notebook generators. It runs on the CPU by default (2 ranks, gloo) and on GPUs
with ``DEVICE_OPTION = ''``; tests/test_notebooks.py executes it.
"""

from nbformat.v4 import new_code_cell, new_markdown_cell
from notebook_cells import parameters, write

DATA = (
    "import torch\n"
    "from transformers import BertConfig, BertForSequenceClassification\n\n"
    "VOCAB, LENGTH = 64, 16\n"
    "config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,\n"
    "                    intermediate_size=128, max_position_embeddings=LENGTH)\n\n"
    "class Sequences(torch.utils.data.Dataset):\n"
    "    \"\"\"Random token ids; the label says whether token 1 appears more often than token 2.\"\"\"\n"
    "    def __init__(self, count, seed):\n"
    "        g = torch.Generator().manual_seed(seed)\n"
    "        self.ids = torch.randint(0, 4, (count, LENGTH), generator=g)\n"
    "        self.labels = ((self.ids == 1).sum(1) > (self.ids == 2).sum(1)).long()\n"
    "    def __len__(self):\n"
    "        return len(self.ids)\n"
    "    def __getitem__(self, i):\n"
    "        return {'input_ids': self.ids[i], 'labels': self.labels[i]}\n\n"
    "train, valid = Sequences(2048, seed=0), Sequences(256, seed=1)\n\n"
    "def accuracy(prediction):\n"
    "    return {'accuracy': float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}\n\n"
    "print(f'{len(train)} training and {len(valid)} validation sequences; '\n"
    "      f'{sum(p.numel() for p in BertForSequenceClassification(config).parameters()):,} parameters')")

TRAIN = (
    "%%distributed {RANKS} {DEVICE_OPTION}\n"
    "import tempfile\n"
    "from transformers import Trainer, TrainingArguments\n\n"
    "torch.manual_seed(0)\n"
    "args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=MAX_STEPS, per_device_train_batch_size=32,\n"
    "                         learning_rate=2e-3, warmup_steps=10, logging_steps=10, eval_strategy='steps',\n"
    "                         eval_steps=40, report_to='none', save_strategy='no',\n"
    "                         use_cpu=DEVICE_OPTION == '--cpu')\n"
    "trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=train,\n"
    "                  eval_dataset=valid, compute_metrics=accuracy)\n"
    "trainer.train()\n"
    "final = trainer.evaluate()\n"
    "model = trainer.model   # the model itself, not its DDP wrapper: rank 0's comes back\n"
    "world = trainer.args.world_size")

CHECK = (
    "print(f\"trained on {world} ranks: eval loss {final['eval_loss']:.3f}, accuracy {final['eval_accuracy']:.2f}\")\n"
    "print('logged by the Trainer:', ', '.join(history.names))\n"
    "model.eval()\n"
    "with torch.no_grad():\n"
    "    guessed = model(input_ids=valid.ids[:8]).logits.argmax(-1)\n"
    "print('first 8 validation labels:', valid.labels[:8].tolist(), ' the model says:', guessed.tolist())")

cells = [
    new_markdown_cell(
        "# Fine-tuning with Hugging Face's Trainer\n\n"
        "Most people who fine-tune a model do not write the training loop: they call the `Trainer`. In a "
        "`%%distributed` cell it trains on the cell's ranks as they are (DDP), and what it logs — `loss`, "
        "`learning_rate`, `grad_norm`, `eval_loss`, `eval_accuracy` — becomes the dashboard's curves and the "
        "notebook's `history`, with no `nbtrain.log` in the cell. The Trainer's own progress bar is shown once.\n\n"
        "The model is a tiny BERT built from a config (nothing is downloaded); the task is made up in the notebook. "
        "Everything runs on the CPU by default (gloo); on a GPU machine set `DEVICE_OPTION = ''`."),
    parameters("RANKS = 2\nDEVICE_OPTION = '--cpu'            # '' on GPUs: NCCL, a GPU per rank\nMAX_STEPS = 120"),
    new_code_cell("%load_ext nbtrain"),
    new_markdown_cell("The model's config and the data: sequences of token ids, labelled by whether token 1 "
                      "appears more often than token 2. The classes and the data set reach the ranks as they are."),
    new_code_cell(DATA),
    new_markdown_cell("## Train\n\nThe `Trainer` is the one you would write for one process. It sees the cell's "
                      "ranks (`trainer.args.world_size`), each rank takes its share of every batch, and the "
                      "evaluation runs every 40 steps. The names the cell assigns come back from rank 0."),
    new_code_cell(TRAIN),
    new_markdown_cell("## Back in the notebook\n\nThe final metrics, the series the Trainer logged (`history`), and "
                      "the trained model, used here in the kernel."),
    new_code_cell(CHECK),
]

write(cells, "hf_finetune")
