"""FedProx runs as FedProx: real ClientApps read 'proximal-mu' from FedProx's train config."""

from __future__ import annotations

import numpy as np
import torch
from flwr.serverapp.strategy import FedAvg, FedProx

from clients.training import train_locally

from tests.strategies.harness.bare_and_wrapped import one_torch_thread, run  # noqa: F401
from tests.strategies.test_conformance import SETUP


def _update_norm(outcome) -> float:
    first = SETUP.initial_arrays()
    return float(np.sqrt(sum(((outcome.result.arrays[k].numpy() - first[k].numpy()) ** 2).sum() for k in first)))


def test_fedprox_with_zero_mu_is_fedavg_and_a_positive_mu_pulls_clients_back():
    fedavg = run(SETUP, lambda: FedAvg(fraction_evaluate=0.0), wrapped=False)
    prox_zero = run(SETUP, lambda: FedProx(fraction_evaluate=0.0, proximal_mu=0.0), wrapped=False)
    prox = run(SETUP, lambda: FedProx(fraction_evaluate=0.0, proximal_mu=5.0), wrapped=False)
    for key in fedavg.result.arrays:
        assert np.array_equal(fedavg.result.arrays[key].numpy(), prox_zero.result.arrays[key].numpy())
    assert _update_norm(prox) < 0.9 * _update_norm(fedavg)


def test_proximal_term_is_the_gradient_of_mu_half_squared_distance_to_the_start():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    start = [p.detach().clone() for p in reference.parameters()]
    mu, lr = 0.7, 0.3
    for _ in range(4):  # full-batch SGD on ℓ(w) + (μ/2)‖w − w⁰‖², written out by hand
        reference.zero_grad()
        loss = torch.nn.functional.cross_entropy(reference(torch.tensor(x)), torch.tensor(y))
        (loss + mu / 2 * sum(((p - p0) ** 2).sum() for p, p0 in zip(reference.parameters(), start))).backward()
        with torch.no_grad():
            for p in reference.parameters():
                p -= lr * p.grad
    train_locally(model, x, y, epochs=4, learning_rate=lr, seed=0, proximal_mu=mu)
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
