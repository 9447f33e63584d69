"""Per-step cost of nbtrain's Hugging Face integration against the Trainer alone, logging every step.

One ``%%distributed`` run (2 CPU ranks on gloo) trains a tiny BERT (built from a config, nothing downloaded)
with ``Trainer`` in blocks that alternate between the Trainer as nbtrain leaves it (its callback sends every
logged scalar to nbtrain's series) and the same Trainer with that callback removed through the Trainer's own
``remove_callback``: the library alone. ``logging_steps=1``, so every step pays the integration. Printed: the
median seconds per step of each and their ratio; then, as the two differ by less than the machine's noise, the
callback's own cost per logged step timed alone (5000 calls with a Trainer-like log) as a share of the step.

    python benchmarks/integration_overhead.py [--blocks 6] [--steps 40]
"""

from __future__ import annotations

import argparse
import textwrap

CELL = """
import os, statistics, tempfile, time, torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
torch.manual_seed(0)
config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16, num_labels=2)
model = BertForSequenceClassification(config)
class Tiny(torch.utils.data.Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i % 50] * 8), "labels": torch.tensor(i % 2)}
folder = tempfile.mkdtemp()
def seconds_per_step(observed):
    args = TrainingArguments(output_dir=folder, max_steps=STEPS, logging_steps=1, per_device_train_batch_size=8,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tiny())
    if not observed:
        for callback in list(trainer.callback_handler.callbacks):
            if type(callback).__module__.startswith("nbtrain."):
                trainer.remove_callback(callback)
    started = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - started) / STEPS
def callback_seconds(calls=5000):  # the integration's own cost per logged step: its callback, a Trainer-like log
    args = TrainingArguments(output_dir=folder, max_steps=1, report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tiny())
    trainer.state.is_world_process_zero = True
    callback = next(c for c in trainer.callback_handler.callbacks if type(c).__module__.startswith("nbtrain."))
    started = time.perf_counter()
    for i in range(calls):
        trainer.state.global_step = 1_000_000 + i
        logs = {"loss": 0.5 + i * 1e-6, "grad_norm": 1.0 + i * 1e-6, "learning_rate": 5e-5, "epoch": i * 1e-4}
        callback.on_log(args, trainer.state, trainer.control, logs=logs)
    return (time.perf_counter() - started) / calls
times = {True: [], False: []}
for block in range(BLOCKS):
    for observed in ((True, False) if block % 2 else (False, True)):
        times[observed].append(seconds_per_step(observed))
if rank == 0:
    alone, observed = statistics.median(times[False]), statistics.median(times[True])
    print(f"Trainer alone: {alone * 1e3:.2f} ms/step; with nbtrain's integration: {observed * 1e3:.2f} ms/step; "
          f"ratio {observed / alone:.3f}")
    own = callback_seconds()
    print(f"nbtrain's callback alone: {own * 1e6:.1f} us per logged step = {own / alone * 100:.2f} % of the "
          "Trainer's step (goal <= 1 %)")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    from nbtrain.kernel.lifecycle.entry import run_source
    from nbtrain.kernel.request.config import LaunchRequest

    source = f"STEPS, BLOCKS = {args.steps}, {args.blocks}\n" + textwrap.dedent(CELL)
    run_source(source, LaunchRequest(nprocs=2, cpu=True, keep_alive=0), {})


if __name__ == "__main__":
    main()
