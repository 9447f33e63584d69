"""Launch configuration: devices, backend and rank count decided from NVML, and every mistake explained."""

from __future__ import annotations

import pytest
from helpers.fake_nvml import FakeGpu, install

from nbtrain.kernel.request import config as config_module
from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve


def gpus(n):
    return [FakeGpu(uuid=f"GPU-{i}aaa") for i in range(n)]


@pytest.fixture
def cuda_torch(monkeypatch):
    monkeypatch.setattr(config_module, "_torch_has_cuda", lambda: True)


def test_no_gpu_defaults_to_two_gloo_ranks_on_cpu(monkeypatch):
    install(monkeypatch, [])
    cfg = resolve(LaunchRequest())
    assert (cfg.pool.nprocs, cfg.pool.backend, cfg.pool.device_type) == (2, "gloo", "cpu")


def test_gpus_default_to_one_nccl_rank_each(monkeypatch, cuda_torch):
    install(monkeypatch, gpus(4))
    cfg = resolve(LaunchRequest())
    assert (cfg.pool.nprocs, cfg.pool.backend, cfg.pool.gpu_ids) == (4, "nccl", (0, 1, 2, 3))
    assert cfg.pool.rank_devices() == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def test_chosen_gpus_and_cuda_visible_devices(monkeypatch, cuda_torch):
    install(monkeypatch, gpus(4))
    assert resolve(LaunchRequest(gpus="0,2")).pool.gpu_ids == (0, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-1")
    assert resolve(LaunchRequest()).pool.gpu_ids == (3, 1)
    with pytest.raises(ConfigError, match=r"GPU 0 not found; the GPUs this kernel can use are: 3, 1"):
        resolve(LaunchRequest(gpus="0"))


def test_more_nccl_ranks_than_gpus_is_refused_but_gloo_may_share(monkeypatch, cuda_torch):
    install(monkeypatch, gpus(2))
    with pytest.raises(ConfigError, match="3 ranks on nccl need 3 GPUs, but only 2"):
        resolve(LaunchRequest(nprocs=3))
    cfg = resolve(LaunchRequest(nprocs=3, backend="gloo"))
    assert cfg.pool.rank_devices() == ["cuda:0", "cuda:1", "cuda:0"]


def test_cpu_build_of_torch_runs_on_cpu_with_a_note(monkeypatch):
    install(monkeypatch, gpus(1))
    monkeypatch.setattr(config_module, "_torch_has_cuda", lambda: False)
    cfg = resolve(LaunchRequest())
    assert cfg.pool.device_type == "cpu" and "no CUDA support" in cfg.notes[0]


def test_cpu_ranks_more_than_twice_the_cores_run_with_a_note_that_says_why_they_are_slow(monkeypatch):
    monkeypatch.setattr(config_module.os, "sched_getaffinity", lambda pid: {0, 1})  # a 2-core laptop
    assert resolve(LaunchRequest(cpu=True, nprocs=4)).notes == ()  # two ranks a core: no note
    note, = resolve(LaunchRequest(cpu=True, nprocs=16)).notes
    assert note == ("16 ranks on 2 CPU cores: the ranks take turns on the cores and every all-reduce waits for the "
                    "ones not running; %%distributed 2 would run faster here")


def test_cpu_flag_ignores_gpus(monkeypatch, cuda_torch):
    install(monkeypatch, gpus(2))
    cfg = resolve(LaunchRequest(cpu=True, nprocs=3))
    assert (cfg.pool.backend, cfg.pool.device_type, cfg.pool.gpu_ids) == ("gloo", "cpu", ())


@pytest.mark.parametrize("request_, message", [
    (LaunchRequest(nprocs=0), "at least 1"),
    (LaunchRequest(backend="mpi"), "Unknown backend"),
    (LaunchRequest(gpus="0,0"), "names a GPU twice"),
    (LaunchRequest(keep_alive=-1), "--keep-alive"),
    (LaunchRequest(env=("1X=2",)), "NAME=value"),
    (LaunchRequest(output="some"), "--output"),
    (LaunchRequest(nprocs=2, cpu=True, output="rank2"), "numbered 0 to 1"),
    (LaunchRequest(nodes="2:3", rdzv_host="127.0.0.1", cpu=True, detach=True),
     "starts its ranks once, on a fixed number of nodes"),
])
def test_mistakes_are_explained(monkeypatch, cuda_torch, request_, message):
    install(monkeypatch, gpus(2))
    with pytest.raises(ConfigError, match=message):
        resolve(request_)


def test_out_names(monkeypatch):
    install(monkeypatch, [])
    assert resolve(LaunchRequest(out="a, b")).out_names == ("a", "b")
    assert resolve(LaunchRequest(out="-")).out_names == ()
    assert resolve(LaunchRequest()).out_names is None


def test_output_names_one_rank_or_all(monkeypatch):
    install(monkeypatch, [])
    assert resolve(LaunchRequest(nprocs=2)).shown_rank is None
    assert resolve(LaunchRequest(nprocs=2, output="rank0")).shown_rank == 0
    assert resolve(LaunchRequest(nprocs=3, output="Rank 2")).output == "rank2"


def test_shared_server_gpus_auto_asks_for_one_free_gpu_per_rank_and_says_what_is_missing(monkeypatch, cuda_torch):
    install(monkeypatch, gpus(4))
    pool = resolve(LaunchRequest(nprocs=2, gpus="auto")).pool
    assert (pool.gpu_count, pool.gpu_ids, pool.backend, pool.device_type) == (2, (), "nccl", "cuda")
    with pytest.raises(ConfigError, match=r"needs the number of ranks: %%distributed 2 --gpus auto"):
        resolve(LaunchRequest(gpus="auto"))
    with pytest.raises(ConfigError, match="5 ranks need 5 GPUs, but this machine has 4"):
        resolve(LaunchRequest(nprocs=5, gpus="auto"))
    with pytest.raises(ConfigError, match="--gpu-timeout must be a positive number of seconds"):
        resolve(LaunchRequest(nprocs=2, gpus="auto", gpu_timeout=0))
    assert resolve(LaunchRequest(nprocs=2, gpus="auto", no_wait=True)).gpu_wait_s == 0.0
    monkeypatch.setenv("NBTRAIN_GPUS", "auto")  # set for a shared server: a cell's own --gpus and --cpu still win
    assert resolve(LaunchRequest(nprocs=2)).pool.gpu_count == 2
    assert resolve(LaunchRequest(nprocs=2, gpus="1,3")).pool.gpu_ids == (1, 3)
    assert resolve(LaunchRequest(nprocs=2, cpu=True)).pool.device_type == "cpu"


def test_shared_server_gpus_named_on_a_cpu_only_torch_are_leased_while_the_ranks_run_on_cpu(monkeypatch):
    install(monkeypatch, gpus(4))
    monkeypatch.setattr(config_module, "_torch_has_cuda", lambda: False)
    pool = resolve(LaunchRequest(nprocs=2, gpus="1,2")).pool
    assert (pool.gpu_ids, pool.device_type, pool.backend) == ((1, 2), "cpu", "gloo")
    assert pool.rank_devices() == ["cpu", "cpu"]
    assert resolve(LaunchRequest()).pool.gpu_ids == ()  # without --gpus nothing is leased, as before
