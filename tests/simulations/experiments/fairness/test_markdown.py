"""The fairness simulation's results files and the docs' tables rendered from them, on small made-up runs of the
real format (no training): what ``--results`` writes is all the renderers need, and the rows read as the docs'."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulations.experiments.fairness import tables
from simulations.experiments.fairness.markdown import (
    FEDERATED_RESULTS,
    comparison_table,
    scoring_table,
    tradeoff_table,
)
from simulations.runner import read_results, results_command, write_results

COMMAND = "fedvalue run fairness --out DIR --seeds 3 --drops 2 --lams 30 --results FOLDER"


def per_round(drops=(2,), seeds=3) -> pd.DataFrame:
    """Five rounds of every rule on two data sets, as the runs append them (random drops cost no fairness, the
    drop rules lower the gap and the accuracy, by an amount that varies with the seed)."""
    rows = []
    rules = [("fedavg", 0)] + [(p, k) for p in ("drop-k", "drop-k-renormalized", "drop-k-curvature", "drop-k-exact",
                                                 "random") for k in drops] + [("ijack", 30.0)]
    for dataset, level in (("gaussian", 0.3), ("slid", 0.4)):
        for seed in range(seeds):
            for policy, parameter in rules:
                lower = 0.0 if policy in ("fedavg", "random", "ijack") else 0.05 + 0.01 * seed
                for t in range(1, 6):
                    rows.append({"dataset": dataset, "seed": seed, "policy": policy, "parameter": parameter,
                                 "round": t, "accuracy": 0.7 - lower / 5 + 0.002 * seed + 0.001 * t,
                                 "dp_gap": level - lower + 0.01 * seed, "eop_gap": level - lower / 2 + 0.01 * seed,
                                 "eo_gap": 2 * level - lower + 0.02 * seed, "majority_accuracy": 0.5})
    return pd.DataFrame(rows).sort_values(["dataset", "seed", "policy", "parameter", "round"], kind="mergesort")


def scoring() -> pd.DataFrame:
    rows = []
    for dataset in ("gaussian", "slid"):
        for i, score in enumerate(tables.SCORED):
            row = {"dataset": dataset, "score": score, "seeds": 10}
            for column, mean in (("correlation", 0.87 - i / 50), ("top_is_best", 0.74), ("top_raises_gap", 0.02),
                                 ("share_of_best", 0.9)):
                row |= {column: mean, f"{column}_low": mean - 0.03 if column != "top_raises_gap" else -0.001,
                        f"{column}_high": mean + 0.03}
            rows.append(row)
    return pd.DataFrame(rows)


def written(tmp_path, drops=(2,)) -> dict[str, pd.DataFrame]:
    runs = per_round(drops)
    frames = {"tradeoff": tables.tradeoff(runs, 5, 0.95), "comparison": tables.against_random(runs, 5, 0.95),
              "scoring": scoring()}
    write_results(tmp_path, {name: frames[key] for name, key in FEDERATED_RESULTS.items()}, COMMAND)
    return {key: read_results(tmp_path / name) for name, key in FEDERATED_RESULTS.items()}


def test_the_results_files_are_headed_by_the_command_and_render_as_the_frames_do(tmp_path):
    read = written(tmp_path)
    for name in FEDERATED_RESULTS:
        assert (tmp_path / name).read_text().startswith(f"# {COMMAND} (commit ")
        assert results_command(tmp_path / name) == COMMAND
    runs = per_round()
    assert tradeoff_table(read["tradeoff"]) == tradeoff_table(tables.tradeoff(runs, 5, 0.95))
    assert comparison_table(read["comparison"], 2, 2) == comparison_table(tables.against_random(runs, 5, 0.95), 2, 2)


def test_the_tradeoff_table_orders_the_rules_as_the_docs_and_names_k_and_lambda(tmp_path):
    rows = tradeoff_table(written(tmp_path)["tradeoff"])
    assert rows[:2] == ["| data set | rule | accuracy | DP gap | EOP gap | EO gap |", "|---|---|---|---|---|---|"]
    assert [row.split(" | ")[1] for row in rows[2:9]] == [
        "FedAvg", "drop-K first-order (K = 2)", "drop-K renormalized", "drop-K curvature", "drop-K exact",
        "random drop (K = 2)", "I-JACK (λ = 30)"]
    assert [row.split(" | ")[0] for row in rows[2:]] == ["| Gaussian"] * 7 + ["| SLID"] * 7
    # FedAvg on the Gaussian example: the mean of seeds 0-2 (0.7 + 0.002·seed + 0.001·mean round), Student-t
    low, high = 0.705 - 4.302653 * 0.002 / np.sqrt(3), 0.705 + 4.302653 * 0.002 / np.sqrt(3)
    assert rows[2] == (f"| Gaussian | FedAvg | 0.705 [{low:.3f}, {high:.3f}] | 0.310 [0.285, 0.335] | "
                       "0.310 [0.285, 0.335] | 0.620 [0.570, 0.670] |")


def test_with_two_ks_every_drop_rule_names_its_k(tmp_path):
    rows = tradeoff_table(written(tmp_path, drops=(2, 4))["tradeoff"])
    assert "| Gaussian | drop-K curvature (K = 4) | " in "\n".join(rows)


def test_the_comparison_tables_sign_every_difference_and_say_why_a_rule_does_not_win(tmp_path):
    comparison = written(tmp_path, drops=(2, 4))["comparison"]
    rows = comparison_table(comparison, 2, 2)
    assert rows[1] == "|---|---|---|---|---|---|---|" and len(rows) == 2 + 2 * 5
    first = rows[2]
    assert first.startswith("| Gaussian | drop-K first-order | −0.012 [") and first.endswith(" | no (accuracy) |")
    assert rows[6].startswith("| Gaussian | I-JACK λ = 30 | +0.000 [") and rows[6].endswith(" | no |")
    one = comparison_table(comparison, 2, 4, dataset="slid")
    assert one[0] == ("| rule (K = 2) − random drops (K = 4) | accuracy | DP gap | EOP gap | EO gap "
                      "| beats random (DP) |")
    assert [row.split(" | ")[0] for row in one[2:]] == [
        "| drop-K first-order", "| drop-K renormalized", "| drop-K curvature", "| drop-K exact", "| I-JACK λ = 30"]
    wins = comparison.assign(beats_random_dp=True)
    assert comparison_table(wins, 2, 2)[2].endswith(" | yes |")


def test_the_scoring_table_has_two_decimals_and_the_docs_minus(tmp_path):
    rows = scoring_table(written(tmp_path)["scoring"])
    assert rows[2] == "| Gaussian | first-order I^F | 0.87 [0.84, 0.90] | 0.74 [0.71, 0.77] | 0.02 [−0.00, 0.05] |"
    assert [row.split(" | ")[1] for row in rows[2:6]] == [
        "first-order I^F", "renormalized I^F", "curvature I^H", "renormalized I^H"]


def selected(seeds: int = 3) -> pd.DataFrame:
    """adult_seed's selected rows for ``seeds`` seeds: ERM, the gradient edit and the four Fisher rules at the
    lowest gap and at DP ≤ 0.1, which drop/upweight reaches in seed 0 only."""
    rows = []
    for seed in range(seeds):
        rows.append({"seed": seed, "curvature": "-", "edit": "erm", "selection": "-", "strength": 0.0, "changed": 0,
                     "test_accuracy": 0.848, "test_dp_gap": 0.193, "test_eop_gap": 0.1, "test_eo_gap": 0.2})
        for curvature, edit, cost in (("none", "gradient", 0.02), ("fisher", "fair-ij", 0.035),
                                      ("fisher", "ijack", 0.03), ("fisher", "simjack", 0.033),
                                      ("fisher", "drop-upweight", 0.19)):
            for selection, gap in (("lowest-gap", 0.01), ("matched 0.1", 0.095)):
                if edit == "drop-upweight" and selection != "lowest-gap" and seed > 0:
                    rows.append({"seed": seed, "curvature": curvature, "edit": edit, "selection": selection,
                                 "strength": float("nan"), "changed": float("nan")})
                    continue
                rows.append({"seed": seed, "curvature": curvature, "edit": edit, "selection": selection,
                             "strength": 1.0, "changed": 10, "test_accuracy": 0.848 - cost + 0.002 * seed,
                             "test_dp_gap": gap, "test_eop_gap": 0.2, "test_eo_gap": 0.3})
    return pd.DataFrame(rows)


def test_the_adult_table_from_its_results_file(tmp_path):
    from simulations.experiments.fairness.adult_ij import adult_summary
    from simulations.experiments.fairness.markdown import ADULT_RESULTS, adult_table

    write_results(tmp_path, {ADULT_RESULTS: adult_summary(selected(), "dp", 0.95)}, "fedvalue run fairness-adult")
    rows = adult_table(read_results(tmp_path / ADULT_RESULTS))
    assert rows[0] == ("| selection | rule | test accuracy | test DP | SIM-JACK − Fair-IJ, accuracy "
                       "| rule − gradient edit, accuracy |")
    assert rows[2] == "| lowest gap (App. B) | gradient edit (no curvature) | 0.830 [0.825, 0.835] | 0.010 | — | — |"
    assert rows[3] == "| lowest gap | Fair-IJ | 0.815 [0.810, 0.820] | 0.010 | — | −0.015 [−0.015, −0.015] |"
    assert rows[5] == ("| lowest gap | SIM-JACK | 0.817 [0.812, 0.822] | 0.010 | +0.002 [+0.002, +0.002] "
                       "| −0.013 [−0.013, −0.013] |")
    assert rows[6].startswith("| lowest gap | drop/upweight | 0.660 [")
    # drop/upweight reached DP ≤ 0.1 in one seed of three: counted in the file, not shown
    assert [row.split(" | ")[:2] for row in rows[7:]] == [
        ["| DP ≤ 0.10", "gradient edit"], ["| DP ≤ 0.10", "Fair-IJ"], ["| DP ≤ 0.10", "I-JACK"],
        ["| DP ≤ 0.10", "SIM-JACK"]]


def toy_runs(seeds: int = 3) -> pd.DataFrame:
    """toy_seed's rows: ERM, then every (γ, kept fraction, order), the full regularized fit for γ > 0; pruning by
    fairness moves the threshold right by 0.05 per 20 % pruned and lowers DP."""
    rows = []
    for seed in range(seeds):
        rows.append({"seed": seed, "gamma": 0.0, "keep": 1.0, "order": "erm", "threshold": 0.03, "accuracy": 0.87,
                     "dp_gap": 0.207, "lever": -0.1})
        for gamma in (0.0, 0.1):
            if gamma:
                rows.append({"seed": seed, "gamma": gamma, "keep": 1.0, "order": "full", "threshold": -0.04,
                             "accuracy": 0.87, "dp_gap": 0.214})
            for keep in (0.8, 0.6, 0.4):
                for order in ("fairness", "accuracy", "random"):
                    shift = (1 - keep) / 4 if order == "fairness" else 0.0
                    rows.append({"seed": seed, "gamma": gamma, "keep": keep, "order": order,
                                 "threshold": 0.03 + shift + 0.001 * seed, "accuracy": 0.87 - shift / 100,
                                 "dp_gap": 0.207 - shift / 10 - 0.0001 * seed})
    return pd.DataFrame(rows)


def test_the_toy_table_shows_the_docs_rows_from_its_results_file(tmp_path):
    from simulations.experiments.fairness.central import toy_summary
    from simulations.experiments.fairness.markdown import CENTRAL_RESULTS, central_results, toy_table

    runs = toy_runs()
    frames = central_results({"toy": toy_summary(runs, 0.95), "toy_runs": runs}, (-3, -0.5, 1, 1.65), 1.0, "lbfgs")
    assert list(frames) == list(CENTRAL_RESULTS[:2])
    write_results(tmp_path, frames, "fedvalue run fairness-central --experiment toy")
    assert read_results(tmp_path / CENTRAL_RESULTS[1])["toy_means"].tolist() == ["-3, -0.5, 1, 1.65"] * 3
    rows = toy_table(read_results(tmp_path / CENTRAL_RESULTS[0]))
    assert len(rows) == 12
    assert rows[2] == ("| plain (γ = 0) | 80 % | fairness (small \\|S(i)\\|) | +0.051 [0.049, 0.053] | −0.0005 "
                       "| −0.0051 [−0.0053, −0.0049] |")
    assert rows[3].startswith("| plain | 80 % | random | +0.001 [−0.001, 0.003] | +0.0000 | ")
    assert rows[5].startswith("| plain | 60 % | accuracy (large \\|S_ℓ(i)\\|) | ")
    assert rows[9].startswith("| relaxed DP, γ = 0.1 | 100 % | — | −0.070 [")


def tabular_runs(seeds: int = 3) -> pd.DataFrame:
    """tabular_seed's rows: ERM, each rule with each curvature (and its random and random-matched variants), the
    plain-gradient edit; every rule lowers the DP gap by 0.3 against random-matched's 0.05."""
    rows = []
    for seed in range(seeds):
        base = {"seed": seed, "strength": 1.0, "test_eop_gap": 0.2, "test_eo_gap": 0.4}
        rows.append({**base, "curvature": "-", "edit": "erm", "variant": "rule", "changed": 0,
                     "test_accuracy": 0.706, "test_dp_gap": 0.384})
        for curvature in ("exact", "fisher"):
            for edit in ("fair-ij", "drop-upweight", "ijack", "simjack"):
                for variant, lower in (("rule", 0.3), ("random", 0.0), ("random-matched", 0.05)):
                    rows.append({**base, "curvature": curvature, "edit": edit, "variant": variant,
                                 "changed": 2000 if edit in ("ijack", "simjack") else 480 + seed,
                                 "test_accuracy": 0.67 + 0.001 * seed, "test_dp_gap": 0.384 - lower - 0.01 * seed})
            if curvature == "exact":
                rows.append({**base, "curvature": "none", "edit": "gradient", "variant": "rule", "changed": 0,
                             "test_accuracy": 0.671, "test_dp_gap": 0.039})
    return pd.DataFrame(rows)


def test_the_tabular_tables_from_their_results_file(tmp_path):
    from simulations.experiments.fairness.central import tabular_summary
    from simulations.experiments.fairness.markdown import CENTRAL_RESULTS, tabular_mlp_table, tabular_table

    write_results(tmp_path, {CENTRAL_RESULTS[2]: tabular_summary(tabular_runs(), "dp", 0.95)}, "fedvalue run x")
    tabular = read_results(tmp_path / CENTRAL_RESULTS[2])
    rows = tabular_table(tabular)
    assert rows[2] == "| — | ERM | 0 | 0.706 | 0.384 | 0.200 | 0.400 | — | — | — |"
    assert rows[3] == ("| exact H | Fair-IJ (Prop. 3.1) | 481 | 0.671 | 0.074 | 0.200 | 0.400 | −0.250 [−0.250, −0.250] "
                       "| +0.000 [0.000, 0.000] | yes |")
    assert [row.split(" | ")[:3] for row in rows[4:]] == [
        ["| exact H", "drop/upweight (C.1)", "481"], ["| exact H", "I-JACK (3.2)", "all"],
        ["| exact H", "SIM-JACK (3.3)", "all"], ["| diag. Fisher", "Fair-IJ", "481"],
        ["| diag. Fisher", "drop/upweight", "481"], ["| diag. Fisher", "I-JACK", "all"],
        ["| diag. Fisher", "SIM-JACK", "all"], ["| none", "gradient edit θ̂ − c·g_a (§3.3)", "—"]]
    mlp = tabular_mlp_table(tabular)
    assert mlp[2] == "| exact H (damped) | Fair-IJ | 481 | 0.671 | 0.074 | 0.400 | −0.250 [−0.250, −0.250] | " \
                     "+0.000 [−0.002, 0.002] | yes |"
    assert mlp[-1] == "| none | gradient edit | — | 0.671 | 0.039 | 0.400 | — | — | — |"


def pruning_runs(seeds: int = 3, gamma_unfair: bool = False) -> pd.DataFrame:
    """pruning_seed's rows: ERM, full, each kept fraction and order; pruning by fairness lowers the DP gap by
    0.1 + 0.01·seed against random's when ``gamma_unfair``, else raises it by 0.05."""
    rows = []
    for seed in range(seeds):
        rows += [{"seed": seed, "keep": 1.0, "order": "erm", "test_accuracy": 0.706, "test_dp_gap": 0.384},
                 {"seed": seed, "keep": 1.0, "order": "full", "test_accuracy": 0.672, "test_dp_gap": 0.025}]
        for keep in (0.8, 0.6, 0.4, 0.2):
            for order in ("fairness", "accuracy", "random"):
                change = (-(0.1 + 0.01 * seed) if gamma_unfair else 0.05 + 0.01 * seed) if order == "fairness" else 0.0
                rows.append({"seed": seed, "keep": keep, "order": order, "test_accuracy": 0.67 + 0.002 * seed,
                             "test_dp_gap": 0.3 + change})
    return pd.DataFrame(rows)


def test_the_pruning_tables_from_their_results_files(tmp_path):
    from simulations.experiments.fairness.central import pruning_summary
    from simulations.experiments.fairness.markdown import (
        CENTRAL_RESULTS,
        adam_pruning_table,
        central_results,
        pruning_table,
    )

    for name, gamma, unfair in (("lbfgs", 1.0, False), ("adam-1", 1.0, False), ("adam-0.02", 0.02, True)):
        tables = {"tabular": pd.DataFrame(), "pruning": pruning_summary(pruning_runs(gamma_unfair=unfair), 0.95)}
        frames = central_results(tables, (-3, -0.5, 1, 1.65), gamma, "lbfgs" if name == "lbfgs" else "adam")
        write_results(tmp_path / name, frames, f"fedvalue run fairness-central --prune-gamma {gamma:g}")
    lbfgs = pruning_table(read_results(tmp_path / "lbfgs" / CENTRAL_RESULTS[3]))
    assert lbfgs[0] == "| kept | pruned by | test accuracy | DP gap | accuracy − random | DP − random |"
    assert lbfgs[2] == "| 80 % | fairness | 0.672 | 0.360 | +0.000 [0.000, 0.000] | +0.060 [0.035, 0.085] |"
    assert lbfgs[4] == "| 80 % | random | 0.672 | 0.300 | — | — |"
    assert [row.split(" | ")[:2] for row in lbfgs[5:]] == [
        ["| 40 %", "fairness"], ["| 40 %", "accuracy"], ["| 40 %", "random"], ["| 20 %", "fairness"],
        ["| 20 %", "random"]]
    adam = adam_pruning_table(*(read_results(tmp_path / name / CENTRAL_RESULTS[3]) for name in ("adam-1", "adam-0.02")))
    assert adam[2] == "| 1 | 100 % | — (full) | 0.672 | 0.025 | — | — |"
    assert adam[3] == "| 1 | 80 % | fairness | 0.672 | 0.360 | +0.000 [+0.000, +0.000] | +0.060 [+0.035, +0.085] |"
    assert adam[13] == ("| 0.02 | 80 % | fairness | 0.672 | 0.190 | +0.000 [+0.000, +0.000] "
                        "| **−0.110** [−0.135, −0.085] |")
    assert len(adam) == 2 + 10 + 10 and adam[18] .startswith("| 0.02 | 40 % | accuracy | ")


#: The docs' over-instances table in figures: per instance its means, ERM threshold, DP gap and lever, and pruning by
#: fairness at 80, 60 and 40 % kept: threshold shift, low, high, DP change, low, high (a shift's interval the docs
#: leave out, since it excludes 0, is the kept runs' to three decimals; "−0.000" is −0.0004).
TOY_INSTANCES = (
    ("-2, -0.1, 0.5, 1", -0.09, 0.302, -0.110, ((0.063, 0.037, 0.089, -0.0083, -0.0118, -0.0048),
                                                 (0.184, 0.135, 0.232, -0.0217, -0.0272, -0.0162),
                                                 (0.370, 0.287, 0.452, -0.0426, -0.0516, -0.0337))),
    ("-3, -0.5, 1, 1.65", 0.03, 0.207, -0.101, ((0.051, 0.020, 0.081, -0.0050, -0.0083, -0.0018),
                                                 (0.127, 0.044, 0.209, -0.0116, -0.0186, -0.0046),
                                                 (0.287, 0.047, 0.527, -0.0210, -0.0375, -0.0045))),
    ("-2, -0.2, 1, 2", 0.28, 0.249, -0.055, ((0.043, 0.019, 0.068, -0.0019, -0.0032, -0.0006),
                                              (0.127, 0.063, 0.192, -0.0056, -0.0086, -0.0026),
                                              (0.288, 0.153, 0.424, -0.0106, -0.0158, -0.0053))),
    ("-1.5, -0.3, 0.6, 1.5", 0.08, 0.258, -0.027, ((0.022, 0.005, 0.038, -0.0008, -0.0016, 0.0001),
                                                    (0.074, 0.038, 0.110, -0.0028, -0.0046, -0.0010),
                                                    (0.136, 0.021, 0.251, -0.0041, -0.0078, -0.0005))),
    ("-1, -0.5, 0.8, 1.2", 0.12, 0.122, -0.011, ((0.018, 0.004, 0.033, -0.0005, -0.0012, 0.0002),
                                                  (0.045, -0.0004, 0.091, -0.0014, -0.0027, -0.0002),
                                                  (0.039, -0.053, 0.131, -0.0021, -0.0039, -0.0003))),
    ("-3, -1, 1.5, 3", 0.23, 0.105, -0.008, ((0.078, -0.026, 0.181, 0.0020, 0.0003, 0.0037),
                                              (0.254, 0.041, 0.467, 0.0119, 0.0017, 0.0222),
                                              (-0.134, -0.272, 0.004, 0.0069, 0.0036, 0.0103))),
)


def docs_table(header: str) -> list[str]:
    """The table of docs/reproductions.md under ``header``, header first."""
    from tests.test_reproductions_tables import DOC, tables

    return next(table for table in tables(DOC) if table[0] == header)


def toy_instance_files(folder, instance) -> list[pd.DataFrame]:
    """One instance's results files as a ``--gammas 0`` toy run writes them, holding ``instance``'s figures (random
    pruning beside each kept fraction, moving nothing), read back."""
    from simulations.experiments.fairness.markdown import CENTRAL_RESULTS

    means, threshold, dp_gap, lever, cells = instance
    erm = pd.DataFrame({"seed": range(3), "gamma": 0.0, "keep": 1.0, "order": "erm", "threshold": threshold,
                        "accuracy": 0.87, "dp_gap": dp_gap, "eop_gap": 0.1, "eo_gap": 0.4, "lever": lever,
                        "toy_means": means})
    names = ("threshold_shift", "threshold_shift_low", "threshold_shift_high", "dp_change", "dp_change_low",
             "dp_change_high")
    rows = []
    for keep, cell in zip((0.8, 0.6, 0.4), cells):
        rows += [{"gamma": 0.0, "keep": keep, "order": "fairness", **dict(zip(names, cell))},
                 {"gamma": 0.0, "keep": keep, "order": "random", **dict(zip(names, (0.0, -0.01, 0.01) * 2))}]
    toy = pd.DataFrame(rows).assign(accuracy_change=-0.001, accuracy_change_low=-0.002, accuracy_change_high=0.0)
    toy["fig1_direction"] = (toy["threshold_shift_low"] > 0) & (toy["dp_change_high"] < 0)
    write_results(folder, {CENTRAL_RESULTS[0]: toy, CENTRAL_RESULTS[1]: erm},
                  f"fedvalue run fairness-central --experiment toy --gammas 0 --toy-means={means.replace(' ', '')}")
    return [read_results(folder / name) for name in CENTRAL_RESULTS[:2]]


def test_the_toy_instances_table_is_the_docs_from_the_docs_figures(tmp_path):
    from simulations.experiments.fairness.markdown import toy_instances_table

    frames = [frame for i, instance in enumerate(TOY_INSTANCES, 1)
              for frame in toy_instance_files(tmp_path / str(i), instance)]
    rows = toy_instances_table(*frames)
    assert rows == docs_table(rows[0])
    assert rows[3].startswith("| (−3, −0.5, 1, 1.65) (the default) | 0.03, 0.207 | −0.101 | +0.051, −0.0050 [")
    with pytest.raises(ValueError, match="toy summary and ERM rows in turn"):
        toy_instances_table(*frames[:3])
