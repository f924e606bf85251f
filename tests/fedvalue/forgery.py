"""What a forger without the signing key does after rewriting a run directory: recompute
every hash and digest the run committed to (the chain, the seals, the manifest)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Collection
from pathlib import Path

from fedvalue.audit.round import recompute_books
from fedvalue.run.archive import RoundRecord, save_npz, write_round_record
from fedvalue.run.ledger_reader import read_ledger_csv
from fedvalue.run.ledger_tables import chain_hash, csv_lines, genesis_hash
from fedvalue.schema import LEDGER_COLUMNS, ROUND_COLUMNS, with_ground_truth
from fedvalue.valuation.round_game import ArraysUtility
from fedvalue.run.seals import MANIFEST_FILE, SEALS_FILE, manifest_files


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rebook_last_round(run_dir: Path, record: RoundRecord, utility: ArraysUtility, noisy_clients: Collection) -> None:
    """Write ``record`` (the run's last round, changed) and book that round again with the
    project's own recompute, as a forger would: its ledger rows (the noisy clients joined as
    the writer joins them), rounds.csv's last row (its timing kept) and the checkpoint's A_t.
    Hashes, seals and the Parquet copy are left to the caller."""
    write_round_record(run_dir, record)
    noisy = {c for c in record.statuses if c in set(noisy_clients)}
    books, realized, _, _ = recompute_books(record, utility)
    lines = (run_dir / "ledger.csv").read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(f"{record.round},")]
    (run_dir / "ledger.csv").write_text("".join(kept + csv_lines(LEDGER_COLUMNS, with_ground_truth(books.ledger_rows,
                                                                                                  noisy))))
    with open(run_dir / "rounds.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[-1] = {**books.round_row.as_dict(), "valuation_seconds": rows[-1]["valuation_seconds"]}
    (run_dir / "rounds.csv").write_text(",".join(ROUND_COLUMNS) + "\n" + "".join(csv_lines(ROUND_COLUMNS, rows)))
    save_npz(next(p for p in sorted((run_dir / "checkpoint").iterdir())
                  if p.name.endswith(".npz") and not p.name.endswith("-state.npz")), realized)


def forge_ledger_rows(run_dir: Path, rows: list[dict]) -> None:
    """Write ``rows`` (csv.DictReader's of ledger.csv) as the ledger and its Parquet copy, then :func:`rechain`: a
    forger without a key whose chain, seals and manifest match the edit."""
    (run_dir / "ledger.csv").write_text(",".join(LEDGER_COLUMNS) + "\n" + "".join(csv_lines(LEDGER_COLUMNS, rows)))
    read_ledger_csv(io.StringIO((run_dir / "ledger.csv").read_text(), newline="")).to_parquet(
        run_dir / "ledger.parquet", index=False)
    rechain(run_dir)


def rechain(run_dir: Path) -> None:
    """Recompute rounds.csv's hashes, then reseal (:func:`reseal`)."""
    ledger_lines = (run_dir / "ledger.csv").read_text().splitlines(keepends=True)[1:]
    with open(run_dir / "rounds.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    previous = genesis_hash(run_dir)
    for row in rows:
        body = csv_lines(ROUND_COLUMNS[:-1], [row])[0]
        mine = [line for line in ledger_lines if line.split(",", 1)[0] == row["round"]]
        row["hash"] = previous = chain_hash(previous, mine, body)
    (run_dir / "rounds.csv").write_text(",".join(ROUND_COLUMNS) + "\n" + "".join(csv_lines(ROUND_COLUMNS, rows)))
    reseal(run_dir)


def reseal(run_dir: Path) -> None:
    """Rewrite seals and manifest to match the files as they now are (signatures dropped:
    the forger has no key). Seals of rounds no longer in rounds.csv are dropped."""
    with open(run_dir / "rounds.csv", newline="") as handle:
        heads = [row["hash"] for row in csv.DictReader(handle)]
    seals_path = run_dir / SEALS_FILE
    if seals_path.exists():
        seals = []
        for line in seals_path.read_text().splitlines():
            seal = json.loads(line)
            if seal["round"] > len(heads):
                continue
            seal = {k: v for k, v in seal.items() if k not in ("signature", "key", "algorithm")}
            seal["head"] = heads[seal["round"] - 1]
            record = run_dir / "records" / f"round-{seal['round']:06d}.npz"
            seal["record"] = _digest(record) if record.is_file() else None
            seals.append(seal)
        seals_path.write_text("".join(json.dumps(s, sort_keys=True) + "\n" for s in seals))
    manifest_path = run_dir / MANIFEST_FILE
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        manifest = {k: v for k, v in manifest.items() if k not in ("signature", "key", "algorithm")}
        manifest.update(rounds=len(heads), head=heads[-1] if heads else None,
                        files={name: _digest(run_dir / name) for name in manifest_files(run_dir)})
        manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
