"""--ft: a replica group that copies a peer's state in the middle of the run moves its prepared loader to the peer's
position — on, when it is behind; back to the peer's batch, when it is ahead in the same pass — so every group reads
as many batches and none is left with batches (steps alone) at the end.

In one process, without torchft: the step boundary's quorum is a stand-in whose heal hands the loader the peer's
position, as :func:`nbtrain.rank.train.checkpoint.resume_from_peer` does. The run that found it (three emulated
nodes, rank 2's node killed) is ``tests/test_torchft_nodes.py``: survivor 0 failed one attempt while survivor 1
failed one and committed one, healed from a peer, and was one batch behind from then on; at the end it took a step
alone, and its weights differed from the others' by 0.019.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from nbtrain.rank.train import data, ft_cell, state


class Heal:
    """The step boundary of a group that heals at its ``at``-th boundary from a peer whose loader is at ``peer``."""

    def __init__(self, at: int, peer: dict) -> None:
        self.at, self.peer, self.seen = at, peer, 0
        self.loader: data.PreparedLoader | None = None

    def boundary(self) -> None:
        self.seen += 1
        if self.seen == self.at and self.loader is not None:
            self.loader.catch_up(self.peer)


def _passes(monkeypatch, heal: Heal, passes: int = 2) -> list[list[int]]:
    """The samples each pass hands out (10 batches of 4 a pass, in order)."""
    monkeypatch.setattr(ft_cell, "active", lambda: heal)
    with state.scope(state.TrainSettings(), torch.device("cpu"), rank=0, world_size=1) as context:
        loader = data.prepare_loader(context, DataLoader(TensorDataset(torch.arange(40)), batch_size=4))
        heal.loader = loader
        return [[int(batch[0][0]) for batch in loader] for _ in range(passes)]


def test_a_group_behind_the_peer_passes_over_the_batches_the_peer_read(monkeypatch):
    # at the 3rd boundary this loader has handed out 2 batches; the peer had read 3 at its own boundary
    first, second = _passes(monkeypatch, Heal(at=3, peer={"epoch": 0, "batches": 3}))
    assert first == [0, 4, 12, 16, 20, 24, 28, 32, 36], "the third batch (8) is the peer's: passed over"
    assert second == list(range(0, 40, 4)), "the next pass is whole"


def test_a_peer_in_the_next_pass_ends_this_one_and_the_next_starts_where_the_peer_is(monkeypatch):
    first, second = _passes(monkeypatch, Heal(at=9, peer={"epoch": 1, "batches": 2}))
    assert first == [0, 4, 8, 12, 16, 20, 24, 28]
    assert second == [8, 12, 16, 20, 24, 28, 32, 36]


def test_a_loader_level_with_the_peer_stays(monkeypatch):
    first, second = _passes(monkeypatch, Heal(at=3, peer={"epoch": 0, "batches": 2}))
    assert first == second == list(range(0, 40, 4))


def test_a_group_ahead_of_the_peer_reads_again_from_the_peers_batch(monkeypatch):
    # at the 4th boundary this loader has handed out 3 batches (0, 4, 8); the peer had read 1 at its own boundary
    first, second = _passes(monkeypatch, Heal(at=4, peer={"epoch": 0, "batches": 1}))
    assert first == [0, 4, 8, 4, 8, *range(12, 40, 4)], "batches 1 and 2 again, then on to the end of the pass"
    assert second == list(range(0, 40, 4)), "the next pass is whole"


def test_a_group_ahead_reads_as_many_batches_as_the_peer_from_then_on_in_a_shuffled_order(monkeypatch):
    monkeypatch.setattr(ft_cell, "active", lambda: heal)
    heal = Heal(at=6, peer={"epoch": 0, "batches": 3})
    with state.scope(state.TrainSettings(), torch.device("cpu"), rank=0, world_size=1) as context:
        loader = data.prepare_loader(context, DataLoader(TensorDataset(torch.arange(40)), batch_size=4, shuffle=True))
        heal.loader = loader
        seen = [batch[0].tolist() for batch in loader]
    order = seen[:5]  # the pass's own order, up to the heal
    assert seen[5:7] == order[3:5], "the peer's 4th and 5th batches: the same samples as this pass's"
    assert len(seen) == 5 + (10 - 3) and loader.position() == {"epoch": 1, "batches": 0}
    assert sorted(sum(order[:3] + seen[5:], [])) == list(range(40)), "from the peer's batch on, the rest of the pass"


def test_a_peer_in_an_earlier_pass_leaves_the_loader_where_it_is(monkeypatch):
    first, second = _passes(monkeypatch, Heal(at=12, peer={"epoch": 0, "batches": 9}))
    assert first == second == list(range(0, 40, 4))


def test_the_heal_of_a_peer_state_hands_each_prepared_loader_its_position(monkeypatch):
    from nbtrain.rank.train import checkpoint, dcp_resume

    caught = []
    monkeypatch.setattr(dcp_resume, "restore", lambda *args: None)
    with state.scope(state.TrainSettings(), torch.device("cpu"), rank=0, world_size=1) as context:
        net = torch.nn.Linear(2, 2)
        context.models.append(net)
        loader = data.prepare_loader(context, DataLoader(TensorDataset(torch.arange(40)), batch_size=4))
        monkeypatch.setattr(loader, "catch_up", caught.append)
        peer = checkpoint.own_snapshot(context)
        peer["step"], peer["loaders"] = 7, [{"epoch": 0, "batches": 5}]
        checkpoint.resume_from_peer(context, peer, "a peer")
        assert context.step == 7
    assert caught == [{"epoch": 0, "batches": 5}]
