"""Every block of printed results in docs/benchmarks.md and docs/faults-and-audit.md is held to the results file
its run kept, or names the run that would keep one.

A benchmark run with ``--keep FILE`` keeps what it printed in docs/results/FILE under the command and commit
(:func:`bench.kept_output`). :data:`HELD` maps a block, by its key (its first line, or first lines where blocks open
alike: :func:`entry_of`), to that file: every line of the block must be a line of the file, in the file's order (a
block may quote an excerpt, never a changed line); the output of a ``fedvalue run`` the docs show is kept the same
way, under :func:`bench.results_header` of its command. :data:`PENDING` lists each block not kept yet by its key
with the command that made it and what it costs, so a new block of results without an entry fails here, and an
entry whose block is gone does too. A block that is a command to type, or code (its fence names a language), is
not a result. The helpers serve tests/test_reproductions_blocks.py too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from bench import kept_output

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/benchmarks.md", "docs/faults-and-audit.md")
#: First words of a block that is a command to type, or the one line the CLI prints for bad input: not results.
COMMANDS = ("fedvalue ", "python ", "pip ", "fedvalue: error: ")
#: The blocks of printed results, by first line: the command that printed them, and their size.
PENDING = {
    "model    n  budget estimator               seconds   evals  max err  mean err  max stderr":
        "python -m bench.large_rounds --models cnn --sizes 20 50",
    "round   1: elapsed     64.8 s, valuation    1.8 s (950 evaluations, ads-kernelshap), server    3180 MB, tree"
    "    4503 MB": "python -m bench.scale --no-records (1,000 clients, 50 rounds)",
}


#: Blocks kept by their run, by first line: the file of docs/results/ that holds them.
HELD: dict[str, str] = {
    "(c) ours against (d) its matmuls alone, and (c) as of HEAD; "
    "2 alternating run(s) per n; torch threads: 1; load average before: 0.03 0.68 1.31": "valuation_same_code.txt",
    "  n  (a) naive s  (b) MC-200 s  (c) ours s  (a)/(c)  (b)/(c)      evals a/b/c     peak MB a/b/c  growth MB c"
    "  max|a-c|  MC err b  (d) floor s  (c)/(d)": "valuation.txt",
    "  n pair  (c) ours s  (d) floor s  (c)/(d)  peak MB c": "valuation_floor.txt",
    "  n   plain s   fast s  plain/fast  floor s  fast/floor  evals  peak MB plain/fast  max|plain-fast|":
        "valuation_cnn.txt",
    "  n  estimator                 max |φ − exact|  evaluations  permutations     |gap|  seconds": "estimators.txt",
    "game      n  estimator   samples  evaluations    max |φ − φ*|": "sampling.txt",
    "  n  decision estimator                   seed  evaluations  settled  agree (settled)  agree (all)  max |φ − exact|":
        "estimators_adaptive.txt",
    "identical rounds (exact ADS + LOO, 10 clients, 1,024 coalitions; digits MLP, 450 held-out), 5 per child; load "
    "average before: 4.83 4.31 2.73": "valuation_spread.txt",
    "model    n  budget estimator               seconds   evals  max err  mean err  max stderr    rho    AUC":
        "large_rounds_mlp.txt",
    "round 1 valuation: 543/3,709 coalitions (15%), 10.0 s, ETA 59 s": "progress_example.txt",
    "noisy-clients, 200 clients, 20 per round (MC-ADS + LOO per round); load average before: 2.4 3.5 3.7": "load.txt",
    "noisy-clients study, 4 seeds, 32 runs of 5 rounds": "study_4.txt",
    "1000 clients, 50 a round, 3 rounds; idle queries all at once against 32 at a time, 2 pairs; load average 3.2 4.3 5.7":
        "scale_query_batch.txt",
    "1000 clients, 50 a round, 50 rounds, flows True, projection 2048, records True, budget 1000, query batch 32; load "
    "average 4.0 7.2 7.8": "scale_projected_50.txt",
}


def blocks(lines: list[str]) -> list[list[str]]:
    """Every fenced block of ``lines`` that is not code (its fence names a language) or a command, as its lines."""
    opens = [i for i, line in enumerate(lines) if line.startswith("```")]
    found = [lines[start:end] for start, end in zip(opens[::2], opens[1::2])]
    return [block[1:] for block in found
            if block[0].rstrip() == "```" and block[1:] and not block[1].startswith(COMMANDS)]


def result_blocks() -> list[list[str]]:
    """Every block of results of :data:`DOCS`."""
    return [block for name in DOCS for block in blocks((ROOT / name).read_text().splitlines())]


def entry_of(block: list[str], keys: Iterable[str]) -> str | None:
    """The key ``block`` is listed under: the longest of ``keys`` whose lines (joined by newlines) it opens with."""
    return max((key for key in keys if block[:key.count("\n") + 1] == key.split("\n")), key=len, default=None)


def unkept_lines(block: list[str], kept: list[str]) -> list[str]:
    """The lines of ``block`` that are not lines of ``kept`` in ``kept``'s order (none: the block is an excerpt)."""
    rest = iter(kept)  # trailing blanks are not part of a line
    return [line for line in block if not any(line.rstrip() == other.rstrip() for other in rest)]


def listing_problems(found: list[list[str]], pending: Mapping[str, object], held: Mapping[str, str]) -> list[str]:
    """What the lists get wrong about the blocks ``found``: a block neither held nor pending, an entry whose block is
    gone, an entry in both lists, one run in PENDING for two blocks (none: every block is listed)."""
    entries = [entry_of(block, [*pending, *held]) for block in found]
    problems = [f"neither held nor in PENDING: {block[0]!r}" for block, key in zip(found, entries) if key is None]
    problems += [f"no such block in the docs: {key!r}" for key in [*pending, *held] if key not in entries]
    problems += [f"held: drop it from PENDING: {key!r}" for key in pending if key in held]
    problems += [f"one run for two blocks: key each by its first lines: {key!r}" for key in pending
                 if entries.count(key) > 1]
    return problems


def held_problems(found: list[list[str]], held: Mapping[str, str], results: Path = ROOT / "docs" / "results") -> list[str]:
    """The held blocks of ``found`` that are not excerpts of their results files under ``results`` (a file may hold
    several blocks)."""
    problems = []
    for block in found:
        key = entry_of(block, held)
        if key is not None:
            kept = (results / held[key]).read_text().splitlines()
            if not kept[0].startswith(("# python -m bench.", "# fedvalue run ")):
                problems.append(f"{held[key]}: not headed by the command that made it")
            elif unkept_lines(block, kept[1:]):
                problems.append(f"{held[key]}: lines not as the run printed them")
    return problems


def test_every_block_of_results_is_held_or_names_the_run_that_would_keep_it():
    assert not listing_problems(result_blocks(), PENDING, HELD)


def test_the_held_blocks_are_excerpts_of_their_results_files():
    assert not held_problems(result_blocks(), HELD)


def test_code_commands_and_blocks_that_open_alike_are_told_apart():
    lines = ["```python", "import fedvalue", "```", "```", "fedvalue run x --out DIR", "```",
             "```", "table", "a 1", "```", "```", "table", "b 2", "```", "```", "other", "```"]
    found = blocks(lines)
    assert found == [["table", "a 1"], ["table", "b 2"], ["other"]]
    assert [entry_of(block, ["table", "table\na 1", "other"]) for block in found] == ["table\na 1", "table", "other"]
    assert listing_problems(found, {"table\na 1": "run a", "gone": "run"}, {"other": "o.txt", "table\na 1": "a.txt"}) == [
        "neither held nor in PENDING: 'table'", "no such block in the docs: 'gone'",
        "held: drop it from PENDING: 'table\\na 1'"]
    assert listing_problems(found, {"table": "one run", "other": "run"}, {}) == [
        "one run for two blocks: key each by its first lines: 'table'"]
    assert not listing_problems(found, {"other": "run"}, {"table": "both.txt"})  # one file may hold both


def test_a_changed_line_or_order_in_a_block_is_caught(tmp_path, capsys):
    """A block kept by --keep is an excerpt of its file; one digit changed, or two lines swapped, is not."""
    path = tmp_path / "kept.txt"
    with kept_output(path, "python -m bench.example --keep kept.txt"):
        for index in range(1, 6):
            print(f"round {index:>3}: elapsed {index * 45.7:8.1f} s")
    kept = path.read_text().splitlines()
    assert kept[0].startswith("# python -m bench.example --keep kept.txt (commit ")
    assert capsys.readouterr().out.splitlines() == kept[1:]
    excerpt = [kept[1], kept[3], kept[5]]
    assert not unkept_lines(excerpt, kept[1:])
    assert unkept_lines([kept[1], kept[3].replace("137.1", "137.2"), kept[5]], kept[1:])
    assert unkept_lines([kept[3], kept[1]], kept[1:])


def test_nothing_is_kept_from_a_run_that_fails(tmp_path):
    path = tmp_path / "kept.txt"
    try:
        with kept_output(path, "python -m bench.example"):
            print("half a block")
            raise RuntimeError("the run failed")
    except RuntimeError:
        pass
    assert not path.exists()


def test_a_side_by_side_runs_children_on_the_same_configuration():
    """bench.scale --vs-batch's children take every option of the parent but its own output, batch and record."""
    from bench.scale import child_options

    shown = ["--clients", "1000", "--rounds=3", "--vs-batch", "32", "--no-records", "--keep", "k.txt", "--audit",
             "--out=/tmp/x", "--json", "j.json", "--repeats", "2", "--query-batch=8", "--projection-dim", "2048"]
    assert child_options(shown) == ["--clients", "1000", "--rounds=3", "--no-records", "--projection-dim", "2048"]
