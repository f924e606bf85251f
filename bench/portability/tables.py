"""A study's results file (one row per audit of a run under a kernel set), read back and rendered as the docs'
table: ``kernels`` the first kernel-set table of docs/faults-and-audit.md, ``losses`` the second.

"Before" is the exact comparison of the versions before the float-rounding allowances, the first step of
today's checks: a reply compared element-wise to 1e-5, a number to 1e-9, A_t aggregated by the recomputed
factors. So an audit found, before, what it finds now and every reply or number it accepted only within
float rounding (and each value-weighted round whose next start only its booked factors give). The kernel
table's "before" is the version before both allowances (replies and numbers); the loss table's the version
before the loss's (numbers only: the replies' allowance came first).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from bench import results_header
from bench.portability.plan import KERNEL_SETS, LOSS_KERNEL_SETS, RUN_LABELS, kernel_label

#: What ``fedvalue audit --json`` measured (its ``measured``), as the results file's columns.
MEASURED = ("replies_bit_for_bit", "replies_to_tolerance", "replies_within_rounding", "largest_reply_drift",
            "largest_close_reply_drift", "largest_reply_envelope_ratio", "numbers_within_rounding",
            "largest_number_difference", "largest_number_envelope_ratio", "starts_by_booked_factors")
#: The results file's columns: which study, run and kernel set, the verdict and counts of its lines, what the
#: audit measured and its wall seconds.
COLUMNS = ("study", "run", "kernel_set", "environment", "run_cpu_capability", "verdict", "findings", "unverifiable",
           *MEASURED, "audit_seconds")
#: Columns read back as whole numbers; the other measured ones and the seconds as floats.
COUNTS = {"findings", "unverifiable", "replies_bit_for_bit", "replies_to_tolerance", "replies_within_rounding",
          "numbers_within_rounding", "starts_by_booked_factors"}
VERDICTS = ("intact", "NOT intact", "NOT verifiable")
#: torch's name of an instruction set, as the docs write it.
CAPABILITY_WORDS = {"AVX512": "AVX-512", "AVX2": "AVX2", "DEFAULT": "portable"}


def write_results(path: Path, rows: list[dict], command: str) -> None:
    """``rows`` as the results file ``path`` (:data:`COLUMNS`), headed by ``command`` and the commit."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({column: row[column] for column in COLUMNS} for row in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(results_header(command) + text.getvalue())


def read_results(path: Path) -> list[dict]:
    """The rows of a results file, typed; a ``ValueError`` naming the file when it is not one of this study."""
    if not path.is_file():  # a FIFO would block the read
        raise ValueError(f"{path}: expected a results file of python -m bench.portability (a regular file)")
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    reader = csv.DictReader(lines)
    missing = [column for column in COLUMNS if column not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"{path}: expected a results file of python -m bench.portability; it lacks the columns "
                         f"{', '.join(missing)}")
    rows = []
    for number, row in enumerate(reader, 2):
        try:
            typed = {**row, **{c: int(row[c]) for c in COUNTS},
                     **{c: float(row[c]) for c in (*MEASURED, "audit_seconds") if c not in COUNTS}}
        except (TypeError, ValueError):
            raise ValueError(f"{path}, row {number}: expected numbers in its measured columns") from None
        if typed["study"] not in ("kernels", "losses") or typed["kernel_set"] not in KERNEL_SETS or (
                typed["verdict"] not in VERDICTS):
            raise ValueError(f"{path}, row {number}: unknown study, kernel set or verdict "
                             f"({typed['study']!r}, {typed['kernel_set']!r}, {typed['verdict']!r})")
        rows.append(typed)
    if len({row["study"] for row in rows}) != 1:
        raise ValueError(f"{path}: expected the rows of one study; it holds {len({r['study'] for r in rows})}")
    return rows


def short(x: float) -> str:
    """A measured number as the docs write it: 0, or two digits and a short exponent (2.9e-3)."""
    if x == 0:
        return "0"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _grouped(rows: list[dict], key: str) -> dict[str, list[dict]]:
    """``rows`` by ``key``, in the order each value first appears."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return groups


def nothing_needed_rounding(row: dict, replies: bool) -> bool:
    """Whether the audit accepted nothing only within float rounding: no number, no start by booked factors,
    and (``replies``) no reply; then the exact comparison found what the audit found."""
    return (row["numbers_within_rounding"] == row["starts_by_booked_factors"] == 0
            and not (replies and row["replies_within_rounding"]))


def kernels_table(rows: list[dict]) -> str:
    """The first table: per kernel set, the replies by how they matched, the largest drift of a reply (of its
    update), and how many runs audited intact before (nothing accepted only within rounding) and after."""
    sets = _grouped(rows, "kernel_set")
    capabilities = sorted({CAPABILITY_WORDS.get(row["run_cpu_capability"], row["run_cpu_capability"]) for row in rows})
    replies = max(sum(r["replies_bit_for_bit"] + r["replies_to_tolerance"] + r["replies_within_rounding"]
                      for r in group) for group in sets.values())
    lines = [f"| kernel set of the audit (runs made with {' and '.join(capabilities)} kernels) | replies bit for bit · "
             f"to 1e-5 · only within rounding (of {replies}) | largest drift of a reply, of its update | audits "
             "intact before | after |", "|---|---|---|---|---|"]
    for name, group in sets.items():
        counts = " · ".join(str(sum(r[c] for r in group))
                            for c in ("replies_bit_for_bit", "replies_to_tolerance", "replies_within_rounding"))
        drift = max(max(r["largest_reply_drift"], r["largest_close_reply_drift"]) for r in group)
        intact = [r for r in group if r["verdict"] == "intact"]
        before = sum(nothing_needed_rounding(r, replies=True) for r in intact)
        lines.append(f"| {kernel_label(name)} | {counts} | {short(drift)} | {before} of {len(group)} | "
                     f"{len(intact)} of {len(group)} |")
    return "\n".join(lines)


def _verdict(verdict: str, findings: int) -> str:
    return f"NOT intact ({counted(findings, 'finding')})" if findings else verdict


def loss_cells(row: dict) -> tuple[str, str, str]:
    """A loss audit's "before", "after" and "numbers only within rounding · largest difference · over E_x"."""
    before = row["findings"] + row["numbers_within_rounding"] + row["starts_by_booked_factors"]
    numbers = row["numbers_within_rounding"]
    within = (f"{numbers} · {short(row['largest_number_difference'])} · {row['largest_number_envelope_ratio']:.2f}"
              if numbers else "0")
    return _verdict(row["verdict"], before), _verdict(row["verdict"], row["findings"]), within


def _sets_label(names: list[str]) -> str:
    """Kernel sets of one row: the docs' words for the two portable sets or all three, else each named."""
    if len(names) == len(LOSS_KERNEL_SETS) and set(names) == set(LOSS_KERNEL_SETS):
        return "each of the three"
    if set(names) == {"aten-default", "portable"}:
        return "the two portable sets"
    return " and ".join(kernel_label(name) for name in names)


def losses_table(rows: list[dict]) -> str:
    """The second table: per run (its label once) and kernel set, the verdict before (the exact comparison)
    and after, and the numbers accepted only within rounding; kernel sets of a run whose cells are equal and
    adjacent share a row."""
    lines = ["| run (3 rounds, `--utility neg_loss`) | kernel set of the audit | before | after | numbers only within "
             "rounding · largest difference · over E_x |", "|---|---|---|---|---|"]
    for run, group in _grouped(rows, "run").items():
        merged: list[tuple[list[str], tuple[str, str, str]]] = []
        for row in group:
            cells = loss_cells(row)
            if merged and merged[-1][1] == cells:
                merged[-1][0].append(row["kernel_set"])
            else:
                merged.append(([row["kernel_set"]], cells))
        for index, (names, cells) in enumerate(merged):
            label = RUN_LABELS.get(run, f"`{run}`") + " " if index == 0 else ""  # the run named once
            lines.append(f"| {label}| {_sets_label(names)} | {' | '.join(cells)} |")
    return "\n".join(lines)


def render(rows: list[dict]) -> str:
    """The docs' table of a results file's rows (its study's)."""
    return kernels_table(rows) if rows and rows[0]["study"] == "kernels" else losses_table(rows)
