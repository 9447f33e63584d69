"""Training libraries' own loops in a cell: what they log becomes nbtrain's series, with no change to the cell."""

from __future__ import annotations

import pytest
from helpers.runhelp import Captured, run_cell

from nbtrain.kernel.diagnostics.setup_facts import setup_words

pytest.importorskip("transformers")

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
