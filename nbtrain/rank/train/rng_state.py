"""A rank's random number generators' states (Python, NumPy, torch CPU and CUDA) as a checkpoint holds them:
tensors and plain values only, so ``torch.load(weights_only=True)`` reads them back."""

from __future__ import annotations

import random
import sys

import torch


def rng_state(device) -> dict:
    version, words, gauss = random.getstate()
    # its 625 words as one tensor: as a tuple of ints, each rank's took a millisecond to read back with weights_only
    state = {"python": (version, torch.tensor(words, dtype=torch.int64), gauss), "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:  # its key array as a tensor: a checkpoint is loaded holding only tensors and plain values
        name, keys, position, has_gauss, gauss = sys.modules["numpy"].random.get_state()
        state["numpy"] = (name, torch.from_numpy(keys.astype("int64")), position, has_gauss, gauss)
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device) -> None:
    version, words, gauss = state["python"]
    words = tuple(words.tolist()) if isinstance(words, torch.Tensor) else words  # a tuple in older checkpoints
    random.setstate((version, words, gauss))
    torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        import numpy

        name, keys, position, has_gauss, gauss = state["numpy"]
        keys = keys.cpu() if isinstance(keys, torch.Tensor) else keys  # loaded onto the rank's GPU with the rest
        numpy.random.set_state((name, numpy.asarray(keys, dtype="uint32"), position, has_gauss, gauss))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
