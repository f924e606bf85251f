"""Every table of docs/reproductions.md is held to the results file(s) it is rendered from, or names the run that
would make them.

A table is a line starting with ``|`` followed by a ``|---`` line; it is known by that first line, its header.
Tables may share a header (the noisy-federation policy tables, one a federation): one entry stands for them all, and
its rendering makes every one of them under its caption, the lines between included. Each header is in exactly one
of:

- :data:`HELD`: rendered here from results files under docs/results/ (CSVs headed by the command that made them
  and the commit: :mod:`simulations.runner.results_files`); the docs' table must be the rendering, row for row;
- :data:`HELD_BY_TEST`: held by another test, named (the regimes tables, the value-guard tuning table);
- :data:`PENDING`: no results file yet: the exact command(s) that would make it and why it is not kept; where the
  renderer is written already, its :class:`Rendering` too, and once every file it reads is made the entry must move
  to :data:`HELD`;
- :data:`NOT_MEASURED`: settings or definitions, not a measurement.

A table under no header of these fails, and so does an entry whose table is gone or a header in two of them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.regimes import ucb_tuning
from bench.regimes.table import HEADER as REGIMES_HEADER
from bench.regimes.table import read_results as read_regimes
from bench.regimes.tuning import markdown_rows as tuning_rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOC = (ROOT / "docs" / "reproductions.md").read_text().splitlines()


@dataclass(frozen=True)
class Rendering:
    """A table made from results files: ``function`` (``module:name``) called with the frames of ``files`` (under
    the results folder, in order) and ``options``, returning the table's lines, header first."""

    function: str
    files: tuple[str, ...]
    options: Mapping = field(default_factory=dict)

    def lines(self, results: Path = RESULTS) -> list[str]:
        from simulations.runner.results_files import read_results

        module, name = self.function.split(":")
        render = getattr(importlib.import_module(module), name)
        return render(*(read_results(results / file) for file in self.files), **self.options)


@dataclass(frozen=True)
class Pending:
    """A table no results file holds yet: the command(s) that would make its files, in order, why it is not kept,
    and its renderer when one is written."""

    commands: tuple[str, ...]
    reason: str
    rendering: Rendering | None = None


FAIRNESS_MARKDOWN = "simulations.experiments.fairness.markdown"
RECIPROCITY_MARKDOWN = "simulations.experiments.reciprocity.markdown"
#: The results files of one procurement run (simulations.experiments.procurement.markdown.PROCUREMENT_RESULTS).
PROCUREMENT = ("procurement_summary.csv", "procurement_paired.csv", "procurement_per_seed.csv",
               "procurement_purchases.csv", "procurement_offers.csv")

#: The toy instances of [FAIRINFL] §5 the docs' over-instances table runs, in its order, and their results folder.
TOY_MEANS = ("-2,-0.1,0.5,1", "-3,-0.5,1,1.65", "-2,-0.2,1,2", "-1.5,-0.3,0.6,1.5", "-1,-0.5,0.8,1.2", "-3,-1,1.5,3")
TOY_INSTANCES = "fairness_toy_instances"

#: Tables rendered from results files here: header -> how.
HELD: dict[str, Rendering] = {
    "| μ = (μ_00, μ_10, μ_01, μ_11) | ERM threshold, DP | lever | kept 80 %: shift, DP change | kept 60 % "
    "| kept 40 % | shows at |":
        Rendering(f"{FAIRNESS_MARKDOWN}:toy_instances_table", tuple(
            f"{TOY_INSTANCES}/{i}/{name}" for i in range(1, len(TOY_MEANS) + 1)
            for name in ("fairness_central_toy.csv", "fairness_central_toy_erm.csv"))),
    "| | paper ([ADS] Figs. 5, 6, four LLMs) | minibatches of 10 (default) | full batch |":
        Rendering("simulations.experiments.procurement.markdown:procurement_table",
                  (*PROCUREMENT, *(f"procurement_full_batch/{name}" for name in PROCUREMENT))),
    "| dataset | influence | start | α(0.75) conditional | α(0.75) all-splits | paper | Pearson "
    "| neg. inflow / outflow |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:healthcare_table", (
            "reciprocity_breast-cancer_figures.csv", "reciprocity_zero/reciprocity_breast-cancer_figures.csv",
            "reciprocity_diabetes_figures.csv", "reciprocity_zero/reciprocity_diabetes_figures.csv")),
    "| figure | paper | measured |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:healthcare_figures_table", (
            "reciprocity_breast-cancer_figures.csv", "reciprocity_diabetes_figures.csv",
            "reciprocity_1000_steps/reciprocity_diabetes_figures.csv")),
    "| figure | paper | ℓ = (f − y)² (default) | ℓ = ½(f − y)² |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:half_loss_table", (
            "reciprocity_diabetes_figures.csv", "reciprocity_half_loss/reciprocity_diabetes_figures.csv",
            "reciprocity_1000_steps/reciprocity_diabetes_figures.csv",
            "reciprocity_half_loss_1000_steps/reciprocity_diabetes_figures.csv")),
    "| curvature | rule | changed | test accuracy | DP gap | EO gap | DP − random-matched | accuracy − gradient edit "
    "| beats random |":
        Rendering(f"{FAIRNESS_MARKDOWN}:tabular_mlp_table", ("fairness_central_mlp/fairness_central_tabular.csv",)),
    "| selection | rule | test accuracy | test DP | SIM-JACK − Fair-IJ, accuracy | rule − gradient edit, accuracy |":
        Rendering(f"{FAIRNESS_MARKDOWN}:adult_table", ("fairness_adult_summary.csv",)),
    "| rule (K = 2) − random drops (K = 4) | accuracy | DP gap | EOP gap | EO gap | beats random (DP) |":
        Rendering(f"{FAIRNESS_MARKDOWN}:comparison_table", ("fairness_k4/fairness_comparison.csv",),
                  {"k": 2, "random_k": 4, "dataset": "slid"}),
    "| data set | rule | accuracy | DP gap | EOP gap | EO gap |":
        Rendering(f"{FAIRNESS_MARKDOWN}:tradeoff_table", ("fairness_tradeoff.csv",)),
    "| data set | rule | accuracy | DP gap | EOP gap | EO gap | beats random (DP) |":
        Rendering(f"{FAIRNESS_MARKDOWN}:comparison_table", ("fairness_comparison.csv",), {"k": 2, "random_k": 2}),
    "| data set | score | correlation | top = best exact drop | top drop raises the gap |":
        Rendering(f"{FAIRNESS_MARKDOWN}:scoring_table", ("fairness_scoring.csv",)),
    "| γ | kept | pruned by | test accuracy | DP gap | accuracy − random | DP − random |":
        Rendering(f"{FAIRNESS_MARKDOWN}:adam_pruning_table", tuple(
            f"fairness_adam_{gamma}/fairness_central_pruning.csv" for gamma in ("1", "0.02"))),
    "| retraining | kept | pruned by | threshold shift | accuracy change | DP gap change |":
        Rendering(f"{FAIRNESS_MARKDOWN}:toy_table", ("fairness_central_toy.csv",)),
    "| curvature | rule | changed weights | test accuracy | DP gap | EOP gap | EO gap | DP − random-matched "
    "| accuracy − random-matched | beats random |":
        Rendering(f"{FAIRNESS_MARKDOWN}:tabular_table", ("fairness_central_tabular.csv",)),
    "| kept | pruned by | test accuracy | DP gap | accuracy − random | DP − random |":
        Rendering(f"{FAIRNESS_MARKDOWN}:pruning_table", ("fairness_central_pruning.csv",)),
    "| method | utility | tied | exactly 0 | distinct values |":
        Rendering("simulations.experiments.synthetic_data.markdown:ties_table",
                  ("augmentation_ties.csv", "augmentation_likelihood/augmentation_ties.csv")),
}

#: Tables another test holds to their results files: header -> that test.
HELD_BY_TEST = {
    REGIMES_HEADER.splitlines()[0]: "tests/test_results_tables.py",
    tuning_rows(read_regimes(RESULTS / "guard_tuning.csv"))[0]: "tests/test_results_tables.py",
}

NOISY_CLIENTS_MARKDOWN = "simulations.experiments.noisy_clients.markdown"
#: The digits study both noisy-clients tables read (the second beside the Fashion-MNIST study).
STUDY_DIGITS = "fedvalue run noisy-clients-study --seeds 20 --out ~/fedvalue-runs/study --results docs/results/noisy_clients_study"
#: The options of each MovieLens run the docs' tables set side by side, by its results folder's suffix.
MOVIELENS_RUNS = {"10x10": "", "10x1": " --repetitions 10 --initializations 1 --influence both --marginal-users 30",
                  "1x10": " --repetitions 1 --initializations 10",
                  "3x1": " --repetitions 3 --initializations 1 --influence both --marginal-users 30",
                  "federated_3x1": " --repetitions 3 --initializations 1 --local-steps 5 --steps 200"}
MOVIELENS_REASON = "MovieLens runs take minutes to hours (the default 10 × 10 took 2 h here); not kept yet"


def movielens(run: str) -> str:
    """The command of a MovieLens run of :data:`MOVIELENS_RUNS`, writing its results folder."""
    return f"fedvalue run reciprocity --dataset movielens{MOVIELENS_RUNS[run]} --results docs/results/movielens_{run}"


#: Measured tables no results file holds yet: header -> the runs that would make them and why they are not kept.
PENDING: dict[str, Pending] = {
    "| splits × initializations averaged | α(0.75) | Pearson | negative inflow | negative outflow |": Pending(
        (movielens("10x10"),), MOVIELENS_REASON,
        Rendering(f"{RECIPROCITY_MARKDOWN}:movielens_prefixes_table",
                  ("movielens_10x10/reciprocity_movielens_prefixes.csv",
                   "movielens_10x10/reciprocity_movielens_figures.csv"))),
    "| runs averaged | 1 split | 2 splits | 3 splits | 10 splits |": Pending(
        (movielens("10x1"), movielens("10x10")), MOVIELENS_REASON,
        Rendering(f"{RECIPROCITY_MARKDOWN}:movielens_prefix_alphas_table",
                  ("movielens_10x1/reciprocity_movielens_prefixes.csv",
                   "movielens_10x10/reciprocity_movielens_prefixes.csv"))),
    "| figure | paper (10 × 10) | measured (10 × 1) | split 0 × 10 initializations | 3 × 1 "
    "| federated, E = 5 (3 × 1) |": Pending(
        tuple(movielens(run) for run in ("10x1", "1x10", "3x1", "federated_3x1")), MOVIELENS_REASON,
        Rendering(f"{RECIPROCITY_MARKDOWN}:movielens_figures_table", tuple(
            f"movielens_{run}/reciprocity_movielens_{name}.csv" for run in ("10x1", "1x10", "3x1", "federated_3x1")
            for name in ("figures", "alpha_by_step")))),
    "| | ADS | LOO | random |": Pending((
        STUDY_DIGITS,),
        "the renderer is written; the run has not been made with --results yet (the second table's digits columns "
        "come from the same run, so its figures and this table's will agree: LOO's third decimals differ today)",
        Rendering(f"{NOISY_CLIENTS_MARKDOWN}:study_table", ("noisy_clients_study/noisy_clients_study_summary.csv",))),
    "| | Fashion-MNIST, paper's protocol: ADS | LOO | random | digits stand-in: ADS | LOO | random |": Pending((
        "fedvalue run noisy-clients-study --dataset fashion-mnist --examples-per-client 120 --learning-rate 0.01 "
        "--seeds 20 --out ~/fedvalue-runs/study-fashion --results docs/results/noisy_clients_study_fashion",
        STUDY_DIGITS),
        "the renderer is written; the runs have not been made with --results yet",
        Rendering(f"{NOISY_CLIENTS_MARKDOWN}:study_pair_table", (
            "noisy_clients_study_fashion/noisy_clients_study_summary.csv",
            "noisy_clients_study/noisy_clients_study_summary.csv"))),
    "| variant (value-driven sampler; utility −loss unless said) | rounds to 95%, p = 1 / 0.5 | AUC p = 1 / 0.5 "
    "| final p = 1 / 0.5 |": Pending(
        tuple(ucb_tuning.command(variant) for variant in ucb_tuning.VARIANTS),
        "the eleven variants' runs, one results folder each, not made yet (the docs' figures are from the runs of "
        "fedvalue run noisy-federation the commands replace)",
        Rendering("bench.regimes.ucb_tuning:markdown_rows", ucb_tuning.results_files())),
    "| policy | final acc | AUC | rounds to 90% | rounds to 95% | s to 90% (steady / measured) "
    "| s to 95% (steady / measured) | bad share of training | detection precision / recall | valuation s / round |":
        Pending((
        "fedvalue run noisy-federation --out DIR --seed 1 --seeds 5 --policies random,power-of-choice,greedyfed,"
        "value-ucb,topk-ads,topk-loo,value-weighted,trimmed-mean,median,krum,oracle "
        "--results docs/results/noisy_federation",),
        "the benchmark's printed summary tables (three federations, 115 runs: 38 minutes on the shared 2-core machine) "
        "were copied before it had --results; its policies are the docs' run's defaults, before value-guard",
        Rendering("simulations.experiments.noisy_federation.markdown:policy_tables",
                  ("noisy_federation/noisy_federation_summary.csv",), {"bold": ("value-ucb",)})),
}

#: Tables that state settings or definitions, not measurements: header -> what they hold.
NOT_MEASURED = {
    "| experiment | hyperparameter | value | status |": "every experiment's hyperparameters and how each was set",
    "| hyperparameter | value | status |": "the noisy-federation benchmark's hyperparameters and how each was set",
    "| `--bad-kind` | the bad client | behaviour | strength p |": "the kinds of bad client and their settings",
}

LISTS = {"HELD": HELD, "HELD_BY_TEST": HELD_BY_TEST, "PENDING": PENDING, "NOT_MEASURED": NOT_MEASURED}


def located(lines: list[str]) -> list[tuple[int, list[str]]]:
    """Every markdown table of ``lines``: a line starting with ``|`` followed by a ``|---`` line, and the rows
    after them up to the first line that is no row; each as (the index of its header, its lines, header first)."""
    found = []
    for index, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[index + 1].startswith("|---") and not (
                index and lines[index - 1].startswith("|")):
            end = index + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            found.append((index, lines[index:end]))
    return found


def tables(lines: list[str]) -> list[list[str]]:
    """Every markdown table of ``lines`` (:func:`located`), as its lines."""
    return [table for _, table in located(lines)]


def unheld(lines: list[str], held: Mapping[str, Rendering], results: Path = RESULTS) -> list[str]:
    """The headers of ``held`` whose tables in ``lines`` are not their rendering, each with the first line that
    differs. A rendering may hold several tables under one header, each after a caption: it is then held to the
    lines of ``lines`` from as far before the first table as the rendering's header stands in it (its caption) to
    the end of the last table under that header, every line between included."""
    wrong = []
    found = located(lines)
    for header in dict.fromkeys(table[0] for _, table in found):
        if header in held:
            made = held[header].lines(results)
            under = [(index, table) for index, table in found if table[0] == header]
            start = max(0, under[0][0] - (made.index(header) if header in made else 0))
            region = lines[start:under[-1][0] + len(under[-1][1])]
            if region != made:
                first = next((mine for mine, theirs in zip(region, made) if mine != theirs), f"{len(region)} lines "
                             f"against {len(made)}")
                wrong.append(f"{header}: {first}")
    return wrong


def listing_problems(lines: list[str], lists: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The tables of ``lines`` in none of ``lists``, the entries whose table ``lines`` does not hold, and the headers
    in two lists."""
    headers = {table[0] for table in tables(lines)}
    listed = {header for entries in lists.values() for header in entries}
    names = list(lists)
    return ([f"in no list: {header}" for header in sorted(headers - listed)]
            + [f"{name} names a table the docs do not hold: {header}" for name, entries in lists.items()
               for header in entries if header not in headers]
            + [f"in {a} and {b}: {header}" for i, a in enumerate(names) for b in names[i + 1:]
               for header in sorted(set(lists[a]) & set(lists[b]))])


def test_every_table_is_in_one_list_and_every_entry_has_its_table():
    problems = listing_problems(DOC, LISTS)
    assert not problems, "docs/reproductions.md against HELD, HELD_BY_TEST, PENDING, NOT_MEASURED:\n" + \
        "\n".join(problems)


def test_an_unlisted_table_a_gone_table_and_a_table_listed_twice_are_found():
    lines = ["text", "| a | b |", "|---|---|", "| 1 | 2 |", "", "| c |", "|---|", "| 3 |", "| 4 |", "more text"]
    assert tables(lines) == [["| a | b |", "|---|---|", "| 1 | 2 |"], ["| c |", "|---|", "| 3 |", "| 4 |"]]
    assert not listing_problems(lines, {"HELD": {"| a | b |": None}, "PENDING": {"| c |": None}})
    assert listing_problems(lines, {"HELD": {"| a | b |": None}, "PENDING": {}}) == ["in no list: | c |"]
    assert listing_problems(lines, {"HELD": {"| a | b |": None, "| d |": None}, "PENDING": {"| c |": None}}) == [
        "HELD names a table the docs do not hold: | d |"]
    assert listing_problems(lines, {"HELD": {"| a | b |": None, "| c |": None}, "PENDING": {"| c |": None}}) == [
        "in HELD and PENDING: | c |"]


def test_the_held_tables_are_their_results_files():
    for rendering in HELD.values():
        for file in rendering.files:
            assert (RESULTS / file).read_text().startswith("# "), f"{file}: no header naming its command"
    wrong = unheld(DOC, HELD)
    assert not wrong, "tables that are not their results files' rendering (render them again):\n" + "\n".join(wrong)


def test_a_pending_table_whose_results_are_made_moves_to_held():
    made = [header for header, pending in PENDING.items()
            if pending.rendering is not None and all((RESULTS / f).is_file() for f in pending.rendering.files)]
    assert not made, "results files made: move these from PENDING to HELD:\n" + "\n".join(made)


def test_pending_entries_name_their_runs_and_a_reason():
    for header, pending in PENDING.items():
        assert pending.commands and pending.reason, header
        assert all(c.startswith(("fedvalue run ", "python -m ")) for c in pending.commands), header
        if pending.rendering is not None:
            assert all("--results docs/results" in c for c in pending.commands), header


def test_every_renderer_named_exists():
    """A renderer's name is checked before its files exist, so a pending table is ready to move once they do."""
    from simulations.experiments.procurement.markdown import PROCUREMENT_RESULTS

    named = [*HELD.items(), *((header, pending.rendering) for header, pending in PENDING.items() if pending.rendering)]
    for header, rendering in named:
        module, name = rendering.function.split(":")
        assert callable(getattr(importlib.import_module(module), name, None)), f"{rendering.function} ({header})"
    assert PROCUREMENT == PROCUREMENT_RESULTS


def test_the_tests_named_as_holding_tables_exist():
    for header, test in HELD_BY_TEST.items():
        assert (ROOT / test).is_file(), f"{test} (holding {header})"


def _synthetic_scoring(tmp_path: Path, command: str) -> Rendering:
    """The docs' scoring table as a results file of made-up figures in ``tmp_path``, and its rendering."""
    import pandas as pd

    from simulations.runner.results_files import write_results

    rows = []
    for dataset in ("gaussian", "slid"):
        for i, score in enumerate(("first-order", "renormalized", "curvature-unrenormalized", "curvature")):
            row = {"dataset": dataset, "score": score, "seeds": 10}
            for column in ("correlation", "top_is_best", "top_raises_gap"):
                row |= {column: 0.5 + i / 10, f"{column}_low": 0.4 + i / 10, f"{column}_high": 0.6 + i / 10}
            rows.append(row)
    write_results(tmp_path, {"fairness_scoring.csv": pd.DataFrame(rows)}, command)
    return Rendering(f"{FAIRNESS_MARKDOWN}:scoring_table", ("fairness_scoring.csv",))


def test_a_changed_number_in_a_held_table_is_caught(tmp_path):
    """On a copy of the docs whose scoring table is replaced by a results file's rendering: the copy is held, and
    one digit changed in one row, or the docs' own table against that file, is caught."""
    header = "| data set | score | correlation | top = best exact drop | top drop raises the gap |"
    rendering = _synthetic_scoring(tmp_path, "fedvalue run fairness --out DIR --results FOLDER")
    held = {header: rendering}
    assert unheld(DOC, held, tmp_path), "the docs' own figures are not the made-up file's"
    table = next(t for t in tables(DOC) if t[0] == header)
    start = DOC.index(header)
    copy = DOC[:start] + rendering.lines(tmp_path) + DOC[start + len(table):]
    assert not unheld(copy, held, tmp_path)
    row = start + 4
    changed = list(copy)
    changed[row] = re.sub(r"\d(?=[^\d]*$)", lambda m: str((int(m.group()) + 1) % 10), copy[row])
    assert changed[row] != copy[row]
    assert unheld(changed, held, tmp_path) == [f"{header}: {changed[row]}"]


class _Given:
    """A rendering of given lines (no results file)."""

    def __init__(self, lines: list[str]) -> None:
        self.made = lines

    def lines(self, results: Path = RESULTS) -> list[str]:
        return list(self.made)


def test_tables_under_one_header_are_held_as_one_region_with_their_captions():
    """Two tables under one header, each after its caption: held together with the lines between; a changed
    number in the second, a changed caption, a row too many and a third table under the header elsewhere are
    caught."""
    blocks = ["**a, federation x** (2 seeds)", "", "| p | v |", "|---|---|", "| r | 1 |", "",
              "**a, federation y** (2 seeds)", "", "| p | v |", "|---|---|", "| r | 2 |", "| s | 3 |"]
    held = {"| p | v |": _Given(blocks)}
    lines = ["text", "", *blocks, "", "more text"]
    assert not unheld(lines, held)
    for old, new in (("| s | 3 |", "| s | 4 |"), ("federation y", "federation z")):
        changed = [line.replace(old, new) for line in lines]
        assert unheld(changed, held) == [f"| p | v |: {next(c for c, o in zip(changed, lines) if c != o)}"]
    assert unheld(lines[:-2] + ["| t | 5 |", "", "more text"], held) == ["| p | v |: 13 lines against 12"]
    elsewhere = lines + ["", "| p | v |", "|---|---|", "| r | 1 |"]
    assert unheld(elsewhere, held) == ["| p | v |: 18 lines against 12"]

