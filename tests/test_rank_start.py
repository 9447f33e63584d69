"""How a rank joins its group (nbtrain.rank.main): the rendezvous and the communicator, timed apart.

The communicator itself is built by the real path in every run test (gloo); what needs a GPU is NCCL's: its
``init_process_group`` is given the rank's device, so the communicator is built at start. With no GPU here, the
test records the call instead of making it (the one stand-in, for the absent hardware).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nbtrain.rank import main as rank_main


class FakeStore:
    def set_timeout(self, timeout) -> None:
        self.timeout = timeout


def joined_with(monkeypatch, backend: str, device) -> dict:
    calls: dict = {}
    monkeypatch.setenv("NBTRAIN_BACKEND", backend)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "rendezvous", lambda url, rank, size, timeout: iter([(FakeStore(), rank, size)]))
    monkeypatch.setattr(dist, "PrefixStore", lambda prefix, store: (prefix, store))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: calls.update(kwargs, backend=backend))
    joined, built = rank_main._init_process_group(device)
    assert joined <= built
    return calls


def test_nccl_builds_its_communicator_at_start_on_the_ranks_device(monkeypatch):
    calls = joined_with(monkeypatch, "nccl", torch.device("cuda", 1))
    assert calls["device_id"] == torch.device("cuda", 1)
    assert calls["backend"] == "nccl" and calls["rank"] == 1 and calls["world_size"] == 2
    assert calls["store"][0] == "default_pg", "the same store prefix as init_method='env://'"


def test_gloo_is_initialised_as_before(monkeypatch):
    calls = joined_with(monkeypatch, "gloo", torch.device("cpu"))
    assert "device_id" not in calls and calls["backend"] == "gloo"
