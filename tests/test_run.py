"""Cells on real ranks (2 spawned processes, gloo): names in, results out, output, failures, warm re-runs."""

from __future__ import annotations

import os
import time

import pytest
import torch
from helpers.runhelp import Captured, notebook, run_cell

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.request.inputs import PayloadError

pytestmark = pytest.mark.usefixtures("no_leftover_workers")


NOTEBOOK = """
import torch

class Scale(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = torch.nn.Parameter(torch.tensor(float(k)))

    def forward(self, x):
        return self.k * x

def double(v):
    return 2 * v

inc = lambda v: v + 1
X = torch.arange(4.0)
"""


def test_notebook_class_function_lambda_and_tensor_reach_the_ranks(fresh_pools):
    ns = notebook(NOTEBOOK)
    Scale = ns["Scale"]
    out = Captured()
    ns, result = run_cell(fresh_pools, """
        import torch.distributed as dist
        model = Scale(3)
        total = torch.tensor([inc(double(float(rank)))])
        dist.all_reduce(total)
        y = model(X)
        print("rank", rank, "of", world_size, "on", device, "total", total.item())
    """, ns, write=out)
    assert ns["total"].item() == 1 + 3  # (0*2+1) + (1*2+1)
    assert torch.equal(ns["y"], torch.arange(4.0) * 3)
    assert isinstance(ns["model"], Scale) and ns["model"].k.item() == 3.0
    assert "rank 0 of 2 on cpu total 4.0" in out.text("stdout")
    assert "[rank 1] rank 1 of 2 on cpu total 4.0" in out.text("stdout")
    assert set(result.returned) == {"dist", "model", "total", "y"}


def test_ddp_model_comes_back_unwrapped_and_trained(fresh_pools):
    ns = {"torch": torch}
    run_cell(fresh_pools, """
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        net = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        x = torch.randn(64, 4) + rank
        for _ in range(20):
            loss = ((net(x) - 1) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        final_loss = loss.item()
    """, ns, out="net,final_loss")
    assert type(ns["net"]) is torch.nn.Linear
    assert set(ns) == {"torch", "net", "final_loss"}
    assert ns["final_loss"] < 1.0


def test_large_tensors_are_shared_not_copied_per_rank(fresh_pools):
    big = torch.randn(4_000_000)  # 16 MB: travels through /dev/shm, mapped copy-on-write by each rank
    ns = {"big": big, "torch": torch}
    run_cell(fresh_pools, """
        ptr = big.data_ptr()
        mapped = [l for l in open("/proc/self/maps") if "nbtrain-" in l]
        in_shm = any(int(l.split("-")[0], 16) <= ptr < int(l.split()[0].split("-")[1], 16) for l in mapped)
        checksum = float(big.sum())
        big.mul_(0)   # private pages: neither the other rank nor the notebook sees this
        import torch.distributed as dist
        dist.barrier()
        other_ok = float(big.sum()) == 0.0
    """, ns, out="in_shm,checksum,other_ok")
    assert ns["in_shm"] is True
    assert ns["checksum"] == pytest.approx(float(big.sum()), rel=1e-4)
    assert ns["big"] is big and float(big.abs().sum()) > 0  # the notebook's tensor is untouched
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"nbtrain-{os.getpid()}-")]


def test_unsendable_variable_is_named_before_any_process_starts(fresh_pools):
    import threading

    ns = {"lock": threading.Lock(), "n": 3}
    with pytest.raises(PayloadError, match=r"'lock' \(_thread.lock\)") as err:
        run_cell(fresh_pools, "with lock:\n    m = n + 1\n", ns)
    assert "Create it inside the %%distributed cell" in str(err.value)
    assert fresh_pools.pool is None and "m" not in ns


def test_exception_on_one_rank_stops_the_others_and_maps_the_cell_line(fresh_pools):
    ns = {"torch": torch}
    started = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        run_cell(fresh_pools, """
            import torch.distributed as dist
            x = 1
            if rank == 1:
                raise ValueError("bad batch on rank 1")
            dist.barrier()   # rank 0 waits here for a rank that will never come
            never = True
        """, ns)
    elapsed = time.monotonic() - started
    report = str(err.value)
    assert err.value.rank == 1 and err.value.remote_type == "ValueError"
    assert "rank 1 raised ValueError: bad batch on rank 1" in report
    assert "Cell line 5, in <module>" in report  # the %%distributed line is line 1
    assert 'raise ValueError("bad batch on rank 1")' in report
    assert "Rank 0 was stopped" in report
    assert "never" not in ns and fresh_pools.pool is None
    assert elapsed < 15  # not the collective timeout (600 s)


def test_a_rank_killed_by_a_signal_is_named_with_it(fresh_pools):
    started = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        run_cell(fresh_pools, """
            import os, signal, time
            import torch.distributed as dist
            print("about to go", flush=True)
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.barrier()
        """)
    report = str(err.value)
    assert "rank 1 was killed by SIGKILL" in report and "out-of-memory killer" in report
    assert "about to go" in report  # its last output is quoted
    assert time.monotonic() - started < 15


def test_a_rank_that_exits_with_a_code(fresh_pools):
    with pytest.raises(RankFailedError, match="rank 0 exited with code 3"):
        run_cell(fresh_pools, "import os\nif rank == 0:\n    os._exit(3)\nimport time; time.sleep(30)\n")


def test_warm_rerun_reuses_the_ranks_and_starts_fast(fresh_pools):
    run_cell(fresh_pools, "a = 1")
    pids = fresh_pools.pool.pids()
    timings = []
    for i in range(3):
        t = time.monotonic()
        ns, result = run_cell(fresh_pools, f"b = {i} + rank")
        timings.append(time.monotonic() - t)
        assert result.warm and ns["b"] == i
    assert fresh_pools.pool.pids() == pids
    assert min(timings) < 0.5, timings


def test_fresh_namespace_per_cell(fresh_pools):
    run_cell(fresh_pools, "leftover = 42")
    with pytest.raises(RankFailedError, match="NameError"):
        run_cell(fresh_pools, "print(leftover)")


def test_pasted_torchrun_script_runs_unchanged(fresh_pools):
    script = '''
        import os
        import torch
        import torch.distributed as dist

        def main():
            dist.init_process_group(backend="gloo")
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local_rank = int(os.environ["LOCAL_RANK"])
            assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"] != "29500"
            t = torch.tensor([rank + 1.0])
            dist.all_reduce(t)
            print(f"[{rank}/{world}] sum={t.item()}")
            dist.destroy_process_group()
            return t.item()

        if __name__ == "__main__":
            result = main()
    '''
    out = Captured()
    ns, _ = run_cell(fresh_pools, script, write=out)
    assert ns["result"] == 3.0
    assert "[0/2] sum=3.0" in out.text() and "[rank 1] [1/2] sum=3.0" in out.text()
    ns, _ = run_cell(fresh_pools, "import torch.distributed as dist\nok = dist.is_initialized()")
    assert ns["ok"] is True  # the script's destroy_process_group() left the warm group alive


def test_asking_for_another_backend_is_explained(fresh_pools):
    with pytest.raises(RankFailedError, match="--backend nccl"):
        run_cell(fresh_pools, "import torch.distributed as dist\ndist.init_process_group('nccl')\n")


def test_tqdm_and_stderr_reach_the_cell_and_nothing_is_lost(fresh_pools):
    out = Captured()
    run_cell(fresh_pools, """
        import sys
        from tqdm import tqdm
        for _ in tqdm(range(50), desc="epoch", mininterval=0):
            pass
        for i in range(2000):
            print(i)
        sys.stdout.write("no newline at the end");  # `;`: its value (21) is not shown, as in a notebook
    """, write=out, output="rank0")
    err, std = out.text("stderr"), out.text("stdout")
    assert "\r" in err and "epoch: 100%" in err and "[rank 1]" not in err
    numbers = [s for s in std.splitlines() if s.isdigit()]
    assert numbers == [str(i) for i in range(2000)]
    assert std.endswith("no newline at the end\n")  # ended, so the summary starts its own line
    assert "nbtrain-end" not in std and "\x1e" not in std


def test_tqdm_bars_of_two_ranks_do_not_draw_over_each_other(fresh_pools):
    out = Captured()
    run_cell(fresh_pools, """
        import time
        from tqdm import tqdm
        for _ in tqdm(range(30), desc=f"bar of rank {rank}", mininterval=0, ascii=True):
            time.sleep(0.02)  # a bar that moves while the kernel reads it
    """, write=out)
    raw, lines = out.text("stderr"), [line for line in out.lines("stderr") if line.strip()]
    assert raw.count("\rbar of rank 0:") > 3  # rank 0's bar is drawn live
    assert raw.count("[rank 1] bar of rank 1:") == 1  # rank 1's: once, when finished (above rank 0's, if still live)
    assert len(lines) == 3, lines
    assert sorted(line[:30] for line in lines[:2]) == ["[rank 1] bar of rank 1: 100%|#", "bar of rank 0: 100%|##########"]
    assert "`--output rank1` shows rank 1's output live" in lines[2]
    out = Captured()
    run_cell(fresh_pools, """
        from tqdm import tqdm
        for _ in tqdm(range(40), desc=f"bar of rank {rank}", mininterval=0, ascii=True):
            pass
    """, write=out, output="rank1")
    assert out.text("stderr").count("\r[rank 1] bar of rank 1:") > 40 and "rank 0" not in out.text()


def test_pool_shutdown_leaves_no_process(fresh_pools):
    run_cell(fresh_pools, "x = 1")
    pids = fresh_pools.pool.pids()
    assert fresh_pools.shutdown() is True
    import psutil

    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_results_keep_sharing_and_unsendable_values_are_skipped(fresh_pools):
    ns, result = run_cell(fresh_pools, """
        import threading
        net = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        lock = threading.Lock()
    """, {"torch": torch})
    assert ns["opt"].param_groups[0]["params"][0] is ns["net"].weight
    assert "lock" not in ns and "cannot be pickled" in result.skipped["lock"]


def test_a_failure_shows_where_the_other_ranks_were(fresh_pools):
    with pytest.raises(RankFailedError) as err:
        run_cell(fresh_pools, """
            import torch.distributed as dist
            if rank == 1:
                raise ValueError("boom")
            dist.barrier()
        """)
    assert err.value.whereabouts == {0: "waiting in barrier() (torch.distributed), from cell line 5: dist.barrier()"}
    assert "Where the other ranks were:" in str(err.value)


def test_a_hang_ends_at_the_timeout_and_names_the_stuck_rank(fresh_pools):
    with pytest.raises(RankFailedError) as err:
        run_cell(fresh_pools, """
            import time
            import torch.distributed as dist
            if rank == 1:
                while True:          # a rank that never reaches the collective
                    time.sleep(0.1)
            dist.barrier()
        """, timeout=3)
    report = str(err.value)
    assert "longer than the process group's timeout" in report
    assert err.value.whereabouts == {1: "at cell line 6: time.sleep(0.1)"}


def test_a_name_asked_for_but_never_assigned_is_reported(fresh_pools):
    ns, result = run_cell(fresh_pools, "model = rank", out="model,modle")
    assert ns["model"] == 0 and "modle" not in ns
    assert result.skipped == {"modle": "not defined on rank 0 when the cell ended"}


def test_a_one_rank_run_says_1_rank(fresh_pools):
    from nbtrain.kernel.lifecycle.entry import format_summary

    ns, result = run_cell(fresh_pools, "x = world_size", nprocs=1)
    assert ns["x"] == 1 and format_summary(result)[0].startswith("nbtrain: 1 rank · gloo · cpu")


def test_every_unsendable_variable_is_named_and_a_functions_bad_global_too(fresh_pools):
    ns = notebook("""
        import threading
        lock = threading.Lock()
        rows = (i for i in range(3))
        def train(x):
            with lock:
                return x
        def make_step():
            guard = threading.Lock()
            def step(x):
                with guard:
                    return x
            return step
        step = make_step()
    """)
    with pytest.raises(PayloadError) as err:
        run_cell(fresh_pools, "with lock:\n    m = list(rows)\n", ns)
    message = str(err.value)
    assert "Cannot send 2 notebook variables" in message
    assert "'lock' (_thread.lock): TypeError: cannot pickle '_thread.lock' object" in message
    assert "'rows' (generator): TypeError: cannot pickle 'generator' object" in message
    with pytest.raises(PayloadError, match=r"'train' \(function\) to the ranks: it uses the global 'lock' "
                                           r"\(_thread.lock\), which cannot be pickled"):
        run_cell(fresh_pools, "y = train(1)\n", ns)
    with pytest.raises(PayloadError, match=r"'step' \(function\) to the ranks: it uses the captured variable "
                                           r"'guard' \(_thread.lock\)"):
        run_cell(fresh_pools, "y = step(1)\n", ns)
    assert fresh_pools.pool is None


def test_memory_is_released_before_the_reply(fresh_pools):
    """A cell's garbage (here a reference cycle) is collected before the rank replies: its finaliser's
    output belongs to this cell, and the next cell sees nothing of it. On the CPU, CUDA stays untouched."""
    released = Captured()
    run_cell(fresh_pools, """
        class Cycle:
            def __del__(self):
                print(f"released on rank {rank}")
        a = Cycle(); a.me = a
        del a
        """, write=released)
    assert "released on rank 0" in released.text("stdout")
    assert "[rank 1] released on rank 1" in released.text("stdout")
    later = Captured()
    run_cell(fresh_pools, "import torch; print('cuda initialised:', torch.cuda.is_initialized())", write=later)
    assert "released" not in later.text()
    assert "cuda initialised: False" in later.text()


def test_the_loop_does_not_wake_on_a_timer_while_every_rank_runs_the_cell(fresh_pools, monkeypatch):
    """With a rank on every core, each wakeup of the kernel's loop is CPU a rank loses: while the ranks
    run the cell and nothing is timed, only their output and messages wake it (and the stop button)."""
    from nbtrain.kernel.ranks import pool as pool_module

    run_cell(fresh_pools, "x = 1")  # start the ranks first: start-up is timed, and polled more often
    waits = []
    poll = pool_module.LocalPool.poll_events

    def recorded(self, timeout):
        waits.append(timeout)
        return poll(self, timeout)

    monkeypatch.setattr(pool_module.LocalPool, "poll_events", recorded)
    started = time.monotonic()
    run_cell(fresh_pools, "import time\ntime.sleep(2.0)")
    seconds = time.monotonic() - started
    assert len(waits) <= seconds / 0.5 + 8, f"{len(waits)} wakeups in {seconds:.1f} s: {waits}"  # not 10 a second
