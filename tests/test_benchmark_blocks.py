"""Every block of printed results in docs/benchmarks.md and docs/faults-and-audit.md is held to the results file
its run kept, or names the run that would keep one.

A benchmark run with ``--keep FILE`` keeps what it printed in docs/results/FILE under the command and commit
(:func:`bench.kept_output`). :data:`HELD` (:data:`bench.docs_tables.benchmarks.BLOCKS_HELD`) maps a block, by its
key (its first line, or first lines where blocks open alike: :func:`entry_of`), to that file: every line of the block
must be a line of the file, in the file's order (a block may quote an excerpt, never a changed line); the output of a
``fedvalue run`` the docs show is kept the same way, under :func:`bench.results_header` of its command.
:data:`PENDING` lists each block not kept yet by its key with the command that made it and what it costs, so a new
block of results without an entry fails here, and an entry whose block is gone does too. A block that is a command to
type, or code (its fence names a language), is not a result (:func:`bench.docs_tables.blocks.blocks`).
:func:`listing_problems` serves tests/test_reproductions_blocks.py too.
"""

from __future__ import annotations

from collections.abc import Mapping

from bench import kept_output
from bench.docs_tables.benchmarks import BLOCK_DOCS as DOCS
from bench.docs_tables.benchmarks import BLOCKS_HELD as HELD
from bench.docs_tables.benchmarks import BLOCKS_PENDING as PENDING
from bench.docs_tables.blocks import blocks, entry_of, held_problems, unkept_lines
from bench.docs_tables.renderings import ROOT


def result_blocks() -> list[list[str]]:
    """Every block of results of :data:`DOCS`."""
    return [block for name in DOCS for block in blocks((ROOT / name).read_text().splitlines())]


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
