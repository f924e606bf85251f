"""Local training in pure torch, and a model's state as ``dict[str, np.ndarray]``.

``train_locally`` is plain SGD (no momentum, no weight decay), full batch by default as
in [ADS] App. C.2. It is deterministic: mini-batch order comes from a
``torch.Generator`` seeded from ``seed`` and the global torch RNG is never touched.
Bit-for-bit equality across runs also needs the same torch thread count (CPU matmul
reductions are split by thread); Ray actors run with one thread per CPU they hold.

Every function here computes on the device the model's parameters live on (the data are moved
there) and returns CPU numbers and numpy arrays. On a CUDA device bit-for-bit equality across runs
is not promised (cuDNN's algorithm choice and atomic reductions vary) unless torch's deterministic
algorithms are on (``torch.use_deterministic_algorithms(True)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from fedvalue._checks import check_integer, check_non_negative, check_positive
from clients.seeding import Seed, torch_generator

LOSSES = ("cross_entropy", "mse")


def _loss_fn(loss: str):
    if loss == "cross_entropy":
        return torch.nn.functional.cross_entropy

    def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # A regression head (N, 1) against targets (N,): compare like with like.
        if output.ndim == 2 and output.shape[1] == 1 and target.ndim == 1:
            output = output[:, 0]
        return torch.nn.functional.mse_loss(output, target)

    return mse


def _tensor(values: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach()
    values = np.ascontiguousarray(values)
    # torch warns on read-only arrays (and could not keep them read-only): copy those.
    return torch.from_numpy(values if values.flags.writeable else values.copy())


def _model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (first buffer without parameters; CPU without either)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _on_device(model: torch.nn.Module, x_t: torch.Tensor, y_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, y_t) on the model's device (the same tensors on CPU: results stay bit for bit)."""
    device = _model_device(model)
    return x_t.to(device), y_t.to(device)


def as_tensors(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs as float32 and targets as int64 (cross-entropy) or float32 (mse)."""
    if loss not in LOSSES:
        raise ValueError(f"loss: expected one of {list(LOSSES)}; got {loss!r}.")
    x_t = _tensor(x).to(torch.float32)
    y_t = _tensor(y)
    if len(x_t) != len(y_t):
        raise ValueError(f"x, y: expected the same number of examples; got {len(x_t)} inputs and {len(y_t)} targets.")
    if loss == "cross_entropy":
        if y_t.is_floating_point() or y_t.dtype == torch.bool:
            raise ValueError(f"y: expected integer class labels for loss='cross_entropy'; got dtype {y_t.dtype}.")
        y_t = y_t.to(torch.int64)
    else:
        y_t = y_t.to(torch.float32)
    return x_t, y_t


def train_locally(
    model: torch.nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    *,
    epochs: int,
    learning_rate: float,
    batch_size: int | None = None,
    loss: str = "cross_entropy",
    seed: Seed,
    proximal_mu: float = 0.0,
) -> float:
    """Train ``model`` in place with plain SGD; return the last epoch's mean loss.

    Parameters
    ----------
    model
        The module to train (its parameters are updated in place).
    x, y
        Training inputs (N x d) and labels (int, for ``"cross_entropy"``) or targets
        (float, for ``"mse"``).
    epochs
        Passes over the data, >= 1.
    learning_rate
        SGD step size, > 0.
    batch_size
        ``None`` (or >= N): one full-batch step per epoch. Otherwise mini-batches of
        this size in an order reshuffled every epoch.
    loss
        ``"cross_entropy"`` (classification) or ``"mse"`` (regression; an (N, 1)
        output is compared with (N,) targets).
    seed
        Seed of the mini-batch order (unused with full batch, but required so that
        every call states its randomness).
    proximal_mu
        FedProx's proximal term (Li et al., "Federated Optimization in Heterogeneous
        Networks", Eq. 2): each step minimizes ℓ(w) + (μ/2)·‖w − w⁰‖² with w⁰ the
        parameters the model had when training started (the global model). 0 is plain
        SGD. The reported loss is ℓ alone.

    Returns
    -------
    float
        Mean over the last epoch's examples of the loss each batch had when it was
        used (before its step): with full batch, the loss before the last step.
    """
    epochs = check_integer("epochs", epochs)
    check_positive("learning_rate", learning_rate)
    if batch_size is not None:
        batch_size = check_integer("batch_size", batch_size)
    check_non_negative("proximal_mu", proximal_mu)
    x_t, y_t = _on_device(model, *as_tensors(x, y, loss))
    num_examples = len(x_t)
    if num_examples == 0:
        raise ValueError("x: expected at least one training example; got 0.")
    generator = torch_generator(seed)
    loss_fn = _loss_fn(loss)
    anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None
    # Dropout and other stochastic layers draw from torch's global generator: seed it from
    # ``seed`` inside a fork, so training is reproducible and the caller's state is kept.
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed((generator.initial_seed() + 1) % 2**63)
        return _sgd_epochs(model, x_t, y_t, epochs, float(learning_rate), batch_size, loss_fn, generator,
                           proximal_mu, anchor)


def _sgd_epochs(model, x_t, y_t, epochs, learning_rate, batch_size, loss_fn, generator, proximal_mu, anchor) -> float:
    """The epochs of :func:`train_locally` (arguments already checked)."""
    num_examples = len(x_t)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    full_batch = batch_size is None or batch_size >= num_examples
    model.train()
    epoch_loss = math.nan
    for _ in range(epochs):
        order = None if full_batch else torch.randperm(num_examples, generator=generator)
        step = num_examples if full_batch else batch_size
        total = 0.0
        for start in range(0, num_examples, step):
            if order is None:
                xb, yb = x_t, y_t
            else:
                index = order[start : start + step]
                xb, yb = x_t[index], y_t[index]
            optimizer.zero_grad(set_to_none=True)
            batch_loss = loss_fn(model(xb), yb)
            objective = batch_loss
            if anchor is not None:
                objective = batch_loss + proximal_mu / 2 * sum(
                    (p - p0).pow(2).sum() for p, p0 in zip(model.parameters(), anchor))
            objective.backward()
            optimizer.step()
            total += float(batch_loss.detach()) * len(xb)
        epoch_loss = total / num_examples
    return epoch_loss


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    *,
    loss: str = "cross_entropy",
) -> dict[str, float]:
    """Mean loss, and accuracy for classification, of ``model`` on (x, y).

    Returns
    -------
    dict
        ``{"loss": ..., "accuracy": ...}`` for ``"cross_entropy"``; ``{"loss": ...}``
        for ``"mse"``.
    """
    x_t, y_t = _on_device(model, *as_tensors(x, y, loss))
    if len(x_t) == 0:
        raise ValueError("x: expected at least one example to evaluate on; got 0.")
    model.eval()
    output = model(x_t)
    metrics = {"loss": float(_loss_fn(loss)(output, y_t))}
    if loss == "cross_entropy":
        metrics["accuracy"] = float((output.argmax(dim=1) == y_t).to(torch.float64).mean())
    return metrics


def summed_loss_gradient(
    model: torch.nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    *,
    loss: str = "cross_entropy",
) -> tuple[float, dict[str, np.ndarray]]:
    """L = Σ_{z'} ℓ_{z'}(w) and g = ∇_w L on (x, y) at the model's parameters.

    ℓ is the per-example loss local training averages, so a step Δw changes L by
    g·Δw to first order: the quantity TracIn flows are made of ([RECIP], Eq. 5;
    fedvalue.flows.round_flows, "Federated form"). Returns g for every ``state_dict`` entry, in its
    order (zeros for buffers); an empty split gives L = 0 and g = 0.
    """
    x_t, y_t = _on_device(model, *as_tensors(x, y, loss))
    model.eval()
    parameters = dict(model.named_parameters())
    for parameter in parameters.values():
        parameter.grad = None
    total = 0.0
    if len(x_t):
        summed = _loss_fn(loss)(model(x_t), y_t) * len(x_t)  # mean × N: the sum, same per-example ℓ
        summed.backward()
        total = float(summed.detach())
    gradients = {}
    for key, value in model.state_dict().items():
        parameter = parameters.get(key)
        grad = None if parameter is None else parameter.grad
        gradients[key] = (np.zeros(value.shape, dtype=np.float32) if grad is None
                          else grad.detach().cpu().numpy().astype(np.float32, copy=True))
    return total, gradients


def get_model_arrays(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's ``state_dict`` as numpy copies, in ``state_dict`` order."""
    return {key: value.detach().cpu().numpy().copy() for key, value in model.state_dict().items()}


def set_model_arrays(model: torch.nn.Module, arrays: Mapping[str, np.ndarray]) -> torch.nn.Module:
    """Load ``arrays`` into ``model`` (cast to each entry's dtype); returns ``model``.

    Raises
    ------
    ValueError
        If the keys differ from the model's ``state_dict`` keys or a shape differs.
    """
    state = model.state_dict()
    missing = [key for key in state if key not in arrays]
    unexpected = [key for key in arrays if key not in state]
    if missing or unexpected:
        raise ValueError(
            f"arrays: expected exactly the model's state keys {list(state)}; missing {missing}, "
            f"unexpected {unexpected}. Was the model built by the same model_factory?"
        )
    loaded = {}
    for key, current in state.items():
        value = torch.as_tensor(np.asarray(arrays[key]))
        if tuple(value.shape) != tuple(current.shape):
            raise ValueError(
                f"arrays: expected shape {tuple(current.shape)} for {key!r}; got {tuple(value.shape)}."
            )
        # Server optimizers may send float64 (Flower's FedAdam does): train in the model's dtype.
        loaded[key] = value.to(current.dtype)
    model.load_state_dict(loaded, strict=True)
    return model


def loss_gradient_and_fisher(
    model: torch.nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    *,
    loss: str = "cross_entropy",
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """G = Σ_n ∇_w ℓ_n and d = Σ_n ∇_w ℓ_n ⊙ ∇_w ℓ_n on (x, y) at the model's parameters, in
    float64: the training loss gradient and the diagonal empirical Fisher of [FAIRIJ] App. A
    (fedvalue.scoring.fairness.curvature). Per-example gradients by ``torch.func`` (vmap over examples);
    one array per ``state_dict`` entry, in its order (zeros for buffers)."""
    x_t, y_t = _on_device(model, *as_tensors(x, y, loss))
    model = model.eval()
    params = {k: v.detach().to(torch.float64) for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    loss_fn = _loss_fn(loss)

    def one(p, row, target):
        out = torch.func.functional_call(model, ({**p}, buffers), (row[None].to(torch.float64),))
        return loss_fn(out, target[None])

    state = model.state_dict()
    if len(x_t) == 0:
        zeros = {k: np.zeros(v.shape, dtype=np.float64) for k, v in state.items()}
        return zeros, {k: z.copy() for k, z in zeros.items()}
    per_example = torch.func.vmap(torch.func.grad(one), in_dims=(None, 0, 0))(params, x_t, y_t)
    gradient, fisher = {}, {}
    for key, value in state.items():
        g = per_example.get(key)
        if g is None:
            gradient[key] = np.zeros(value.shape, dtype=np.float64)
            fisher[key] = np.zeros(value.shape, dtype=np.float64)
        else:
            gradient[key] = g.sum(dim=0).cpu().numpy().astype(np.float64)
            fisher[key] = (g * g).sum(dim=0).cpu().numpy().astype(np.float64)
    return gradient, fisher
