"""The node's rendezvous: decided by the kernel, handed over the authenticated link — nothing read from the store.

torchrun's c10d rendezvous (``DynamicRendezvousHandler``) keeps its state in the store as a pickle that every
agent unpickles, and the store has no authentication: whoever can reach it could make every node run code.
Here the kernel already decides the group — which nodes, in which order, how many — so it sends each node its
group rank and the group's size in :class:`~nbtrain.wire.nodes.StartRanks`, over the TLS link both sides
authenticated. :class:`KernelRendezvous` hands that to torch elastic's agent as a finished rendezvous, like
torch's own static rendezvous but as a client of the store the kernel hosts (never hosting one itself).

The store is still used, as torchrun uses it, for what carries no code: the ranks' process-group bootstrap
(addresses, raw bytes) and the agent's exit barrier. The agent computes its workers' global ranks itself
(``TORCH_ELASTIC_WORKER_IDENTICAL``: every node runs ``--nproc-per-node`` ranks), so not even the rank
assignment is read back from the store.
"""

from __future__ import annotations

import datetime
import os

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo

from ..wire import nodes as N


class KernelRendezvous(RendezvousHandler):
    """One round, decided by the kernel: this node's group rank and the group's size, the kernel's store."""

    def __init__(self, start: N.StartRanks) -> None:
        host, _, port = start.rdzv_endpoint.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.run_id, self.rank, self.world_size = start.run_id, start.group_rank, start.nnodes
        self.timeout = datetime.timedelta(seconds=start.join_timeout_s)
        self._store: TCPStore | None = None
        os.environ["TORCH_ELASTIC_WORKER_IDENTICAL"] = "1"  # global ranks from group rank × nproc, not the store

    def get_backend(self) -> str:
        return "nbtrain"

    @property
    def use_agent_store(self) -> bool:
        return True  # the ranks bootstrap their process group from the same (kernel's) store, as under torchrun

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._store = TCPStore(self.host, self.port, is_master=False, timeout=self.timeout,
                                   wait_for_workers=False)
        store = PrefixStore(f"nbtrain/{self.run_id}/", self._store)
        return RendezvousInfo(store, self.rank, self.world_size, RendezvousStoreInfo(self.host, self.port))

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0  # the group changes only when the kernel forms a new one

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True
