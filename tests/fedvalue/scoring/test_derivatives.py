"""TorchModelUtility's gradient and Hessian-vector product against central finite differences, on a small real
torch model with a differentiable metric: of U itself (float32 forward passes, a coarse step) and of U's float64
reference (the same model and held-out data in float64, a fine step); and the refusal of a metric with no
gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvalue.scoring.torch_utilities import TorchModelUtility


def a_model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def held_out(metric: str):
    rng = np.random.default_rng(8)
    x = rng.normal(size=(90, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=90) if metric == "neg_loss" else rng.normal(size=(90, 3)).astype(np.float32)
    return x, y


def reference(model: torch.nn.Module, x, y, metric: str, arrays, *, grad: bool = False):
    """U in float64 (mean over all examples at once), or its gradient."""
    params = {k: torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=grad) for k, v in arrays.items()}
    out = torch.func.functional_call(model, params, (torch.tensor(x, dtype=torch.float64),))
    if metric == "neg_loss":
        value = -torch.nn.functional.cross_entropy(out, torch.tensor(y), reduction="mean")
    else:
        value = -((out - torch.tensor(y, dtype=torch.float64)) ** 2).sum() / len(x)
    if not grad:
        return float(value)
    return dict(zip(params, (g.numpy() for g in torch.autograd.grad(value, list(params.values())))))


def shifted(arrays, direction, step):
    return {k: arrays[k] + step * direction[k] for k in arrays}


@pytest.mark.parametrize("metric", ["neg_loss", "neg_mse"])
def test_the_gradient_is_the_central_difference_of_u(metric):
    model = a_model()
    x, y = held_out(metric)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=32)  # three held-out batches, summed
    arrays = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    gradient = utility.gradient(arrays)
    assert list(gradient) == list(arrays) and all(g.dtype == np.float64 for g in gradient.values())
    rng = np.random.default_rng(1)
    for _ in range(3):
        direction = {k: rng.normal(size=v.shape) for k, v in arrays.items()}
        slope = sum(float((gradient[k] * direction[k]).sum()) for k in arrays)
        fine = (reference(model, x, y, metric, shifted(arrays, direction, 1e-6))
                - reference(model, x, y, metric, shifted(arrays, direction, -1e-6))) / 2e-6
        assert slope == pytest.approx(fine, rel=1e-7, abs=1e-9)
        coarse = (utility(shifted(arrays, direction, 2e-3)) - utility(shifted(arrays, direction, -2e-3))) / 4e-3
        assert slope == pytest.approx(coarse, rel=1e-3, abs=2e-4)  # U's own float32 passes: rounding over 2h, and h²


@pytest.mark.parametrize("metric", ["neg_loss", "neg_mse"])
def test_the_hessian_vector_product_is_the_central_difference_of_the_gradient(metric):
    model = a_model()
    x, y = held_out(metric)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=32)
    arrays = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(2)
    vector = {k: rng.normal(size=v.shape) for k, v in arrays.items()}
    product = utility.hessian_vector_product(arrays, vector)
    ahead = reference(model, x, y, metric, shifted(arrays, vector, 1e-5), grad=True)
    behind = reference(model, x, y, metric, shifted(arrays, vector, -1e-5), grad=True)
    for k in arrays:
        np.testing.assert_allclose(product[k], (ahead[k] - behind[k]) / 2e-5, rtol=1e-5, atol=1e-7)
    # and the directional second derivative of U itself, vᵀHv
    curvature = sum(float((product[k] * vector[k]).sum()) for k in arrays)
    second = (reference(model, x, y, metric, shifted(arrays, vector, 1e-4)) - 2 * reference(model, x, y, metric, arrays)
              + reference(model, x, y, metric, shifted(arrays, vector, -1e-4))) / 1e-8
    assert curvature == pytest.approx(second, rel=1e-4)
    assert utility.hessian_vector_product(arrays, vector)["0.weight"].tolist() == product["0.weight"].tolist()


def test_a_metric_without_a_gradient_is_refused_naming_it():
    model = a_model()
    x, y = held_out("neg_loss")
    utility = TorchModelUtility(model, x, y)  # accuracy
    arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert not utility.differentiable and TorchModelUtility(model, x, y, metric="neg_loss").differentiable
    with pytest.raises(ValueError, match="metric: gradient needs a utility differentiable in the state, metric one of "
                                         r"\['neg_loss', 'neg_mse'\]; this one scores 'accuracy'"):
        utility.gradient(arrays)
    with pytest.raises(ValueError, match="metric: hessian_vector_product needs"):
        utility.hessian_vector_product(arrays, arrays)
    with pytest.raises(KeyError, match="vector: expected the model's state keys"):
        TorchModelUtility(model, x, y, metric="neg_loss").hessian_vector_product(arrays, {"0.weight": arrays["0.weight"]})
