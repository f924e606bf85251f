"""The measured tables of docs/faults-and-audit.md are held to what made them, or named as awaiting a run.

Every table there is a measurement. The attack study's tables are ``python -m bench.attack_study --markdown
docs/results`` verbatim once its results files (attack_*.csv) are kept; the audit-attacks table's verdicts
are those ``tests/fedvalue/audit/test_audit_attacks.py`` asserts on a real run; every other table is listed in
:data:`PENDING` with the command that would make its results, so a table added without either fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from bench.attack_study import docs_tables, read_results, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOC = (ROOT / "docs" / "faults-and-audit.md").read_text().splitlines()

#: Measured tables whose results files are not kept yet, by header line: the command(s) that would make them.
PENDING = {
    "| audit of a 1 GiB record | before | after |":
        "python -m bench.reader_memory (after) and --code CHECKOUT of the version before (before); prints only",
    "| kernel set of the audit (runs made with AVX-512 kernels) | replies bit for bit · to 1e-5 · only within "
    "rounding (of 180) | largest drift of a reply, of its update | audits intact before | after |":
        "fedvalue run noisy-clients --rounds 3 --seed S (S = 0-9), audited under each kernel set; no script yet",
    "| run (3 rounds, `--utility neg_loss`) | kernel set of the audit | before | after | numbers only within rounding "
    "· largest difference · over E_x |":
        "fedvalue run noisy-federation --rounds 3 --final-window 3 --flip-probabilities 1.0 (the benchmark's sizes, "
        "topk-ads and value-guard; tiny.PLAIN's, every policy), fedvalue run noisy-clients --utility neg_loss with "
        "conftest's TINY, each audited under each kernel set, here and on the version before; no script yet",
    "| count (of 40) | before | after |":
        "python -m tests.hostile.run_dirs.battery --json FILE, here and on the version before; no renderer yet",
    "| attack | class | before: audit (no key · key), reader | after |":
        "python -m tests.hostile.run_dirs.battery --json FILE, here and on the version before; no renderer yet",
}

REWRITE_HEADER = "| rewrite | before | after, no key | after, `--public-key` |"
#: Each row of the audit-attacks table (its first cell) and the rewrite of test_audit_attacks.py it reports.
REWRITES = {
    "last round removed from every file": "truncate_last_round",
    "`num_examples` changed, re-chained": "num_examples_changed",
    "`noisy` flag flipped, re-chained": "flip_noisy",
    "`stderr` changed, re-chained": "stderr_changed",
    "`ads_method` changed, re-chained": "ads_method_changed",
    "`valuation_seconds` changed, re-chained": "valuation_seconds_changed",
    "two clients' identities swapped, re-chained": "swap_identities",
    "value moved between clients, `records/` deleted": "move_value_and_delete_records",
    "`records/` replaced by a file": "records_replaced_by_a_file",
    "a value of 10^400, re-chained": "huge_number",
    "truncated `records/round-*.npz`": "truncated_record",
    "garbage record metadata, resealed": "garbage_record_metadata",
    "`run.json` a JSON list": "run_json_a_list",
    "a FIFO as `ledger.parquet`": "fifo_parquet",
    "a record linked to `/dev/zero`": "dev_zero_record",
    "`ledger.csv` linked to an outside file": "ledger_symlinked_outside",
    "a saved reply changed, resealed": "resealed_record",
    "`run.json` seed changed, re-chained": "run_json_seed_changed",
    "manifest deleted": "manifest_deleted",
    "manifest and `model.sig` deleted": "manifest_and_model_signature_deleted",
    "seals and manifest deleted": "seals_and_manifest_deleted",
}
#: The table's resume rows, whose "after" the named tests of test_audit_attacks.py assert (not a verdict).
RESUMES = {
    "`--resume`: a pickle payload in `checkpoint/`": "test_resume_never_runs_a_pickle_planted_in_the_checkpoint",
    "`--resume`: `checkpoint/` or `ledger.csv` a link": "test_resume_writes_nothing_through_links",
}


def tables(lines: list[str]) -> list[list[str]]:
    """Every markdown table of ``lines``, each as its lines (header first)."""
    found, current = [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return found


def unheld(rendered: list[str], lines: list[str]) -> list[str]:
    """The rendered tables that do not stand whole and alone in ``lines``, and the docs' tables under a
    rendered table's header that no rendered table is."""
    quoted = tables(lines)
    made = [table.splitlines() for table in rendered]
    headers = {table[0] for table in made}
    return ([table[0] + f" ({len(table) - 2} rows)" for table in made if table not in quoted]
            + [table[0] + " (a docs table the results do not make)" for table in quoted
               if table[0] in headers and table not in made])


def test_every_table_is_held_or_awaits_a_named_run():
    held = {table.splitlines()[0] for table in docs_tables(read_results(RESULTS))} | {REWRITE_HEADER}
    headers = {table[0] for table in tables(DOC)}
    assert not sorted(held & set(PENDING)), "now held by their results files: drop them from PENDING"
    assert not sorted(headers - held - set(PENDING)), "measured tables neither held nor listed in PENDING"
    assert not sorted(set(PENDING) - headers), "PENDING names tables the docs no longer hold"


def test_the_attack_study_tables_are_its_results_files():
    rendered = docs_tables(read_results(RESULTS))
    assert not unheld(rendered, DOC), ("tables of docs/results/attack_*.csv the docs do not hold (rerun "
                                      "python -m bench.attack_study --markdown docs/results)")


def _gains() -> dict[str, pd.DataFrame]:
    """A small study's tables: two attacks, every book, an undefined gain and an undefined interval."""
    rows = []
    for attack, scale in (("sybil-replica-2", 1.0), ("delta-weights", -1 / 3)):
        for book, positive in (("ads", True), ("tracin_outflow", True), ("loo", attack == "delta-weights")):
            gain = scale * (1 + len(book) / 7)
            rows.append({"partition": "iid", "strategy": "fedavg", "attack": attack, "book": book, "seeds": 3,
                         "gain": gain, "gain_low": gain - 1 / 9, "gain_high": gain + 2 / 11,
                         "honest_positive": positive, "paid": 0.1 / 3, "paid_honest": 0.17,
                         "defended_gain": gain / 3, "defended_gain_low": float("nan"),
                         "defended_gain_high": float("nan"), "defended_honest_positive": positive,
                         "defended_paid": 2 / 7, "defended_paid_honest": 0.18, "accuracy_change": -1 / 300,
                         "accuracy_change_low": -0.01, "accuracy_change_high": 1 / 600})
    gains = pd.DataFrame(rows)
    cost = pd.DataFrame([{"partition": "iid", "strategy": "fedavg", "book": "ads", "mean_share_change": 1 / 27,
                          "max_share_change": 0.17281, "free_rider_flags": 0, "clustered_rows": 2}])
    shells = pd.DataFrame([{"seed": s, "shells": m, "method": "party-ds", "broker_total": 0.3,
                            "gain": 1 + m / (s + 7)} for s in (0, 1) for m in (1, 2)])
    return {"gains": gains, "aggregation": gains.iloc[:3], "cost": cost, "norm-cap-gains": gains,
            "norm-cap-cost": cost, "shells": shells, "identities": gains}


def test_the_attack_study_results_files_render_the_tables_their_frames_do(tmp_path):
    """What --results writes is all --markdown needs: the tables from the files equal those from the frames."""
    frames = _gains()
    write_results(tmp_path, frames, "python -m bench.attack_study --out DIR --results FOLDER")
    assert (tmp_path / "attack_gains.csv").read_text().startswith("# python -m bench.attack_study --out DIR")
    from_files = docs_tables(read_results(tmp_path))
    assert len(from_files) == 8 and from_files == docs_tables(frames)


def test_a_changed_number_in_an_attack_table_is_caught():
    rendered = docs_tables(_gains())
    lines = "\n\n".join(rendered).splitlines()
    assert not unheld(rendered, lines)
    row = next(i for i, line in enumerate(lines) if "sybil-replica-2" in line)
    changed = list(lines)
    changed[row] = re.sub(r"\d(?=[^\d]*$)", lambda m: str((int(m.group()) + 1) % 10), lines[row])
    assert changed[row] != lines[row] and unheld(rendered, changed)


def _verdict(cell: str) -> str:
    """A verdict cell without its emphasis and its note in brackets."""
    return re.sub(r"\s*\(.*\)$", "", cell.replace("**", "")).strip()


def rewrite_mismatches(lines: list[str]) -> list[str]:
    """Rows of the audit-attacks table whose "after" verdicts are not what test_audit_attacks.py asserts, and
    rewrites the test makes that the table leaves out."""
    from tests.fedvalue.audit import test_audit_attacks as audit_attacks

    asserted = {attack.__name__: (without, with_key) for attack, without, with_key in audit_attacks.ATTACKS}
    table = next(table for table in tables(lines) if table[0] == REWRITE_HEADER)
    wrong, seen = [], set()
    for row in table[2:]:
        label, _, without, with_key = [cell.strip() for cell in row.strip("|").split(" | ")]
        if label in RESUMES and hasattr(audit_attacks, RESUMES[label]):
            continue
        seen.add(REWRITES.get(label))
        if asserted.get(REWRITES.get(label)) != (_verdict(without), _verdict(with_key)):
            wrong.append(row)
    return wrong + [f"{name}: not in the table" for name in set(asserted) - seen - {"unchanged"}]


def test_the_audit_attacks_table_says_what_the_audit_tests_assert():
    assert not rewrite_mismatches(DOC)


def test_a_changed_verdict_in_the_audit_attacks_table_is_caught():
    at = DOC.index("| manifest deleted | intact (no manifest then) | NOT verifiable | "
                   "NOT intact (`model.sig` lists it) |")
    changed = list(DOC)
    changed[at] = changed[at].replace("NOT verifiable", "NOT intact")
    assert rewrite_mismatches(changed) == [changed[at]]


def test_the_digits_table_needs_a_run_of_the_attacks(tmp_path, capsys):
    """--digits reads a ``fedvalue run attacks`` directory; any other folder is one line naming the option."""
    from bench.attack_study import main

    with pytest.raises(SystemExit):
        main(["--digits", str(tmp_path)])
    assert "--digits: expected a fedvalue run attacks directory (attacks.csv, run.json)" in capsys.readouterr().err


def test_the_identity_seeds_need_at_least_two(tmp_path, capsys):
    """--identity-seeds N runs N seeds of a part; fewer than two give no interval, and the CLI says so."""
    from bench.attack_study import main

    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--identity-seeds", "1"])
    assert "--identity-seeds: expected a whole number of seeds >= 2; got 1" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
