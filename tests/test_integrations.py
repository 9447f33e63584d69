"""Hugging Face's and Lightning's Trainers in a 2-rank cell (CPU, gloo, real packages; a tiny BERT built from a
config, no download): what they log becomes the run's series at their own steps, with their planned steps as the
progress bar's end, one progress bar is shown, the summary says which integration logged, and
``--no-integrations`` turns it off."""

from __future__ import annotations

import pytest
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.lifecycle.entry import format_summary

pytest.importorskip("transformers")
pytest.importorskip("lightning")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HUGGING_FACE = """
import tempfile, torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
torch.manual_seed(0)
config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32)
class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": torch.tensor(i % 2)}
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=8, per_device_train_batch_size=4, logging_steps=2,
                         eval_strategy="steps", eval_steps=4, report_to="none", use_cpu=True, save_strategy="no")
trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Data(), eval_dataset=Data())
trainer.train()
world = trainer.args.world_size
"""

LIGHTNING = """
import torch, lightning as L
class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss)
        return loss
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]), sync_dist=True)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=4)
trainer = L.Trainer(max_steps=8, accelerator="cpu", devices=world_size, strategy="ddp", log_every_n_steps=2,
                    logger=False, enable_checkpointing=False, val_check_interval=4, limit_val_batches=2)
trainer.fit(Net(), loader, loader)
world = trainer.world_size
"""

ACCELERATE = """
import tempfile, torch
from accelerate import Accelerator
accelerator = Accelerator(cpu=True, log_with=["tensorboard", "nbtrain"] if NBTRAIN_TOO else "tensorboard",
                          project_dir=tempfile.mkdtemp())
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.init_trackers("cell")
for step in range(6):
    loss = torch.nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1))
    accelerator.backward(loss)
    optimizer.step(); optimizer.zero_grad()
    accelerator.log({"loss": loss.item(), "lr": 0.1}, step=step)
accelerator.end_training()
world = accelerator.num_processes
"""


def test_an_accelerators_tracker_logs_are_the_runs_series_at_its_steps(pools):
    ns, result = run_cell(pools, "NBTRAIN_TOO = False\n" + ACCELERATE)
    assert ns["world"] == 2  # accelerate joined the cell's ranks
    assert result.history.series("loss").steps == list(range(6))  # logged through its TensorBoard tracker
    assert result.history.series("lr").steps == list(range(6))
    assert "logged by accelerate" in format_summary(result)[0]
    _, both = run_cell(pools, "NBTRAIN_TOO = True\n" + ACCELERATE)  # and log_with="nbtrain": each value once
    assert both.history.series("loss").steps == list(range(6))


def test_hugging_face_trainers_logs_are_the_runs_series_at_its_steps(pools):
    output = Captured()
    ns, result = run_cell(pools, HUGGING_FACE, write=output)
    history = result.history
    assert ns["world"] == 2  # the Trainer trained on the cell's two ranks
    assert history.series("loss").steps == [2, 4, 6, 8] and history.series("eval_loss").steps == [4, 8]
    assert history.series("epoch").steps == [2, 4, 6, 8]  # reported with each log, drawn once a step
    assert "learning_rate" in history and history.total_steps == 8  # the progress bar's end: max_steps
    assert "logged by Hugging Face Trainer" in format_summary(result)[0]
    bars = [line for line in output.text().splitlines() if "8/8 [" in line]
    assert bars and not any(line.startswith("[rank 1]") for line in bars)  # rank 0's bar alone


def test_lightning_trainers_logs_are_the_runs_series_at_its_steps(pools):
    ns, result = run_cell(pools, LIGHTNING)
    history = result.history
    assert ns["world"] == 2  # Lightning joined the cell's ranks instead of launching its own
    assert history.series("loss").steps == [2, 4, 6, 8] and history.series("val_loss").steps == [4, 8]
    assert history.total_steps == 8
    assert "logged by Lightning Trainer" in format_summary(result)[0]


def test_no_integrations_leaves_the_trainers_logs_alone(pools):
    _, result = run_cell(pools, LIGHTNING, integrations=False)
    assert "loss" not in result.history and "logged by" not in format_summary(result)[0]
