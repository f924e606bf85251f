"""The measured tables of docs/faults-and-audit.md are held to what made them, or named as awaiting a run.

Every table there is a measurement. The lists are :mod:`bench.docs_tables.faults_audit`'s (``python -m
bench.docs_tables`` renders the held tables into the doc): the attack study's tables are ``python -m
bench.attack_study --markdown docs/results`` verbatim once its results files (attack_*.csv) are kept, and the two
kernel-set tables of "An audit on another machine" ``python -m bench.portability table FILE`` of theirs
(:data:`KERNEL_RESULTS`); the audit-attacks table's verdicts are those ``tests/fedvalue/audit/test_audit_attacks.py``
asserts on a real run; the tables of :data:`KEPT` are rendered from their results files of the version before and
this one once both are in docs/results; every other table is listed in :data:`PENDING` with the command that would
make its results, so a table added without either fails here. The kernel-set study's runs and audits cannot run in
the suite (Ray, retraining): its renderers and the reading of the audit's report are checked on small files of their
real format.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from bench import reader_memory
from bench.attack_study import docs_tables, read_results, write_results
from bench.docs_tables import run_dir_battery as battery_tables
from bench.docs_tables import faults_audit
from bench.docs_tables.faults_audit import KEPT, PENDING, REWRITE_HEADER, kept_kernel_tables, kept_tables
from bench.portability import tables as kernel_tables
from tests.hostile.run_dirs import battery
from tests.hostile.run_dirs.attacks import ATTACKS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOC = (ROOT / "docs" / "faults-and-audit.md").read_text().splitlines()

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
    held = {table.splitlines()[0] for table in faults_audit.rendered(RESULTS)} | {REWRITE_HEADER}
    headers = {table[0] for table in tables(DOC)}
    assert not sorted(held & set(PENDING)), "now held by their results files: drop them from PENDING"
    assert not sorted(headers - held - set(PENDING)), "measured tables neither held nor listed in PENDING"
    assert not sorted(set(PENDING) - headers), "PENDING names tables the docs no longer hold"


def test_the_attack_study_tables_are_its_results_files():
    rendered = docs_tables(read_results(RESULTS))
    assert not unheld(rendered, DOC), ("tables of docs/results/attack_*.csv the docs do not hold (python -m "
                                      "bench.docs_tables renders them into the doc)")


def test_the_kernel_set_tables_are_their_results_files():
    assert not unheld(kept_kernel_tables(), DOC), ("kernel-set tables of docs/results/audit_kernels*.csv the docs do "
                                                  "not hold (python -m bench.docs_tables renders them into the doc)")


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


def test_the_before_and_after_tables_are_their_results_files():
    """Vacuous until a table's two files are kept; then the docs hold exactly what they render."""
    assert not unheld(kept_tables(RESULTS), DOC), ("a table of KEPT is not what its results files render: python "
                                                  "-m bench.docs_tables renders it into docs/faults-and-audit.md")
    assert not sorted(set(KEPT) - {table[0] for table in tables(DOC)}), "KEPT names tables the docs no longer hold"


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
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--identity-strategy", "fedmedian"])
    assert "--identity-strategy: expected with --identity-seeds N; got fedmedian alone" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- the before/after tables' renderers


def _doc_table(header: str) -> list[str]:
    return next(table for table in tables(DOC) if table[0] == header)


def _keep_reader_memory(monkeypatch, folder: Path, name: str, peaks_mib: dict[tuple[str, str], int]) -> None:
    """bench.reader_memory's --keep, its runs and audits replaced by ``peaks_mib`` (by audit mode and run)."""
    def cli(code, *arguments, measure=False):
        if arguments[0] == "run":
            record = Path(arguments[arguments.index("--out") + 1]) / reader_memory.RECORD
            record.parent.mkdir(parents=True)
            record.write_bytes(b"a round record")
            return None, 0, ""
        mode = "no recompute" if "--no-recompute" in arguments else "recompute"
        run = reader_memory.SPARSE if Path(arguments[1]).name == "sparse" else reader_memory.WRITTEN
        return peaks_mib[mode, run] * 1024, 1, f"{arguments[1]}: 1 rounds, 2 ledger rows: NOT intact"

    monkeypatch.setattr(reader_memory, "_cli", cli)
    assert reader_memory.main(["--code", str(folder), "--work", str(folder / f"runs-{name}"), "--keep", str(folder / name)]) == 0


def test_the_reader_memory_table_is_rendered_from_the_two_kept_files(tmp_path, monkeypatch):
    """What --keep writes is what docs_table reads: the docs' numbers kept as two results files give the docs' table."""
    _keep_reader_memory(monkeypatch, tmp_path, "reader_memory_before.txt",
                        {("recompute", "as written"): 557, ("recompute", reader_memory.SPARSE): 2555,
                         ("no recompute", "as written"): 402, ("no recompute", reader_memory.SPARSE): 2448})
    _keep_reader_memory(monkeypatch, tmp_path, "reader_memory_after.txt",
                        {("recompute", "as written"): 562, ("recompute", reader_memory.SPARSE): 1534,
                         ("no recompute", "as written"): 407, ("no recompute", reader_memory.SPARSE): 436})
    kept = (tmp_path / "reader_memory_after.txt").read_text().splitlines()
    assert kept[0].startswith("# python -m bench.reader_memory --code ") and "(commit " in kept[0]
    assert "audit no recompute | 1 GiB sparse record | peak RSS 436 MiB | exit 1 | " in "\n".join(kept)
    assert kept_tables(tmp_path) == ["\n".join(_doc_table(reader_memory.DOCS_HEADER))]
    with pytest.raises(ValueError, match="the before file holds no 'audit recompute | 1 GiB sparse record' line"):
        reader_memory.docs_table("# a header\n", (tmp_path / "reader_memory_after.txt").read_text())


def _result(rc: int | None = 0, verdict: str | None = None, outcome: str = "exited", stdout: str = "",
            stderr: str = "", peak_mb: int = 300) -> dict:
    """One command's result as battery.run_command keeps it."""
    return {"argv": [], "rc": rc, "seconds": 1.0, "peak_mb": peak_mb, "outcome": outcome, "verdict": verdict,
            "stdout": stdout, "stderr": stderr}


INTACT, BROKEN, TRACEBACK = _result(0, "intact"), _result(1, "NOT intact"), "Traceback (most recent call last):\n"
#: A few attacks as the docs' table reports them, before and after: (harms, results) of each side.
MEASURED = {
    "unchanged": (([], {"audit": INTACT, "audit --public-key": INTACT}),
                  ([], {"audit": INTACT, "audit --public-key": INTACT})),
    "unchanged_audited_through_tilde": (([], {"audit": _result(2)}), ([], {"audit": INTACT})),
    "run_and_audit_with_a_relative_out": (
        (["the run with a relative --out failed and its directory was removed"], {"run": _result(2), "audit": _result(2)}),
        ([], {"run": _result(0), "audit": INTACT})),
    "resume_with_unsealed_sizes": ((["ledger.csv: a refused command changed or removed it (committed data lost)"],
                                    {"resume": _result(2)}), ([], {"resume": _result(2)})),
    "record_names_an_exact_estimator_over_copied_replies": (
        (["audit: drove memory to 3022 MB"], {"audit": _result(-9, outcome="memory", peak_mb=3022),
                                              "audit --public-key": _result(-9, outcome="timeout")}),
        ([], {"audit": BROKEN, "audit --public-key": BROKEN})),
    "mnist_path_outside": (
        (["the audit read files outside the run directory named by run.json (['t10k-images-idx3-ubyte.gz'])"],
         {"audit": _result(0, "NOT verifiable"), "audit --public-key": BROKEN}),
        ([], {"audit": _result(0, "NOT verifiable"), "audit --public-key": BROKEN})),
    "deeply_nested_run_json": (
        ([], {"audit": _result(1, stderr=TRACEBACK), "report": _result(1, stderr=TRACEBACK)}),
        ([], {"audit": BROKEN, "report": _result(2)})),
    "manifest_name_forges_a_verdict": (
        (["audit: sent control characters to the terminal", "audit --public-key: sent control characters to the "
          "terminal"], {"audit": BROKEN, "audit --public-key": BROKEN}),
        ([], {"audit": BROKEN, "audit --public-key": BROKEN})),
    "tolerance_nan_inf_negative": (
        (["--tolerance accepted: ['tolerance nan', 'tolerance inf', 'tolerance -1']"],
         {"tolerance nan": _result(1, "NOT intact"), "tolerance inf": _result(0, "intact"),
          "tolerance -1": _result(1, "NOT intact")}),
        ([], {"tolerance nan": _result(2), "tolerance inf": _result(2), "tolerance -1": _result(2)})),
}
#: The docs' counts, before and after.
COUNTS = ({"intact_and_harmful": 6, "harms": 23, "hang": 5, "traceback": 3, "missed_forgery": 11, "false_alarm": 4},
          {"intact_and_harmful": 0, "harms": 0, "hang": 0, "traceback": 0, "missed_forgery": 0, "false_alarm": 0})


def _keep_battery(folder: Path, side: int, command: str, **changed) -> None:
    """A battery --json file of every attack: those of MEASURED as measured, the others audited intact."""
    rows = [battery.case_row(spec, *(MEASURED[spec.name][side] if spec.name in MEASURED else
                                     ([], {"audit": INTACT}))) for spec in ATTACKS]
    kept = {**battery.kept_record(command, 60.0, 3000.0, COUNTS[side], rows), **changed}
    (folder / ("run_dir_battery_before.json", "run_dir_battery_after.json")[side]).write_text(json.dumps(kept))


def test_the_battery_tables_are_rendered_from_the_two_kept_files(tmp_path):
    """The JSON each side's battery keeps holds every cell: the docs' counts give the docs' counts table, and
    attacks measured as the docs report them give the docs' rows."""
    _keep_battery(tmp_path, 0, "python -m tests.hostile.run_dirs.battery --code /tmp/before --json FILE")
    _keep_battery(tmp_path, 1, "python -m tests.hostile.run_dirs.battery --json FILE")
    counts, attacks = kept_tables(tmp_path)
    assert counts == "\n".join(_doc_table("| count (of 40) | before | after |"))
    rows = attacks.splitlines()
    assert len(rows) == 2 + len(ATTACKS) and rows[0] == battery_tables.ATTACKS_HEADER
    for name, ((harms, _), _) in MEASURED.items():
        row = next(line for line in rows if line.startswith(f"| {name.replace('_', ' ')} |"))
        before, after = row.split(" | ")[2:4]
        for harm in harms:  # each harm in bold, without the command it starts with, cut to the cell's width
            shown = harm.split(": ", 1)[1] if harm.startswith(("audit: ", "audit --public-key: ")) else harm
            assert f"**{shown[:battery_tables.HARM_CHARACTERS]}" in before, (name, shown)
        assert "**" not in after, row


def test_the_battery_tables_keep_a_forgery_not_made_and_refuse_files_that_differ(tmp_path):
    """An attack the forger could not make on the other version's files is a cell and a row of its own; two files
    of other attacks or other limits are refused."""
    _keep_battery(tmp_path, 1, "python -m tests.hostile.run_dirs.battery --json FILE")
    after = battery_tables.read_battery(tmp_path / "run_dir_battery_after.json")
    failed = json.loads(json.dumps(after))
    failed["attacks"][0] = {**failed["attacks"][0], "forger_failed": "RuntimeError: the forger's step failed\nin DIR"}
    assert battery_tables.reader_cell(failed["attacks"][0]) == "not forged: RuntimeError: the forger's step failed in DIR"
    assert battery_tables.counts_table(failed, after).splitlines()[-1] == f"| {battery_tables.NOT_FORGED} | 1 | 0 |"
    with pytest.raises(ValueError, match="other limits: timeout_s 30.0 before, 60.0 after"):
        battery_tables.counts_table({**after, "timeout_s": 30.0}, after)
    with pytest.raises(ValueError, match="other attacks: before only \\[\\], after only \\['unchanged'\\]"):
        battery_tables.attacks_table({**after, "attacks": after["attacks"][1:]}, after)
    (tmp_path / "old.json").write_text(json.dumps({"counts": {}, "attacks": []}))
    with pytest.raises(ValueError, match="lacks made_by, timeout_s, memory_cap_mb"):
        battery_tables.read_battery(tmp_path / "old.json")


# --- The kernel-set tables: rendered from results files of their real format (no run, no audit) -----------------


def _audit(study: str, run: str, kernel_set: str, **measured) -> dict:
    """A results row of one intact audit of a run made with AVX-512 kernels: nothing measured but ``measured``."""
    from bench.portability.plan import KERNEL_SETS

    row = dict.fromkeys(kernel_tables.COLUMNS, 0) | dict.fromkeys(("largest_reply_drift", "largest_number_difference"), 0.0)
    environment = " ".join(f"{k}={v}" for k, v in KERNEL_SETS[kernel_set].items())
    return row | {"study": study, "run": run, "kernel_set": kernel_set, "environment": environment,
                  "run_cpu_capability": "AVX512", "verdict": "intact", "audit_seconds": 12.5} | measured


#: The first table as the docs held it when its script came: the renderer's format.
KERNELS_TABLE = ("| kernel set of the audit (runs made with AVX-512 kernels) | replies bit for bit · to 1e-5 · only within "
                 "rounding (of 180) | largest drift of a reply, of its update | audits intact before | after |\n") + """\
|---|---|---|---|---|
| `ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2` | 0 · 168 · 12 | 2.9e-3 | 2 of 10 | 10 of 10 |
| `ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2` | 0 · 174 · 6 | 2.9e-3 | 5 of 10 | 10 of 10 |
| `MKL_CBWR=COMPATIBLE` | 0 · 171 · 9 | 2.9e-3 | 4 of 10 | 10 of 10 |
| `OMP_NUM_THREADS=1` | 180 · 0 · 0 | 0 | 10 of 10 | 10 of 10 |
| the run's own kernels | 180 · 0 · 0 | 0 | 10 of 10 | 10 of 10 |"""


def _kernel_study_rows() -> list[dict]:
    """Ten seeds' audits (18 replies each) under the five kernel sets, with the counts of :data:`KERNELS_TABLE`:
    each set's replies within rounding spread over the seeds that then were not intact before."""
    within = {"portable": [2, 2, 2, 2, 1, 1, 1, 1], "avx2": [2, 1, 1, 1, 1], "mkl-compatible": [2, 2, 2, 1, 1, 1],
              "one-thread": [], "own": []}
    rows = []
    for seed in range(10):
        for kernel_set, counts in within.items():
            w = counts[seed] if seed < len(counts) else 0
            matched = ({"replies_bit_for_bit": 18} if not counts else
                       {"replies_to_tolerance": 18 - w, "replies_within_rounding": w, "largest_close_reply_drift": 3e-7,
                        "largest_reply_drift": 2.9e-3 if seed == 0 else 1e-4 * w,
                        "largest_reply_envelope_ratio": 0.5 * w})
            rows.append(_audit("kernels", f"seed-{seed}", kernel_set, **matched))
    return rows


def test_the_kernel_table_renders_from_its_results_file(tmp_path):
    results = tmp_path / "audit_kernels.csv"
    kernel_tables.write_results(results, _kernel_study_rows(), "python -m bench.portability kernels --out DIR")
    assert results.read_text().startswith("# python -m bench.portability kernels --out DIR (commit ")
    rows = kernel_tables.read_results(results)
    assert kernel_tables.render(rows) == KERNELS_TABLE
    # An audit NOT intact after counts in neither column; a number within rounding makes a run NOT intact before.
    rows[0] |= {"verdict": "NOT intact", "findings": 1}
    rows[-1] |= {"numbers_within_rounding": 2}
    lines = kernel_tables.render(rows).splitlines()
    assert lines[2].endswith("| 2 of 10 | 9 of 10 |") and lines[-1].endswith("| 9 of 10 | 10 of 10 |"), lines


LOSS_HEADER = ("| run (3 rounds, `--utility neg_loss`) | kernel set of the audit | before | after | numbers only within "
               "rounding · largest difference · over E_x |")


def test_the_loss_table_renders_from_its_results_file(tmp_path):
    """Per run (named once) and kernel set: before counts what the exact comparison failed (today's findings, the
    numbers within rounding and a value-weighted start only the booked factors give); equal cells share a row."""
    numbers = {"numbers_within_rounding": 56, "largest_number_difference": 2.4e-7, "largest_number_envelope_ratio": 1.578}
    rows = [_audit("losses", "benchmark-topk-ads", "mkl-compatible", **numbers),
            _audit("losses", "benchmark-topk-ads", "aten-default", **numbers | {"numbers_within_rounding": 43}),
            _audit("losses", "benchmark-topk-ads", "portable", **numbers | {"numbers_within_rounding": 1}),
            _audit("losses", "benchmark-value-guard", "mkl-compatible"),
            _audit("losses", "benchmark-value-guard", "aten-default"),
            _audit("losses", "benchmark-value-guard", "portable"),
            _audit("losses", "plain-value-weighted", "mkl-compatible", **numbers | {"numbers_within_rounding": 34,
                                                                                   "starts_by_booked_factors": 1}),
            _audit("losses", "noisy-clients-neg-loss", "mkl-compatible"),
            _audit("losses", "noisy-clients-neg-loss", "aten-default", verdict="NOT intact", findings=2, **numbers),
            _audit("losses", "noisy-clients-neg-loss", "portable", verdict="NOT verifiable", unverifiable=1)]
    results = tmp_path / "audit_kernels_loss.csv"
    kernel_tables.write_results(results, rows, "python -m bench.portability losses --out DIR")
    assert kernel_tables.render(kernel_tables.read_results(results)) == LOSS_HEADER + """
|---|---|---|---|---|
| the command above, `topk-ads` (10 of 100 clients a round, MC-ADS in 100 evaluations, 1,000 validation rows) | `MKL_CBWR=COMPATIBLE` | NOT intact (56 findings) | intact | 56 · 2.4e-7 · 1.58 |
| | `ATEN_CPU_CAPABILITY=default` | NOT intact (43 findings) | intact | 43 · 2.4e-7 · 1.58 |
| | `ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2` | NOT intact (1 finding) | intact | 1 · 2.4e-7 · 1.58 |
| the same, `value-guard` (second-order expansion: float64 derivatives, float32 anchors) | each of the three | intact | intact | 0 |
| the same, `value-weighted` | `MKL_CBWR=COMPATIBLE` | NOT intact (35 findings) | intact | 34 · 2.4e-7 · 1.58 |
| `fedvalue run noisy-clients --utility neg_loss` and conftest's `TINY` options | `MKL_CBWR=COMPATIBLE` | intact | intact | 0 |
| | `ATEN_CPU_CAPABILITY=default` | NOT intact (58 findings) | NOT intact (2 findings) | 56 · 2.4e-7 · 1.58 |
| | `ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2` | NOT verifiable | NOT verifiable | 0 |"""


def test_an_audit_s_report_becomes_its_results_row():
    """The row is read from what ``fedvalue audit --json`` writes (AuditReport.as_dict, its tallies' counts)."""
    from bench.portability.measure import result_row
    from fedvalue.audit.report import AuditReport
    from fedvalue.audit.rounding_envelope import EnvelopeTally
    from fedvalue.audit.training_replay import ReplayTally

    replays = ReplayTally(identical=1, close=15, within_rounding=2, largest_drift=1.4e-3, largest_envelope_ratio=0.9,
                          largest_close_drift=2e-7)
    envelopes = EnvelopeTally(numbers=3, rounds=[2], largest_difference=1.2e-7, largest_ratio=1.3)
    report = AuditReport("runs/x", rounds=3, problems=["recompute: round 2 ..."], unverifiable=[],
                         measured={**replays.measured(), **envelopes.measured()})
    record = {"report": json.loads(json.dumps(report.as_dict())), "exit_code": 1, "seconds": 41.2}
    row = result_row("kernels", "seed-0", "portable", record, "AVX512")
    assert list(row) == list(kernel_tables.COLUMNS)
    assert row | {"largest_reply_drift": 0} == _audit(
        "kernels", "seed-0", "portable", verdict="NOT intact", findings=1, replies_bit_for_bit=1,
        replies_to_tolerance=15, replies_within_rounding=2, largest_reply_drift=0, largest_close_reply_drift=2e-7,
        largest_reply_envelope_ratio=0.9, numbers_within_rounding=3, largest_number_difference=1.2e-7,
        largest_number_envelope_ratio=1.3, audit_seconds=41.2)
    assert row["largest_reply_drift"] == 1.4e-3
    # An audit that stopped before the recompute measured nothing: zeros, its verdict says the rest.
    stopped = result_row("kernels", "seed-0", "own", {"report": AuditReport("runs/x").as_dict(), "seconds": 1.0}, "?")
    assert stopped["replies_bit_for_bit"] == stopped["numbers_within_rounding"] == 0


def test_a_study_makes_each_run_and_audit_once_and_resumes(tmp_path, monkeypatch):
    """Runs and audits are child processes (faked here): a complete run and a kept audit are not made again, an
    unfinished run is made again with --overwrite (a noisy-federation benchmark continues by itself)."""
    from bench.portability import measure
    from bench.portability.plan import Run, Study
    from fedvalue.audit.report import AuditReport

    calls = []

    def child(argv, log, kernel_set):
        calls.append((argv[0], kernel_set, tuple(argv[-2:])))
        if argv[0] == "run":
            folder = Path(argv[argv.index("--out") + 1])
            for relative in ("", "mlp/seed-0/p1/topk-ads/run"):
                (folder / relative).mkdir(parents=True, exist_ok=True)
                (folder / relative / "manifest.json").write_text("{}")
                (folder / relative / "run.json").write_text(json.dumps({"platform": {"cpu_capability": "AVX512"}}))
        else:
            report = AuditReport(argv[1], rounds=3, measured={"replies_bit_for_bit": 18 if kernel_set == "own" else 0})
            Path(argv[argv.index("--json") + 1]).write_text(json.dumps(report.as_dict()))
        return 0, 2.0

    monkeypatch.setattr(measure, "_child", child)
    study = Study("kernels", (Run("seed-0", ("run", "noisy-clients"), {"seed-0": ""}),
                              Run("nf", ("run", "noisy-federation"), {"nf-topk-ads": "mlp/seed-0/p1/topk-ads/run"},
                                  continues=True)), ("portable", "own"))
    results = tmp_path / "kept" / "audit_kernels.csv"
    rows = measure.measure(study, tmp_path / "out", results, "python -m bench.portability kernels --out out")
    assert [(row["run"], row["kernel_set"], row["replies_bit_for_bit"]) for row in rows] == [
        ("seed-0", "portable", 0), ("seed-0", "own", 18), ("nf-topk-ads", "portable", 0), ("nf-topk-ads", "own", 18)]
    assert [call[:2] for call in calls] == [("run", "own")] * 2 + [("audit", k) for k in ("portable", "own")] * 2
    assert kernel_tables.read_results(results) == rows
    calls.clear()
    (tmp_path / "out" / "runs" / "seed-0" / "manifest.json").unlink()  # the run was cut short
    (tmp_path / "out" / "runs" / "nf" / "mlp" / "seed-0" / "p1" / "topk-ads" / "run" / "manifest.json").unlink()
    (tmp_path / "out" / "audits" / "seed-0" / "seed-0" / "own.json").unlink()
    kept = tmp_path / "out" / "audits" / "nf" / "nf-topk-ads" / "portable.json"
    kept.write_text(kept.read_text().replace("default", "avx2"))  # kept for another environment
    assert measure.measure(study, tmp_path / "out", results, "python -m bench.portability kernels") == rows
    assert [(kind, last) for kind, _, last in calls] == [
        ("run", (str(tmp_path / "out" / "runs" / "seed-0"), "--overwrite")),
        ("run", ("--out", str(tmp_path / "out" / "runs" / "nf"))),
        ("audit", ("--json", str(tmp_path / "out" / "audits" / "seed-0" / "seed-0" / "own.report.json"))),
        ("audit", ("--json", str(kept.with_suffix(".report.json"))))]
    other = Study("kernels", (Run("seed-0", ("run", "noisy-clients", "--seed", "1"), {"seed-0": ""}),), ("own",))
    with pytest.raises(RuntimeError, match="seed-0 was made by another command"):
        measure.measure(other, tmp_path / "out", results, "python -m bench.portability kernels")


def test_the_kernel_study_refuses_what_it_cannot_use(tmp_path, capsys):
    """Each error names the option: an --out that holds other things, a --keep that is no .csv, a RESULTS that is
    no results file of the study (missing columns, two studies, not a regular file)."""
    from bench.portability.__main__ import main

    (tmp_path / "other.txt").write_text("")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("# a header\nstudy,run\nkernels,seed-0\n")
    mixed = tmp_path / "mixed.csv"
    kernel_tables.write_results(mixed, [_audit("kernels", "seed-0", "own"), _audit("losses", "x", "own")], "python")
    os.mkfifo(tmp_path / "fifo.csv")
    for argv, said in ((["kernels", "--out", str(tmp_path)], "--out: expected a new directory or one this command "
                                                                "made (runs/, audits/)"),
                       (["kernels", "--out", str(tmp_path / "other.txt")], "--out: expected a directory"),
                       (["losses", "--out", str(tmp_path / "new"), "--keep", "x.txt"], "--keep: expected a .csv file"),
                       (["table", str(wrong)], "RESULTS: " + str(wrong) + ": expected a results file of python -m "
                                                                         "bench.portability; it lacks the columns"),
                       (["table", str(mixed)], "expected the rows of one study; it holds 2"),
                       (["table", str(tmp_path / "fifo.csv")], "(a regular file)")):
        with pytest.raises(SystemExit):
            main(argv)
        assert said in capsys.readouterr().err, argv
    assert not (tmp_path / "new").exists()
