"""Attacks through a pool's c10d store, performed by a network peer: another process that reaches its port.

The store has no authentication (as under torchrun): whoever reaches it may write any key. What a run takes
from it must therefore be nothing more than torch's own process-group bootstrap needs:

* values planted for the keys a preemption's agreement once read (``x``, or a step) neither fail nor freeze a
  ``--checkpoint`` cell of a warm pool: the ranks agree on the step over their authenticated channels.
"""

from __future__ import annotations

import pytest
import torch
from helpers.preempt_cells import training_cell
from helpers.runhelp import run_cell
from helpers.storepeer import STORE_PORT, plant

pytestmark = pytest.mark.timeout(240)

PREEMPT_KEYS = ("default_pg/0//nbtrain/preempt/{job}", "nbtrain/preempt/{job}")


def _planted(value: str) -> list[tuple[str, str]]:
    """``value`` under the preemption keys of jobs 1–20: every cell a warm pool runs for a while."""
    return [(key.format(job=job), value) for job in range(1, 21) for key in PREEMPT_KEYS]


def test_values_planted_in_the_store_neither_fail_nor_freeze_a_checkpoint_cell(fresh_pools, tmp_path):
    port = run_cell(fresh_pools, STORE_PORT, out="port")[0]["port"]  # a warm pool, its store listening
    cell = training_cell(tmp_path / "marks", epochs=2, samples=32, step_s=0.01)  # 4 steps an epoch per rank
    for value in ("x", "4"):  # a ValueError in every rank; both ranks saving at step 4 and waiting for ever
        assert plant(port, _planted(value)) == {"accepted": 2 * 20, "error": None}
        ckpt = tmp_path / f"ckpt-{value}"
        ns, result = run_cell(fresh_pools, cell, checkpoint=str(ckpt), out="steps")
        assert ns["steps"] == 8 and result.history.series("loss", rank=0).steps == list(range(8))
        saved = torch.load(ckpt / "checkpoint.pt", map_location="cpu", weights_only=False)
        assert saved["step"] == 8  # the last epoch's own checkpoint, not one at the planted step
