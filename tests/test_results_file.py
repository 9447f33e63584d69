"""A detached run's tensors as results.safetensors: keys by path, tied weights, cycles, nothing to write."""

from __future__ import annotations

import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from nbtrain.rank import results_file


def test_tensors_are_written_by_path_tied_weights_each_once_and_nothing_else(tmp_path):
    net = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    net[1].weight = net[0].weight  # tied: one storage under two keys
    loop: dict = {"w": torch.ones(2)}
    loop["self"] = loop  # a dict that holds itself is entered once
    values = {"model": net, "losses": [torch.tensor(1.0), 2.0], "state": loop, "note": "text",
              "grad": torch.zeros(3, requires_grad=True) * 2}
    assert results_file.write(values, str(tmp_path)) == ""
    written = tmp_path / results_file.NAME
    tensors = load_file(written)
    assert sorted(tensors) == ["grad", "losses.0", "model.0.weight", "model.1.weight", "state.w"]
    assert torch.equal(tensors["model.0.weight"], net[0].weight.detach())
    assert torch.equal(tensors["model.1.weight"], tensors["model.0.weight"])
    assert oct(os.stat(written).st_mode & 0o777) == "0o600"
    with safe_open(written, "pt") as opened:
        assert json.loads(opened.metadata()["names"]) == sorted(values)
    assert [name for name in os.listdir(tmp_path)] == [results_file.NAME]  # no temporary left


def test_no_tensor_no_file_and_a_missing_safetensors_package_is_said(tmp_path, monkeypatch):
    assert results_file.write({"n": 3, "text": "a"}, str(tmp_path)) == ""
    assert os.listdir(tmp_path) == []
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # as if it were not installed
    said = results_file.write({"w": torch.ones(2)}, str(tmp_path))
    assert "the safetensors package is missing (pip install nbtrain[safetensors])" in said
    assert os.listdir(tmp_path) == []
