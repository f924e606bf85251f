"""docs/faults-and-audit.md's registries: which results files each measured table is rendered from, or the run that
would make them.

The attack study's tables are ``python -m bench.attack_study --markdown docs/results`` verbatim (its results files
attack_*.csv); the two kernel-set tables of "An audit on another machine" ``python -m bench.portability table FILE``
of theirs (:data:`KERNEL_RESULTS`); the tables of :data:`KEPT` are rendered from their results files of the version
before and this one; the audit-attacks table (:data:`REWRITE_HEADER`) says what tests/fedvalue/audit/
test_audit_attacks.py asserts; every other measured table is in :data:`PENDING` with the command that would make
its results. tests/test_faults_audit_tables.py holds the doc to these; ``python -m bench.docs_tables`` renders the
tables of :func:`rendered` into it.
"""

from __future__ import annotations

from pathlib import Path

from bench import reader_memory
from bench.docs_tables import run_dir_battery
from bench.docs_tables.renderings import RESULTS


def _battery(table):
    """A battery table's renderer of the two kept files' paths."""
    return lambda before, after: table(run_dir_battery.read_battery(before), run_dir_battery.read_battery(after))


#: Tables rendered from two results files, the version before's and this one's: header -> (before, after, renderer
#: of their paths, returning the table's text).
KEPT = {
    reader_memory.DOCS_HEADER: ("reader_memory_before.txt", "reader_memory_after.txt",
                                lambda before, after: reader_memory.docs_table(before.read_text(), after.read_text())),
    "| count (of 40) | before | after |": ("run_dir_battery_before.json", "run_dir_battery_after.json",
                                          _battery(run_dir_battery.counts_table)),
    run_dir_battery.ATTACKS_HEADER: ("run_dir_battery_before.json", "run_dir_battery_after.json",
                                     _battery(run_dir_battery.attacks_table)),
}

#: Measured tables whose results files are not kept yet, by header line: the command(s) that would make them.
PENDING: dict[str, str] = {}

#: The kernel-set tables' results files (python -m bench.portability kernels, losses), in docs/results.
KERNEL_RESULTS = ("audit_kernels.csv", "audit_kernels_loss.csv")

#: The audit-attacks table, whose verdicts are those tests/fedvalue/audit/test_audit_attacks.py asserts on a real run.
REWRITE_HEADER = "| rewrite | before | after, no key | after, `--public-key` |"


def kept_tables(folder: Path = RESULTS) -> list[str]:
    """The tables of :data:`KEPT` whose two results files are both in ``folder``, rendered from them."""
    return [render(folder / before, folder / after) for before, after, render in KEPT.values()
            if (folder / before).is_file() and (folder / after).is_file()]


def kept_kernel_tables(folder: Path = RESULTS) -> list[str]:
    """The kernel-set tables rendered from their results files, of those kept in ``folder``."""
    from bench.portability import tables

    return [tables.render(tables.read_results(folder / name)) for name in KERNEL_RESULTS if (folder / name).is_file()]


def attack_tables(folder: Path = RESULTS) -> list[str]:
    """The attack study's tables rendered from its results files in ``folder`` (those it holds)."""
    from bench.attack_study import docs_tables, read_results

    return docs_tables(read_results(folder))


def rendered(folder: Path = RESULTS) -> list[str]:
    """Every table of the doc rendered from the results files in ``folder``, each as its text: the attack study's,
    the before/after tables and the kernel-set tables."""
    return attack_tables(folder) + kept_tables(folder) + kept_kernel_tables(folder)
