"""How a new pool's ranks start: forked from the kernel's zygote (:mod:`.zygote`) where it can, else spawned.

One :class:`RankStarter` per kernel (the :class:`~nbtrain.kernel.lifecycle.pools.PoolManager`'s) owns the zygote:
started when the extension loads (:meth:`RankStarter.start_zygote`), replaced by a new one if it died (the cell
that found it dead spawns its ranks), closed with the kernel. Ranks on joined nodes (``--nodes``) are started by
the nodes' agents under torch elastic, as before; ``--spawn`` spawns them here too.
"""

from __future__ import annotations

from .rankgroup import RankGroup
from .zygote_handle import ZygoteHandle


class RankStarter:
    def __init__(self, zygote: ZygoteHandle | None = None) -> None:
        self.zygote = zygote  # given: one that another starter may share (it is then not this one's to close)
        self._owned = zygote is None

    def start_zygote(self) -> None:
        """Start the zygote in the background, once (importing torch there takes seconds: nobody waits for it)."""
        if self.zygote is None:
            self.zygote = ZygoteHandle.start()

    def start(self, pool: RankGroup, spawn: bool = False) -> str:
        """Start ``pool``'s ranks; a line for the cell when they were spawned although a zygote was there, or ""."""
        zygote = self.zygote
        forking = not spawn and zygote is not None
        pool.spawn(zygote, fork_ranks=forking)  # the pool's store is forked where it can be, whatever the ranks
        why = pool.spawn_reason() if forking else ""
        if not why or zygote is None:
            return ""
        if "zygote process ended" in zygote.why_not():  # a new one for the next cell
            if self._owned:
                zygote.close()
            self.zygote, self._owned = ZygoteHandle.start(), True
            why += "; a new zygote is starting for the next cells"
        return f"nbtrain: ranks started as new processes, not forked from the zygote: {why}.\n" if why else ""

    def close(self) -> None:
        zygote, self.zygote = self.zygote, None
        if zygote is not None and self._owned:
            zygote.close()
