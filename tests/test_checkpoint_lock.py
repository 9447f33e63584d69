"""Two notebooks, one --checkpoint folder: the second cell is refused while the first runs (two real kernels)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers.kernelhelp import Kernel
from helpers.workers import assert_no_workers

pytestmark = [pytest.mark.usefixtures("no_leftover_workers"), pytest.mark.timeout(300)]

TRAINING = """%%distributed 2 --cpu --checkpoint {folder}
import os, time, torch, nbtrain
net = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
model, opt = nbtrain.prepare(net, opt)
for epoch in nbtrain.epochs(2):
    nbtrain.backward(model(torch.ones(4, 2)).sum()); opt.step(); opt.zero_grad()
    nbtrain.save_checkpoint()
    print(f"saved epoch {{epoch}}", flush=True)
    while epoch == 0 and not os.path.exists({release!r}):
        time.sleep(0.1)
"""


def test_a_second_notebook_is_refused_the_folder_a_running_cell_holds(tmp_path):
    folder, release = tmp_path / "ckpt", str(tmp_path / "release")
    cell = TRAINING.format(folder=folder, release=release)
    first, second = Kernel(notebook="first.ipynb"), Kernel(notebook="second.ipynb")
    try:
        first.run("%load_ext nbtrain")
        second.run("%load_ext nbtrain")
        running = first.start(cell)
        first.collect(running, 120, until=lambda out: "saved epoch 0" in out)

        began = time.monotonic()
        reply, out = second.execute(cell)
        assert time.monotonic() - began < 10, "refused at once, not after starting ranks"
        assert reply["status"] == "error"
        assert f"--checkpoint {folder} is in use by the notebook first.ipynb (kernel pid {first.pid()})" in out, out
        assert "saved epoch" not in out and "resuming" not in out, out  # no rank ran the cell

        open(release, "w").close()
        reply, out = first.collect(running, 120)
        assert reply["status"] == "ok" and "saved epoch 1" in out, out
        out = second.run(cell)  # the folder is free again: the second notebook resumes where the first ended
        assert "resuming from" in out and "(epoch 2," in out, out

        os.unlink(release)  # the first notebook holds the folder again, then its kernel is killed
        running = first.start(cell.replace("--checkpoint", "--no-resume --checkpoint"))
        first.collect(running, 120, until=lambda out: "saved epoch 0" in out)
        os.kill(first.pid(), signal.SIGKILL)
        first.km.provisioner.process.wait(10)
        out = second.run(f"%%distributed 2 --cpu --checkpoint {folder}\nprint('the folder is free')")
        assert "the folder is free" in out, out
        second.execute("%distributed_shutdown")
        assert_no_workers(timeout=15)  # the dead kernel's ranks went by themselves
    finally:
        first.shutdown()
        second.shutdown()
