"""Training libraries' own loops in a cell: what they log becomes nbtrain's series, with no change to the cell."""

from __future__ import annotations

import os

import pytest
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.setup_facts import setup_words

pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HF_TRAINER_CELL = """
import os
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)
config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=16, max_position_embeddings=16, num_labels=2)
model = BertForSequenceClassification(config)  # built from a config: nothing is downloaded

class Tiny(torch.utils.data.Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i % 50] * 8), "labels": torch.tensor(i % 2)}

args = TrainingArguments(output_dir=os.path.join(os.environ["OUT"], "hf"), max_steps=6, logging_steps=2,
                         per_device_train_batch_size=4, per_device_eval_batch_size=4, eval_strategy="steps",
                         eval_steps=3, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=False)
Trainer(model=model, args=args, train_dataset=Tiny(), eval_dataset=Tiny()).train()
"""


@pytest.mark.slow
def test_a_hugging_face_trainer_logs_its_loss_at_its_own_steps_and_its_length(pools, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    output = Captured()
    _, result = run_cell(pools, HF_TRAINER_CELL, write=output)
    loss = result.history["loss"]
    assert loss.steps == [2, 4, 6]
    assert result.history["eval_loss"].steps == [3, 6]
    assert result.history["learning_rate"].steps == [2, 4, 6]
    assert result.history.total_steps == 6  # the dashboard's progress bar and ETA
    assert "logged by Hugging Face Trainer" in setup_words(result.setup)  # the summary's line
    bars = [line for line in output.lines() if "/6 [" in line]
    assert bars and not [line for line in bars if "[rank 1]" in line], output.text()  # rank 0's progress bar only


@pytest.mark.slow
def test_no_integrations_leaves_the_trainer_unobserved(pools, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    _, result = run_cell(pools, HF_TRAINER_CELL, integrations=False)
    assert "loss" not in result.history and result.history.total_steps is None


LIGHTNING_CELL = """
import torch
import lightning as L

class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                    enable_checkpointing=False, enable_model_summary=False)
trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=4))
"""


def installed_entry_points(folder) -> None:
    """nbtrain's metadata as ``pip install nbtrain`` writes it, with the entry points pyproject.toml declares, in
    ``folder`` (the notebook's directory, on the ranks' path): what Lightning reads its callback factories from."""
    import tomllib

    project = tomllib.loads(open(os.path.join(ROOT, "pyproject.toml")).read())["project"]
    info = folder / "nbtrain_entry_points-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nbtrain-entry-points\nVersion: 0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        for group, points in project["entry-points"].items()))


@pytest.mark.slow
def test_a_lightning_trainer_logs_what_the_module_logs_at_its_steps(pools, tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    installed_entry_points(tmp_path)
    monkeypatch.chdir(tmp_path)
    _, result = run_cell(pools, LIGHTNING_CELL)
    assert result.history["loss"].steps == [1, 2, 3, 4, 5, 6]  # the Trainer's global step after each batch
    assert result.history.total_steps == 6
    assert "logged by Lightning Trainer" in setup_words(result.setup)
