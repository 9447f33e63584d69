"""The DCP save planner nbtrain's sharded saves use: DCP's default, with plan caching on (the same state each save,
so its plan is made once), which also carries each rank's own part of the checkpoint to rank 0, and runs a hook
once the ranks have agreed on the plan.

- **Each rank's own state** (RNG states, metric counters, logged series: the bytes of ``torch.save``, read with
  ``weights_only=True``) travels with the rank's local plan to the coordinator, in the one gather DCP makes anyway.
  A gather of its own, beside the write, cost a thread and two collectives on every rank, which took the CPU from
  DCP's write on small machines. The coordinator takes the parts off before DCP's own planning, so DCP's plan cache
  sees the plans it would see without them.
- **The hook** (``planned(parts)``: every rank's part on the coordinator, None elsewhere) starts what a save does
  beside DCP's write (rank 0 writing the checkpoint file). Started before ``dcp.save``, it took the GIL and the CPU
  from the plan exchange (small object collectives every rank waits on): on two CPU ranks the exchange took 8 ms
  instead of 5. Started from :meth:`finish_plan`, it runs beside the write itself, which waits on the disk.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

_CARRIED = "nbtrain-rank-part"  # marks a local plan's planner_data that carries a rank's part beside DCP's own data


def save_planner(planned: Callable[[list[bytes | None] | None], None] | None = None, part: bytes | None = None):
    """A planner for one ``dcp.save``: ``part`` (this rank's own state, as bytes) reaches the coordinator with the
    rank's plan; ``planned(parts)`` runs on each rank once the plan is agreed, before the write, with every rank's
    part in rank order on the coordinator (None for a rank that sent none) and None on the others."""
    return _planner_class()(planned, part)


@functools.cache
def _planner_class():
    from torch.distributed.checkpoint import DefaultSavePlanner

    class NbtrainSavePlanner(DefaultSavePlanner):
        """Its class name keys DCP's plan cache: a cell's own ``dcp.save`` calls, with DCP's default planner and
        another state, do not displace nbtrain's cached plan."""

        def __init__(self, planned, part: bytes | None) -> None:
            super().__init__(enable_plan_caching=True)
            self._planned, self._part = planned, part
            self._parts: list[bytes | None] | None = None

        def create_local_plan(self):
            plan = super().create_local_plan()
            if self._part is None:
                return plan
            return dataclasses.replace(plan, planner_data=(_CARRIED, plan.planner_data, self._part))

        def create_global_plan(self, all_plans):
            split = [_split(plan) for plan in all_plans]
            self._parts = [part for _, part in split]
            return super().create_global_plan([plan for plan, _ in split])

        def finish_plan(self, new_plan):
            plan = super().finish_plan(new_plan)
            planned, self._planned = self._planned, None
            parts, self._parts = self._parts, None
            if planned is not None:
                planned(parts)
            return plan

    return NbtrainSavePlanner


def _split(plan: Any) -> tuple[Any, bytes | None]:  # DCP's SavePlan, imported only when a save is made
    """A local plan as DCP made it, and the part it carried (None if it carried none)."""
    data = plan.planner_data
    if not (isinstance(data, tuple) and len(data) == 3 and data[0] == _CARRIED):
        return plan, None
    return dataclasses.replace(plan, planner_data=data[1]), data[2] if isinstance(data[2], bytes) else None
