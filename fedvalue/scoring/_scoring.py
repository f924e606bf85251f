"""What every scoring path shares: no autograd with denormals flushed, per-batch sums and
the near-tie rows that are decided as on the plain path (in float64).

Every path scores with denormal floats flushed to zero (the caller's setting is put back
after). Averaged and trained weights drive some activations into the subnormal range,
where x86 float arithmetic runs up to a hundred times slower. Flushing changes a result
by at most the subnormal magnitude (< 1.2e-38 in float32), far below any tolerance here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def _flushing_denormals() -> bool:
    """Whether this thread flushes denormals now (torch offers a setter but no getter)."""
    return float(torch.tensor(1e-39, dtype=torch.float32) * 1.0) == 0.0


@contextmanager
def scoring() -> Iterator[None]:
    """No autograd, denormals flushed to zero; the previous flush setting is restored."""
    was_flushing = _flushing_denormals()
    torch.set_flush_denormal(True)
    try:
        with torch.no_grad():
            yield
    finally:
        if not was_flushing:
            torch.set_flush_denormal(False)


#: Near-tie rows get their float32 logits (what decides them where float64 cannot) in a block of
#: at least this many rows.
RECHECK_ROWS = 64


class FastScores:
    """Fast-path sums per (state, held-out batch), the near-tie rows to re-score, and the
    (state, batch) pairs whose fast outputs or sums were not finite: those are scored
    whole on the plain path. A fast path combines every basis state, so one state's
    overflow (an inf times a zero coefficient is NaN) must not reach a coalition without
    it; the plain path materializes the coalition's own state instead."""

    def __init__(self, num_states: int, num_batches: int) -> None:
        self.sums = np.zeros((num_states, num_batches))
        self.near: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
        self.plain: set[tuple[int, int]] = set()
