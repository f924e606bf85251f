"""Shared config checks: devices and GPUs asked for must exist (Ray would wait for them forever), and CUDA
clients hold GPU shares."""

from __future__ import annotations

import pytest
import torch

from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, build
from simulations.runner.config_checks import check_devices, clients_device
from simulations.runner import EngineSettings
from strategies.arrays import initial_arrays

HAS_CUDA = torch.cuda.is_available() and torch.cuda.device_count() > 0


def test_cpu_is_always_fine_and_bad_devices_are_named():
    check_devices("cpu", 0.0)
    check_devices("cpu", 1.0, ray_address="auto")  # an existing cluster's GPUs count, not this machine's
    for bad in ("gpu0", 3, "mps"):
        with pytest.raises(ValueError, match="device: expected"):
            check_devices(bad, 0.0)
    with pytest.raises(ValueError, match="device: 'cuda:7' asked for, but this machine has"):
        check_devices("cuda:7", 0.0)


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusals of a machine without a GPU")
def test_without_a_gpu_cuda_and_gpu_clients_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="device: 'cuda' asked for, but this machine has 0 CUDA device"):
        build(NoisyClientsConfig(device="cuda"))
    with pytest.raises(ValueError, match="num_gpus_per_client: 0.5 GPUs per client asked for, but this machine has "
                                         "no CUDA device"):
        build(NoisyClientsConfig(engine=EngineSettings(num_gpus_per_client=0.5)))
    with pytest.raises(ValueError, match="num_gpus_per_client: expected a finite number ≥ 0"):
        build(NoisyClientsConfig(engine=EngineSettings(num_gpus_per_client=-1.0)))


def test_a_cuda_device_needs_gpu_shares_for_the_clients(monkeypatch):
    if not HAS_CUDA:
        # A machine with a GPU cannot be made here otherwise: pretend one, to reach the GPU-share check.
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"num_gpus_per_client: device 'cuda' trains the clients on the GPU too, "
                                         r"which needs Ray GPU shares .*got 0\. Give a share, e\.g\. 0\.1"):
        check_devices("cuda", 0.0)
    with pytest.raises(ValueError, match="num_gpus_per_client: device 'cuda:0' trains the clients"):
        check_devices("cuda:0", 0, ray_address="auto")
    check_devices("cuda", 0.1)
    check_devices("cpu", 0.0)


def test_the_clients_train_on_cuda_exactly_when_the_run_does():
    assert [clients_device(device) for device in ("cpu", "cuda", "cuda:1")] == ["cpu", "cuda", "cuda"]


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_the_valuation_utility_runs_on_the_device_and_scores_as_on_the_cpu():
    _, model_factory, on_gpu, _ = build(NoisyClientsConfig(device="cuda", engine=EngineSettings(num_gpus_per_client=0.1)))
    _, _, on_cpu, _ = build(NoisyClientsConfig())
    arrays = initial_arrays(model_factory())
    arrays = {key: array.numpy() for key, array in arrays.items()}
    assert on_gpu.device.type == "cuda" and on_gpu.x.is_cuda
    assert on_gpu(arrays) == on_cpu(arrays)
