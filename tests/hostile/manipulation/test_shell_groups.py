"""The KNN-ADS market's broker split into shell groups: under ADS with the shells after the
originals the split buys nothing (group efficiency, [ADS] Prop. 4.2), party-level Shapley pays
the shells more, and a shell declared among the contributors is what ordering cannot catch."""

from __future__ import annotations

import pytest

from simulations.experiments.attacks.shell_groups import shell_groups_table


@pytest.fixture(scope="module")
def table():
    return shell_groups_table("digits", 0, (1, 2, 4), contributors=3, originals=60, test=60).set_index(
        ["shells", "method"])["gain"]


def test_ordered_groups_make_the_split_worthless_and_shapley_pays_it(table):
    for shells in (2, 4):
        assert table[(shells, "knn-ads")] == pytest.approx(1.0, abs=1e-9)
        assert table[(shells, "party-ads")] == pytest.approx(1.0, abs=1e-9)
    assert table[(4, "party-ds")] > table[(2, "party-ds")] > 1.0
    assert table[(2, "party-ads-misplaced")] > 1.0
