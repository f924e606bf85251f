"""The clients' device: on CPU the results are bit for bit those of a call without one, a device
that is neither CPU nor CUDA is refused when the app is built, a CUDA device this process lacks is
refused with the Ray advice, and on a GPU the clients' results are CPU arrays close to the CPU's."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from clients import ClientData, HonestClient, make_client_app
from clients.app import local_loss, train_client
from clients.training import (
    evaluate_model,
    get_model_arrays,
    loss_gradient_and_fisher,
    summed_loss_gradient,
    train_locally,
)
from simulations.datasets.models import make_mlp

HAS_CUDA = torch.cuda.is_available()
FEATURES, CLASSES = 12, 3
model_factory = functools.partial(make_mlp, FEATURES, CLASSES, hidden=(16,), seed=0)


def client_data(partition_id: int = 1) -> ClientData:
    rng = np.random.default_rng(partition_id)
    x = rng.normal(size=(40, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=40)
    return ClientData(partition_id=partition_id, x_train=x[:30], y_train=y[:30], x_infer=x[30:], y_infer=y[30:],
                      behaviour=HonestClient())


def global_arrays() -> dict[str, np.ndarray]:
    return get_model_arrays(model_factory())


def a_round(**device) -> tuple[dict[str, np.ndarray], int, float]:
    """A mini-batch FedProx round (shuffling and the proximal term both on the device)."""
    return train_client(client_data(), model_factory, global_arrays(), learning_rate=0.1, local_epochs=3,
                        batch_size=8, seed=4, server_round=2, proximal_mu=0.1, **device)


def assert_same_bits(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> None:
    assert list(first) == list(second)
    for key, array in first.items():
        assert array.dtype == second[key].dtype and np.array_equal(array, second[key])
        assert array.tobytes() == second[key].tobytes()


# --- CPU: the same bits as without a device --------------------------------------------------


def test_train_client_on_cpu_gives_the_bits_of_the_call_without_a_device():
    arrays, num_examples, loss = a_round()
    on_cpu, cpu_examples, cpu_loss = a_round(device="cpu")
    assert_same_bits(arrays, on_cpu)
    assert (num_examples, loss) == (cpu_examples, cpu_loss)
    assert local_loss(client_data(), model_factory, global_arrays(), seed=4, server_round=2) == local_loss(
        client_data(), model_factory, global_arrays(), seed=4, server_round=2, device="cpu")


def test_training_functions_on_a_cpu_model_give_the_bits_of_the_plain_call():
    data = client_data()
    plain, moved = model_factory(), model_factory().to(torch.device("cpu"))
    assert train_locally(plain, data.x_train, data.y_train, epochs=2, learning_rate=0.1, batch_size=8, seed=1) == \
        train_locally(moved, data.x_train, data.y_train, epochs=2, learning_rate=0.1, batch_size=8, seed=1)
    assert_same_bits(get_model_arrays(plain), get_model_arrays(moved))
    loss, gradient = summed_loss_gradient(plain, data.x_infer, data.y_infer)
    moved_loss, moved_gradient = summed_loss_gradient(moved, data.x_infer, data.y_infer)
    assert loss == moved_loss
    assert_same_bits(gradient, moved_gradient)
    for mine, theirs in zip(loss_gradient_and_fisher(plain, data.x_train, data.y_train),
                            loss_gradient_and_fisher(moved, data.x_train, data.y_train)):
        assert_same_bits(mine, theirs)
    assert evaluate_model(plain, data.x_infer, data.y_infer) == evaluate_model(moved, data.x_infer, data.y_infer)


# --- Refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["tpu", "banana", "mps", 3, None])
def test_a_device_that_is_neither_cpu_nor_cuda_is_refused_when_the_app_is_built(device):
    with pytest.raises(ValueError, match=r"device: expected a torch device string of type cpu or cuda .*; got"):
        make_client_app(client_data, model_factory, device=device)


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal of a process that sees no CUDA device")
def test_cuda_without_a_visible_gpu_is_refused_with_the_ray_advice():
    make_client_app(client_data, model_factory, device="cuda")  # built where the server runs; refused in the worker
    advice = r"device: .*'cuda'.*this worker sees no CUDA device\. Ray hides the GPUs .*num_gpus_per_client > 0"
    with pytest.raises(ValueError, match=advice):
        a_round(device="cuda")
    with pytest.raises(ValueError, match=advice):
        local_loss(client_data(), model_factory, global_arrays(), seed=0, server_round=1, device="cuda")


# --- On a GPU --------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_train_client_on_cuda_returns_cpu_arrays_close_to_the_cpu_round():
    on_cpu, cpu_examples, cpu_loss = a_round(device="cpu")
    on_gpu, gpu_examples, gpu_loss = a_round(device="cuda")
    assert list(on_gpu) == list(on_cpu) and gpu_examples == cpu_examples
    for key in on_cpu:
        assert isinstance(on_gpu[key], np.ndarray)
        assert on_gpu[key].shape == on_cpu[key].shape and on_gpu[key].dtype == on_cpu[key].dtype
        np.testing.assert_allclose(on_gpu[key], on_cpu[key], atol=1e-4)
    assert gpu_loss == pytest.approx(cpu_loss, abs=1e-4)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_gradients_and_fisher_on_cuda_are_cpu_arrays_close_to_the_cpu_ones():
    data = client_data()
    on_gpu = model_factory().to("cuda")
    _, gradient = summed_loss_gradient(on_gpu, data.x_infer, data.y_infer)
    _, cpu_gradient = summed_loss_gradient(model_factory(), data.x_infer, data.y_infer)
    for key in cpu_gradient:
        assert isinstance(gradient[key], np.ndarray) and gradient[key].dtype == np.float32
        np.testing.assert_allclose(gradient[key], cpu_gradient[key], atol=1e-4)
    fisher_pairs = zip(loss_gradient_and_fisher(on_gpu, data.x_train, data.y_train),
                       loss_gradient_and_fisher(model_factory(), data.x_train, data.y_train))
    for gpu_arrays, cpu_arrays in fisher_pairs:
        for key in cpu_arrays:
            assert isinstance(gpu_arrays[key], np.ndarray) and gpu_arrays[key].dtype == np.float64
            np.testing.assert_allclose(gpu_arrays[key], cpu_arrays[key], atol=1e-4)
