"""A valuation result as a frame, with its efficiency gap."""

from __future__ import annotations

import math

import pytest

import fedvalue


square = lambda s: float(len(s) ** 2)  # noqa: E731


def test_result_frame_and_gap():
    result = fedvalue.ads(square, [["a", "b"], ["c"]], method="exact")
    frame = result.to_frame()
    assert list(frame.columns) == ["value", "stderr", "group", "method"]
    assert frame.loc["c", "group"] == 1
    assert frame.loc["c", "value"] == pytest.approx(9 - 4)
    assert result.prefix_utilities == (0.0, 4.0, 9.0)
    assert math.isnan(fedvalue.loo(square, ["a", "b"]).max_efficiency_gap)

