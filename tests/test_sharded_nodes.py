"""--shard hybrid on two emulated nodes (its own module: node agents and one machine's warm pool do not mix)."""

from __future__ import annotations

import pytest
from helpers.sharding import train

pytestmark = pytest.mark.timeout(300)


def test_hybrid_sharding_replicates_across_nodes_and_shards_within_one(nodes):
    """Two emulated nodes × 2 ranks: a 2-D mesh (2 replicas × 2 shards), the same losses as DDP on 4 ranks."""
    nodes.start("127.0.0.2")
    nodes.start("127.0.0.3")
    nodes.wait_joined(2)
    common = dict(nprocs=None, nodes="2", nproc_per_node=2, rdzv_host="127.0.0.1", start_timeout=120)
    hybrid, _ = train(nodes.manager, steps=6, shard="hybrid", **common)
    plain, _ = train(nodes.manager, steps=6, **common)
    assert hybrid["kind"] == "FSDPNet" and hybrid["losses"] == pytest.approx(plain["losses"], rel=1e-4, abs=1e-5)
