"""Held-out utilities U(arrays) for the round game: a torch model scored on fixed data.

``arrays`` are a model's state as ``dict[str, np.ndarray]`` (its ``state_dict`` names);
the model is run with ``torch.func.functional_call`` so no module is copied or loaded
per coalition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

UTILITY_METRICS = ("accuracy", "neg_loss", "neg_mse")


class TorchModelUtility:
    """U(arrays) = metric of ``model`` with parameters ``arrays`` on (x, y).

    Parameters
    ----------
    model
        A module whose ``state_dict`` names match the arrays' keys (used as a
        template; its own parameters are never changed).
    x, y
        Held-out inputs and labels (targets for ``"neg_mse"``).
    metric
        ``"accuracy"`` (share of argmax predictions equal to y), ``"neg_loss"``
        (minus mean cross-entropy) or ``"neg_mse"`` (minus mean squared error).
        Higher is better for all three, as a utility must be.
    batch_size
        Held-out examples per forward pass (bounds memory).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        x: np.ndarray,
        y: np.ndarray,
        *,
        metric: str = "accuracy",
        batch_size: int = 4096,
    ) -> None:
        if metric not in UTILITY_METRICS:
            raise ValueError(f"metric: expected one of {list(UTILITY_METRICS)}; got {metric!r}.")
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(
                f"x, y: expected the same non-zero number of held-out examples; got {len(x)} "
                f"inputs and {len(y)} labels."
            )
        self.model = model.eval()
        self.metric = metric
        self.batch_size = int(batch_size)
        self.x = torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32)
        self.y = torch.as_tensor(np.ascontiguousarray(y))
        state = model.state_dict()
        self.keys = list(state.keys())
        # Server optimizers may hand back float64 (Flower's FedAdam does): score in the model's dtype.
        self.dtypes = {k: v.dtype for k, v in state.items()}

    def _tensors(self, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        missing = [k for k in self.keys if k not in arrays]
        if missing:
            raise KeyError(
                f"arrays: expected the model's state keys {self.keys}; missing {missing}."
            )
        return {k: torch.as_tensor(np.asarray(arrays[k])).to(self.dtypes[k]) for k in self.keys}

    @torch.no_grad()
    def __call__(self, arrays: Mapping[str, np.ndarray]) -> float:
        state = self._tensors(arrays)
        total = 0.0
        for start in range(0, len(self.x), self.batch_size):
            xb = self.x[start : start + self.batch_size]
            yb = self.y[start : start + self.batch_size]
            out = torch.func.functional_call(self.model, state, (xb,))
            total += float(self._summed_metric(out, yb))
        return total / len(self.x)

    def batch(self, arrays_list: Sequence[Mapping[str, np.ndarray]]) -> list[float]:
        """U for several states (one call per state; batched evaluation can override)."""
        return [self(arrays) for arrays in arrays_list]

    def _summed_metric(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.metric == "accuracy":
            return (out.argmax(dim=-1) == y).sum(dtype=torch.float64)
        if self.metric == "neg_loss":
            return -torch.nn.functional.cross_entropy(out, y.long(), reduction="sum").double()
        return -((out.reshape(y.shape) - y) ** 2).sum(dtype=torch.float64)
