"""Every block of printed results in docs/reproductions.md is held to the results file its run kept, or names the
run that would keep one (the rule and helpers of tests/test_benchmark_blocks.py; its tables are
tests/test_reproductions_tables.py's).

A block is kept by ``python -m bench.NAME --keep docs/results/FILE`` (:func:`bench.kept_output`), or by
``fedvalue run SIMULATION --results FOLDER`` for a simulation whose results files include the text it prints (a
``.txt`` of :attr:`~simulations.runner.simulation.Simulation.results`). :data:`PENDING` gives each block not kept
yet the exact command that would keep it and its cost by the docs' own timings; once its file is made the entry
moves to :data:`HELD`, which maps the block's key to the file under docs/results/ (both lists are
:mod:`bench.docs_tables.reproductions`'s).
"""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.docs_tables.blocks import blocks, held_problems
from bench.docs_tables.reproductions import BLOCKS_HELD as HELD
from bench.docs_tables.reproductions import BLOCKS_PENDING as PENDING
from bench.docs_tables.reproductions import ORDERINGS
from tests.test_benchmark_blocks import listing_problems

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOC = ROOT / "docs" / "reproductions.md"


def result_blocks() -> list[list[str]]:
    """Every block of results of docs/reproductions.md."""
    return blocks(DOC.read_text().splitlines())


def written_files(command: str) -> tuple[list[str], str]:
    """The files under docs/results/ that ``command`` writes, and the one that keeps what it prints; checks that
    the command takes the option that keeps it (``--help`` of a bench script; the CLI's own parser)."""
    words = shlex.split(command)
    if words[:2] == ["python", "-m"]:
        keep = str(Path(words[words.index("--keep") + 1]).relative_to("docs/results"))
        with pytest.raises(SystemExit):
            importlib.import_module(words[2]).main(["--help"])
        return [keep], keep
    from simulations.cli.main import build_parser
    from simulations.cli.registry import SIMULATIONS

    args = build_parser().parse_args(words[1:])
    folder = Path(args.results).relative_to("docs/results")
    files = [str(folder / name) for name in SIMULATIONS[args.simulation].results]
    [printed] = [name for name in files if name.endswith(".txt")]
    return files, printed


def test_every_block_of_results_is_held_or_names_the_run_that_would_keep_it():
    assert not listing_problems(result_blocks(), PENDING, HELD)


def test_the_held_blocks_are_excerpts_of_their_results_files():
    assert not held_problems(result_blocks(), HELD, RESULTS)


def test_each_pending_run_keeps_what_it_prints_in_a_file_of_its_own(capsys):
    kept = []
    for key, run in PENDING.items():
        assert run.cost, key
        files, printed = written_files(run.command)
        if run.command.startswith("python -m "):
            assert "--keep FILE" in capsys.readouterr().out, run.command
        made = [name for name in files if (RESULTS / name).exists()]
        assert not made, f"{made} made (or would be overwritten): hold the block by {printed} in HELD"
        kept.append(printed)
    assert len(set(kept)) == len(kept)


def test_bench_knn_keeps_its_table_as_printed(tmp_path, monkeypatch, capsys):
    """--keep FILE wires the table into a results file; the measurements are stand-ins (no child process)."""
    from bench import knn

    run = {"seconds": 2.0, "cpu_seconds": 1.5, "peak_mib": 250.0, "over_data_mib": 80.0}
    monkeypatch.setattr(knn, "measure", lambda spec: (run, np.zeros(3)))
    monkeypatch.setattr(knn, "runs_values_reference", lambda scratch: np.zeros(3))
    argv = ["--keep", str(tmp_path / "knn.txt")]
    assert knn.main(argv) == 0
    kept = (tmp_path / "knn.txt").read_text().splitlines()
    assert kept[0].startswith(f"# python -m bench.knn {' '.join(argv)} (commit ")
    assert kept[1:] == capsys.readouterr().out.splitlines() and len(kept) == 1 + 3 + 6
    assert kept[1:4] == _block("problem: ")[:3]  # the docs' problem and header, as the default run prints them


def _block(key: str) -> list[str]:
    """The docs' block that opens with ``key``'s lines (the start of a line for the last)."""
    lines = key.split("\n")
    [block] = [block for block in result_blocks() if block[:len(lines) - 1] == lines[:-1]
               and block[len(lines) - 1].startswith(lines[-1])]
    return block


def test_the_simulations_print_their_blocks_in_the_docs_layout(tmp_path):
    """The docs' figures through the runs' own formatters give the docs' blocks, and kept as --results keeps them
    they hold those blocks: when the real runs are kept, only digits can move."""
    from simulations.experiments.synthetic_data.augmentation import PAIRS, PRINTED_RESULTS, format_orderings
    from simulations.experiments.synthetic_data.replication_market import PRINTED_RESULTS as MARKET_RESULTS
    from simulations.experiments.synthetic_data.replication_market import format_totals
    from simulations.runner import write_results

    market = next(key for key in [*PENDING, *HELD] if key.startswith("scenario "))
    totals = []
    for line in _block(market)[1:]:
        figures = [float(word) for word in line[40:].split()]
        for (method, party), total in zip([(m, p) for m in ("DS", "ADS") for p in ("contributors", "broker")], figures):
            totals.append({"scenario": line[:13].strip(), "configuration": line[14:40].strip(), "method": method,
                           "party": party, "total": total})
    printed = {MARKET_RESULTS: format_totals(pd.DataFrame(totals))}
    assert printed[MARKET_RESULTS].splitlines() == _block(market)
    held = {market: MARKET_RESULTS}
    for key in [key for key in [*PENDING, *HELD] if key.startswith(ORDERINGS)]:
        block = _block(key)
        methods = block[1].split("ADS beats")[0].split()[1:]
        rows = []
        for line in block[2:]:
            words = line.split()
            verdicts = " ".join(words[1 + len(methods):]).split(" / ")
            pairs = [(ads, ds) for ads, ds in PAIRS if ads in methods]
            rows.append({"panel": words[0], **dict(zip(methods, map(float, words[1:1 + len(methods)]))),
                         **{f"{ads}_beats_{ds}_and_loo": verdict == "yes" for (ads, ds), verdict in zip(pairs, verdicts)}})
        name = PRINTED_RESULTS.replace(".txt", f"_{len(held)}.txt")  # one file a run
        printed[name] = format_orderings(pd.DataFrame(rows))
        assert printed[name].splitlines() == block
        held[key] = name
    write_results(tmp_path, printed, "fedvalue run augmentation --results FOLDER")
    assert not held_problems(result_blocks(), held, tmp_path)
    (tmp_path / MARKET_RESULTS).write_text((tmp_path / MARKET_RESULTS).read_text().replace("0.9476", "0.9477", 1))
    assert held_problems(result_blocks(), held, tmp_path) == [f"{MARKET_RESULTS}: lines not as the run printed them"]
