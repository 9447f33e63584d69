"""MFU: one step's FLOPs counted once on the rank, the achieved rate logged, the peak looked up, the summary's words."""

from __future__ import annotations

import re

import pytest
import torch
from helpers.runhelp import run_cell

import nbtrain
from nbtrain.gpu.peaks import dense_peak_tflops
from nbtrain.kernel.diagnostics.setup_facts import setup_words
from nbtrain.kernel.lifecycle.entry import format_summary
from nbtrain.rank.train import shard_meter, state, stepmeter

BATCH, WIDTH, LAYERS = 8, 64, 5


def linear_stack() -> torch.nn.Module:
    return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)))


def analytic_step_flops() -> int:
    """Forward 2·B·d² per layer; backward 2·B·d² for each weight's gradient and 2·B·d² for each layer's input
    gradient but the first's (the batch needs none)."""
    return BATCH * WIDTH * WIDTH * (6 * LAYERS - 2)


@pytest.fixture
def context():
    with state.scope(None, torch.device("cpu"), rank=0, world_size=1) as ctx:
        yield ctx


def one_step(model, opt) -> None:
    model(torch.randn(BATCH, WIDTH)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_one_steps_flops_equal_the_analytic_count_of_a_linear_stack(context):
    model = linear_stack()
    model, opt = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    one_step(model, opt)
    assert context.meter.flops.per_step == analytic_step_flops()
    assert not context.meter.flops.counting and torch._C._len_torch_dispatch_stack() == 0
    one_step(model, opt)  # counted once: the later steps are only timed
    assert context.meter.flops.per_step == analytic_step_flops()


COMPILERS = [
    lambda model: torch.compile(model, fullgraph=True, backend="eager"),  # an OptimizedModule
    lambda model: model[0].compile(fullgraph=True, backend="eager") or model,  # a block compiled in place
]


@pytest.mark.parametrize("compile_it", COMPILERS)
def test_a_compiled_model_is_counted_on_a_meta_copy_and_trains_compiled(context, compile_it):
    """Under the count's dispatch mode Dynamo would run nothing compiled, and fullgraph=True would raise: each
    forward of the first step is counted on a meta-device copy instead, the real one runs compiled."""
    from torch._dynamo.utils import counters

    counters.clear()
    model = compile_it(linear_stack())
    model, opt = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    one_step(model, opt)
    assert counters["stats"]["unique_graphs"] >= 1  # the first step itself ran compiled
    one_step(model, opt)
    assert context.meter.flops.per_step == analytic_step_flops(), context.meter.flops.uncounted
    assert torch._C._len_torch_dispatch_stack() == 0


def test_the_meta_copy_leaves_the_models_hooks_and_parameters_alone(context):
    torch._dynamo.reset()  # Dynamo does not guard on hooks: a graph of an earlier test's stack would skip this one's
    model = COMPILERS[0](linear_stack())
    seen = []
    model._orig_mod[1].register_forward_hook(lambda module, args, out: seen.append(out.device.type))
    before = [p.detach().clone() for p in model.parameters()]
    model, opt = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    model(torch.randn(BATCH, WIDTH)).sum().backward()
    assert seen == ["cpu"]  # the real forward's only: the copy's forward ran without the cell's hook
    assert all(p.device.type == "cpu" and p.grad is not None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # no step taken yet


@pytest.mark.parametrize("compile_it", [lambda model: model, COMPILERS[0]], ids=["eager", "compiled"])
def test_an_accumulation_window_counts_as_one_step(compile_it):
    """Eager: one count around the window; compiled: each of its forwards counted on a meta-device copy."""
    with state.scope(state.TrainSettings(grad_accum=3), torch.device("cpu"), rank=0, world_size=1) as context:
        model = compile_it(linear_stack())
        model, opt = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
        for _ in range(3):
            nbtrain.backward(model(torch.randn(BATCH, WIDTH)).sum())
            opt.step()
            opt.zero_grad()
        assert context.step == 1 and context.meter.flops.per_step == 3 * analytic_step_flops()


class NeedsValues(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.layer(x) * float(x.abs().max().item() > 0)  # a real value: no meta-device copy runs this


def test_a_compiled_model_the_meta_copy_cannot_run_is_not_counted_and_says_why(context):
    model = torch.compile(NeedsValues(), backend="eager")
    model, opt = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    one_step(model, opt)
    assert context.meter.flops.per_step is None
    assert context.meter.flops.uncounted.startswith("a compiled model's FLOPs could not be counted on a meta-device "
                                                   "copy ("), context.meter.flops.uncounted


def test_a_step_with_an_uncompiled_and_a_compiled_model_runs_and_is_not_counted(context):
    plain, compiled = linear_stack(), COMPILERS[0](linear_stack())
    plain, compiled, opt = nbtrain.prepare(plain, compiled, torch.optim.SGD(
        [*plain.parameters(), *compiled.parameters()], lr=0.01))
    compiled(plain(torch.randn(BATCH, WIDTH))).sum().backward()  # the mode, opened by plain, closes before compiled
    opt.step()
    assert context.meter.flops.uncounted == "a step with a compiled and an uncompiled model is not counted"
    assert torch._C._len_torch_dispatch_stack() == 0


def test_without_a_prepared_optimizer_nothing_is_counted_and_no_dispatch_mode_stays_open(context):
    """No prepared optimizer: no step is timed, and a count no step closes would slow every op of the cell."""
    model = nbtrain.prepare(linear_stack())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # built after prepare(), and not prepared
    for _ in range(3):
        one_step(model, opt)
    assert not context.meter.flops.counting and torch._C._len_torch_dispatch_stack() == 0


def test_an_evaluation_forward_never_starts_the_count(context):
    model = linear_stack()
    model, _ = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    with torch.no_grad():
        model(torch.randn(BATCH, WIDTH))
    assert not context.meter.flops.counting and torch._C._len_torch_dispatch_stack() == 0


def test_a_count_no_step_closes_is_dropped_when_the_cell_ends():
    with state.scope(None, torch.device("cpu"), rank=0, world_size=1) as context:
        model = linear_stack()
        model, _ = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
        model(torch.randn(BATCH, WIDTH)).sum().backward()  # the cell ends before the optimizer steps
        assert context.meter.flops.counting
    assert torch._C._len_torch_dispatch_stack() == 0  # no dispatch mode left slowing the rank's next cell
    assert context.meter.flops.per_step is None and "no optimizer step" in context.meter.flops.uncounted


def test_mfu_is_the_achieved_rate_over_the_peak_and_data_wait_the_share_of_the_step():
    meter = stepmeter.StepMeter(rank=0, precision="bf16", peak_tflops=989.4, on_cpu=False)
    meter.flops.per_step = 4 * 10**12  # 4 TFLOP a step
    window = stepmeter._Window()
    window.seconds, window.steps, window.data_s = 2.0, 100, 0.5  # 50 steps/s, a quarter of it waiting for data
    rates = meter.rates(window)
    assert rates["tflops"] == pytest.approx(200.0) and rates["mfu"] == pytest.approx(100 * 200 / 989.4)
    assert rates["data_wait"] == pytest.approx(25.0)
    assert "mfu" not in stepmeter.StepMeter(0, "fp32", None, on_cpu=True).rates(window)


@pytest.mark.parametrize(("name", "precision", "peak"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA H200", "tf32", 494.7),
    ("NVIDIA GH200 480GB", "fp16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA L40S", "bf16", 362.05),
    ("NVIDIA L4", "fp32", 30.3),
    ("Tesla V100-SXM2-16GB", "bf16", None),  # no bf16 tensor cores: no peak, not fp16's
    ("NVIDIA L40", "bf16", None),  # not L40S, not L4
    ("NVIDIA A10G", "bf16", None),  # not in the table: unknown, never a guess
])
def test_the_peak_is_looked_up_by_the_gpus_name(name, precision, peak):
    assert dense_peak_tflops(name, precision) == peak


def test_the_summary_says_mfu_or_why_there_is_none():
    def words(**fact):
        return setup_words({0: [{"model": 0, "amp": "bf16"}, {"precision": "bf16", "steps_timed": 20, **fact}]})
    assert words(tflops=406.0, mfu=41.03, peak_tflops=989.4)[-1] == ("MFU 41 % (406 TFLOP/s of bf16's dense peak "
                                                                     "989 TFLOP/s)")
    assert words(tflops=0.0123, peak_tflops=None, on_cpu=True)[-1] == "12 GFLOP/s per rank (no MFU on the CPU)"
    assert words(tflops=0.0093, peak_tflops=None, on_cpu=True)[-1] == "9.3 GFLOP/s per rank (no MFU on the CPU)"
    assert words(tflops=80.0, peak_tflops=None, on_cpu=False)[-1] == "80 TFLOP/s per rank (MFU: this GPU's peak is unknown)"
    # a small model on a laptop CPU: its own unit, not "0.0 GFLOP/s"
    assert words(tflops=3.1e-7, peak_tflops=None, on_cpu=True)[-1] == "310 kFLOP/s per rank (no MFU on the CPU)"
    assert words(tflops=4.2e-6, peak_tflops=None, on_cpu=True)[-1] == "4.2 MFLOP/s per rank (no MFU on the CPU)"
    assert words(flops_uncounted="a compiled model's FLOPs are not counted")[-1] == (
        "MFU not measured: a compiled model's FLOPs are not counted")
    assert words(tflops=1.0)[0] == "bf16"  # the step meter's fact is not taken for a model
    assert words(tflops=1.0, steps_timed=3) == ["bf16"]  # three steps say nothing of a rate
    assert words(tflops=1.0, data_wait=38.2, on_cpu=True)[-1] == "38 % of each step waiting for data"
    assert "waiting for data" not in " ".join(words(tflops=1.0, data_wait=6.0, on_cpu=True))
    assert words(tflops=406.0, mfu=41.03, peak_tflops=989.4, samples_per_s=4120.4, tokens_per_s=2.1e6)[-3:] == [
        "MFU 41 % (406 TFLOP/s of bf16's dense peak 989 TFLOP/s)", "4,120 samples/s", "2.1 M tokens/s"]
    split = {"data": 38.2, "forward": 30.4, "backward": 24.9, "optimizer": 5.8, "other": 0.7}
    assert words(tflops=1.0, data_wait=38.2, split=split, on_cpu=True)[-1] == (
        "each step: 38 % data · 30 % forward · 25 % backward · 6 % optimizer")  # under 1 %: left out


TRAIN_ABOUT_3_S = """
started, step = time.monotonic(), 0
while True:  # about 3 s (the rate is logged per 2-second window), every rank stopping after the same step
    LOSS.backward()
    opt.step()
    opt.zero_grad()
    step += 1
    if step % 20 == 0:
        over = torch.tensor(float(time.monotonic() - started > 3))
        dist.all_reduce(over, op=dist.ReduceOp.MAX)
        if over.item():
            break
"""


CELL = """
import time, torch, nbtrain
import torch.distributed as dist
model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
model, opt = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.001))
""" + TRAIN_ABOUT_3_S.replace("LOSS", "model(torch.randn(32, 256)).pow(2).mean()")


def test_a_training_cell_logs_its_achieved_rate_and_the_summary_says_it(pools):
    _, result = run_cell(pools, CELL)
    tflops = result.history.series("tflops", rank=0).values
    assert tflops and all(v > 0 for v in tflops)
    assert "mfu" not in result.history  # no peak on the CPU
    summary = format_summary(result)[0]
    assert "FLOP/s per rank (no MFU on the CPU)" in summary


SLOW_LOADER_CELL = """
import time, torch, nbtrain

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 512
    def __getitem__(self, i):
        time.sleep(0.01)  # a slow disk, or a costly decode
        return torch.randn(16)

model = torch.nn.Linear(16, 1)
loader = torch.utils.data.DataLoader(Slow(), batch_size=4)
model, opt, loader = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01), loader)
for step, batch in enumerate(loader):
    model(batch).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if step == 60:
        break
"""


def test_steps_that_wait_for_their_batches_say_so_and_the_advisor_names_the_loader(pools):
    _, result = run_cell(pools, SLOW_LOADER_CELL)
    fact = next(f for f in result.setup[0] if "data_wait" in f)
    assert fact["data_wait"] > 50 and fact["steps_timed"] >= 50
    # 2 ranks × 4 samples a step, each step at least the 4 × 10 ms its batch sleeps: at most 200 samples/s
    assert 40 < fact["samples_per_s"] <= 200 and "tokens_per_s" not in fact, fact
    split = fact["split"]  # percent of the step: the data wait, then the phases the prepared objects timed
    assert list(split) == ["data", "forward", "backward", "comm", "optimizer", "other"]
    assert split["data"] == pytest.approx(fact["data_wait"])
    assert all(split[phase] > 0 for phase in ("forward", "backward", "comm", "optimizer")), split
    assert sum(split.values()) == pytest.approx(100.0, abs=0.01)
    assert split["other"] < 10, split  # the loop holds nothing else: the timed phases are nearly the whole step
    lines = format_summary(result)
    assert f"each step: {split['data']:.0f} % data · " in lines[0], lines
    hint = next(line for line in lines if "waited for data" in line)
    assert "(a DataLoader with no workers): raise num_workers (4 or more)" in hint, hint


@pytest.mark.slow
def test_the_step_split_under_accumulation_counts_each_micro_steps_backward_apart_from_the_next_batchs_wait(pools):
    cell = SLOW_LOADER_CELL.replace("model(batch).pow(2).mean().backward()", "nbtrain.backward(model(batch).pow(2).mean())")
    _, result = run_cell(pools, cell, grad_accum=2)
    split = next(f for f in result.setup[0] if "split" in f)["split"]
    assert split["data"] > 50 and 0 < split["backward"] < 20, split  # the wait between micro-steps is data's
    assert sum(split.values()) == pytest.approx(100.0, abs=0.01) and split["other"] < 10, split


def test_the_final_picture_draws_each_ranks_step_split_as_a_stacked_bar():
    from matplotlib import colors as matplotlib_colors

    from nbtrain.kernel.dashboard.final import Beside, final_figure
    from nbtrain.kernel.dashboard.metric_store import MetricStore
    from nbtrain.kernel.dashboard.step_split import PHASE_COLORS
    from nbtrain.kernel.diagnostics.setup_facts import splits_of
    from nbtrain.kernel.dashboard.telemetry_series import TelemetrySeries

    split = {"data": 60.0, "forward": 20.0, "backward": 12.0, "comm": 3.0, "optimizer": 4.0, "other": 1.0}
    setup = {0: [{"model": 0}, {"precision": "fp32", "split": split}],
             1: [{"precision": "fp32", "split": {**split, "data": 15.0, "other": 46.0}}], 2: [{"model": 0}]}
    splits = splits_of(setup)
    assert list(splits) == [0, 1]  # rank 2 sent no split: no bar
    ax, = final_figure(MetricStore(), TelemetrySeries(), "run", beside=Beside(splits=splits)).axes
    bars = ax.patches
    assert len(bars) == 2 * 6
    widths = [(round(bar.get_y() + bar.get_height() / 2), bar.get_width()) for bar in bars]
    assert widths[:6] == [(0, 60.0), (0, 20.0), (0, 12.0), (0, 3.0), (0, 4.0), (0, 1.0)]
    assert [matplotlib_colors.to_hex(bar.get_facecolor()) for bar in bars[:6]] == list(PHASE_COLORS.values())
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(split)
    assert "60%" in [t.get_text() for t in ax.texts] and "4%" not in [t.get_text() for t in ax.texts]


def test_a_batch_counts_its_samples_and_token_ids_count_as_tokens():
    from nbtrain.rank.train.stepmeter import samples_and_tokens

    ids = torch.randint(0, 1000, (8, 128))
    assert samples_and_tokens(ids) == (8, 8 * 128)
    assert samples_and_tokens({"input_ids": ids, "labels": ids}) == (8, 8 * 128)  # a Hugging Face batch
    assert samples_and_tokens((torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))) == (16, 0)  # images
    assert samples_and_tokens(["no", "tensor"]) == (0, 0)


SHARDED_CELL = f"""
import time, torch, nbtrain
import torch.distributed as dist
from nbtrain.rank.train.state import current
torch.manual_seed(0)
model = torch.nn.Sequential(*(torch.nn.Linear({WIDTH}, {WIDTH}, bias=False) for _ in range({LAYERS})))
model, opt = nbtrain.prepare(model, torch.optim.SGD(model.parameters(), lr=0.001))
""" + TRAIN_ABOUT_3_S.replace("LOSS", f"model(torch.randn({BATCH}, {WIDTH})).sum()") + """
flops = current().meter.flops.per_step
"""


def test_a_sharded_models_step_is_counted_as_a_ddp_models_is_and_its_forward_timed(pools):
    ns, result = run_cell(pools, SHARDED_CELL, shard="full")
    # FSDP2 computes each rank's own batch through the gathered parameters: the FLOPs of the whole model
    assert ns["flops"] == analytic_step_flops()
    assert all(v > 0 for v in result.history.series("tflops", rank=0).values)
    summary = format_summary(result)[0]
    assert "FLOP/s per rank (no MFU on the CPU)" in summary and "not measured" not in summary, summary
    assert re.search(r"each step: .*\d+ % forward", summary), summary


def test_a_sharded_model_under_activation_checkpointing_is_not_counted_and_says_why():
    settings = state.TrainSettings(activation_checkpointing=True)
    with state.scope(settings, torch.device("cpu"), rank=0, world_size=1) as context:
        shard_meter.watch(context, linear_stack())
        assert context.meter.flops.uncounted == shard_meter.RECOMPUTED
    words = setup_words({0: [{"model": 0, "amp": "off"}, {"precision": "fp32", "steps_timed": 20,
                                                          "flops_uncounted": shard_meter.RECOMPUTED}]})
    assert words[-1].startswith("MFU not measured: activation checkpointing runs each block's forward again")
