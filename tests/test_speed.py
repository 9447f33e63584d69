"""channels_last, --compile and --compile-fallback: the options, the conversion on CPU tensors and models,
and real ranks (2, gloo, CPU) running prepared models that way. torch.compile runs with the aot_eager
backend here, which traces and partitions as inductor does but generates no code (seconds, not minutes, on
CPU); inductor itself is measured by benchmarks/gpu_speed.py on GPUs."""

from __future__ import annotations

import pytest
import torch
from helpers.runhelp import Captured, run_cell
from IPython.core.error import UsageError

from nbtrain.kernel.diagnostics.failures import RankFailedError
from nbtrain.kernel.diagnostics.setup_facts import compile_seconds, setup_words
from nbtrain.kernel.lifecycle.entry import format_summary
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve
from nbtrain.kernel.magics import DistributedMagics
from nbtrain.rank.train import speed

pytestmark = pytest.mark.timeout(240)


def parsed(line: str) -> LaunchRequest:
    from nbtrain.wire.options import from_arguments

    return from_arguments(LaunchRequest, DistributedMagics.distributed.parser.parse_argstring(line))


def test_the_options_reach_the_training_settings(monkeypatch):
    for name in ("NBTRAIN_CHANNELS_LAST", "NBTRAIN_COMPILE"):
        monkeypatch.delenv(name, raising=False)
    train = resolve(parsed("2 --cpu")).train
    assert (train.channels_last, train.compile, train.compile_fallback) == (None, None, False)
    train = resolve(parsed("2 --cpu --compile --no-channels-last")).train
    assert (train.channels_last, train.compile, train.compile_fallback) == (False, "default", False)
    train = resolve(parsed("2 --cpu --channels-last --compile max-autotune --compile-fallback")).train
    assert (train.channels_last, train.compile, train.compile_fallback) == (True, "max-autotune", True)
    monkeypatch.setenv("NBTRAIN_CHANNELS_LAST", "off")
    monkeypatch.setenv("NBTRAIN_COMPILE", "reduce-overhead")
    train = resolve(parsed("2 --cpu")).train
    assert (train.channels_last, train.compile) == (False, "reduce-overhead")
    assert resolve(parsed("2 --cpu --channels-last")).train.channels_last is True  # the option wins


def test_compile_fallback_without_compile_is_refused_before_any_process():
    with pytest.raises(ConfigError, match="--compile-fallback says what to do when torch.compile fails, so it needs --compile"):
        resolve(LaunchRequest(cpu=True, compile_fallback=True))
    with pytest.raises(UsageError, match="argument --compile: invalid choice: 'fastest' .*'max-autotune'"):
        parsed("2 --compile fastest")


class Net(torch.nn.Module):
    """A conv net whose head flattens with view(): fine in NCHW, an error in channels_last."""

    def __init__(self, use_view: bool = False) -> None:
        super().__init__()
        self.use_view = use_view
        self.conv = torch.nn.Conv2d(3, 8, 1)  # a 1×1 convolution: its weight's strides are ambiguous
        self.conv3 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        x = self.conv3(torch.relu(self.conv(x)))
        return self.head(x.view(x.size(0), -1) if self.use_view else x.flatten(1))


def test_channels_last_is_automatic_for_conv_models_under_amp_on_gpus_only():
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")  # a device object: CUDA is not initialised
    conv, mlp = Net(), torch.nn.Linear(3, 3)
    assert speed.channels_last_wanted(None, gpu, torch.bfloat16, conv)
    assert not speed.channels_last_wanted(None, gpu, None, conv)  # fp32: no tensor-core layout to gain
    assert not speed.channels_last_wanted(None, cpu, torch.bfloat16, conv)
    assert not speed.channels_last_wanted(None, gpu, torch.bfloat16, mlp)
    assert speed.channels_last_wanted(True, cpu, None, conv)  # asked for: anywhere
    assert not speed.channels_last_wanted(True, cpu, None, mlp)  # nothing to convert
    assert not speed.channels_last_wanted(False, gpu, torch.bfloat16, conv)


def test_the_conversion_on_cpu_keeps_values_and_gives_outputs_in_the_default_layout():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 3, 6, 6)
    expected = model(x)
    speed.to_memory_format(model, channels_last=True)
    assert model.conv3.weight.is_contiguous(memory_format=torch.channels_last)
    (shaped,), _ = speed.inputs_to_channels_last((x,), {})
    assert shaped.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(model(shaped), expected)
    feature_map = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    out = speed.outputs_to_default_layout({"map": feature_map, "pair": (feature_map, 1)})
    assert out["map"].is_contiguous() and out["pair"][0].is_contiguous() and out["pair"][1] == 1
    torch.testing.assert_close(out["map"], feature_map)


def test_an_automatic_channels_last_steps_back_when_the_model_views_a_conv_output(capsys):
    model, x = Net(use_view=True), torch.randn(2, 3, 6, 6)
    expected = model(x)
    speed.to_memory_format(model, channels_last=True)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        model(x.contiguous(memory_format=torch.channels_last))  # what channels_last alone would do to this model
    chosen = speed.ModelSpeed(0, channels_last=True, auto=True, compile_choice=None, fallback=False, facts={})
    torch.testing.assert_close(chosen.first_forward(model, model, (x,), {}), expected)
    assert not chosen.channels_last and chosen.facts["channels_last"] is False
    assert model.conv.weight.is_contiguous()  # back in the default layout for the rest of the run
    assert "it calls .view() on a convolution's output" in capsys.readouterr().err
    asked = speed.ModelSpeed(0, channels_last=True, auto=False, compile_choice=None, fallback=False, facts={})
    speed.to_memory_format(model, channels_last=True)
    with pytest.raises(RuntimeError, match="view size is not compatible"):  # --channels-last given: the user's call
        asked.first_forward(model, model, (x,), {})


def test_setup_words_and_compile_time():
    setup = {0: [{"amp": "bf16", "channels_last": True, "compile": "default", "compile_s": 41.2}],
             1: [{"amp": "bf16", "channels_last": True, "compile": "default", "compile_s": 47.6}]}
    assert setup_words(setup) == ["bf16", "channels_last", "compiled (default) in 47.6 s"]
    assert compile_seconds(setup) == 47.6
    assert setup_words({0: [{"amp": "off", "channels_last": False, "compile": None}]}) == ["fp32"]
    assert setup_words({}) == []


CELL = """
import warnings
import torch, nbtrain
warnings.simplefilter("always")  # the DDP stride warning is shown once per process otherwise

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 1)
        self.conv3 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        return self.head(self.conv3(torch.relu(self.conv(x))).flatten(1))

torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
model, opt = nbtrain.prepare(net, opt)
for _ in range(3):
    x = torch.randn(4, 3, 6, 6).to(device)  # an ordinary batch, in the default layout
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
layout = net.conv3.weight.is_contiguous(memory_format=torch.channels_last)
bucket_views = model.gradient_as_bucket_view
compiled = net._compiled_call_impl is not None
keys = sorted(net.state_dict())
"""


def test_real_ranks_train_a_channels_last_compiled_model_and_say_so(pools):
    out = Captured()
    ns, result = run_cell(pools, CELL, channels_last=True, compile="aot_eager", write=out, out="layout,bucket_views,compiled,keys,net")
    assert (ns["layout"], ns["bucket_views"], ns["compiled"]) == (True, True, True)
    assert ns["keys"] == sorted(Net().state_dict()) and sorted(ns["net"].state_dict()) == ns["keys"]
    assert "Grad strides do not match bucket view strides" not in out.text()
    assert sorted(result.setup) == [0, 1] and result.setup[0][0]["compile_s"] > 0
    first = format_summary(result)[0]
    assert " · fp32 · channels_last · compiled (aot_eager) in " in first, first


def test_without_the_options_a_cpu_model_stays_as_it_was(pools):
    ns, result = run_cell(pools, CELL, out="layout,bucket_views,compiled")
    assert (ns["layout"], ns["bucket_views"], ns["compiled"]) == (False, False, False)
    assert " s (warm) · fp32 · back in the notebook" in format_summary(result)[0]


def test_warm_ranks_keep_the_compiled_code_for_the_next_cell(pools):
    cell = """
    import torch, nbtrain
    model = nbtrain.prepare(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.ReLU(), torch.nn.Flatten()))
    model(torch.randn(2, 3, 4, 4)).sum().backward()
    """
    _, cold = run_cell(pools, cell, compile="aot_eager", fresh=True, out="-")
    _, warm = run_cell(pools, cell, compile="aot_eager", out="-")
    assert not cold.warm and warm.warm
    cold_s, warm_s = compile_seconds(cold.setup), compile_seconds(warm.setup)
    assert cold_s is not None and warm_s is not None
    assert warm_s < cold_s / 5, (cold_s, warm_s)  # a cache hit takes milliseconds, a compile seconds


FAILING_BACKEND = """
from torch._dynamo.backends import registry

def no_compiler(graph, example_inputs):
    raise RuntimeError("the C++ compiler was not found")

registry.lookup_backend("aot_eager")  # torch registers its backends on first use: do that first
registry._COMPILER_FNS["aot_eager"] = no_compiler  # a backend that fails as inductor does without a compiler
"""


def test_a_compile_error_names_its_cause_and_falls_back_only_when_asked(pools):
    # The cell breaks its ranks' aot_eager on purpose: the failed run ends its pool, the second keeps none warm.
    with pytest.raises(RankFailedError) as failed:
        run_cell(pools, FAILING_BACKEND + CELL, compile="aot_eager", out="compiled")
    message = str(failed.value)
    assert "CompileError: torch.compile (--compile aot_eager) failed on the model's first forward" in message
    assert "the C++ compiler was not found" in message and "--compile-fallback" in message
    out = Captured()
    ns, result = run_cell(pools, FAILING_BACKEND + CELL, compile="aot_eager", compile_fallback=True, write=out,
                          out="compiled", keep_alive=0)
    assert ns["compiled"] is False
    assert "torch.compile failed (RuntimeError: the C++ compiler was not found); the model runs uncompiled" in out.text()
    assert "not compiled: torch.compile failed" in format_summary(result)[0]
