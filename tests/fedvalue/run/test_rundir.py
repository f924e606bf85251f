"""Safe access to a received run directory: links, special files and ways out are refused."""

from __future__ import annotations

import os

import pytest

from fedvalue.run import rundir
from fedvalue.run.rundir import UnsafeRunFile


def test_regular_files_inside_are_read(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("hello")
    assert rundir.read_text(tmp_path, "sub/a.txt") == "hello"
    with rundir.RunDir(tmp_path) as run:
        assert run.listdir("sub") == ["a.txt"] and run.listdir("absent") == []
        with run.subdir("sub") as sub:
            assert sub.read_text("a.txt") == "hello" and sub.path == tmp_path / "sub"


def run_and_outside(tmp_path, text: str):
    """A run directory and, beside it, a file of the reader's own."""
    outside = tmp_path / "outside.txt"
    outside.write_text(text)
    run = tmp_path / "run"
    run.mkdir()
    return run, outside


def test_links_fifos_devices_and_ways_out_are_refused(tmp_path):
    run, outside = run_and_outside(tmp_path, "SECRET")
    (run / "link.txt").symlink_to(outside)
    (run / "linked-dir").symlink_to(tmp_path)
    (run / "zero").symlink_to("/dev/zero")
    os.mkfifo(run / "fifo")
    (run / "dir").mkdir()
    for name, words in [("link.txt", "symbolic link"), ("linked-dir/outside.txt", "symbolic link"),
                        ("zero", "symbolic link"), ("fifo", "a FIFO"), ("dir", "a directory"),
                        ("../outside.txt", "plain relative name"), (str(outside), "plain relative name")]:
        with pytest.raises(UnsafeRunFile, match=words):
            rundir.read_bytes(run, name)
    (run / "records").write_text("x")
    with rundir.RunDir(run) as opened, pytest.raises(UnsafeRunFile, match="a regular file"):
        opened.listdir("records")
    assert outside.read_text() == "SECRET"


def test_reads_are_capped(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 1000)
    with pytest.raises(UnsafeRunFile, match="at most 999 bytes"):
        rundir.read_bytes(tmp_path, "big", max_bytes=999)
    assert len(rundir.read_bytes(tmp_path, "big", max_bytes=1000)) == 1000


def test_a_run_directory_is_resolved_once_from_relative_tilde_and_linked_paths(tmp_path, monkeypatch):
    real = tmp_path / "real"
    (real / "runs" / "x").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path / "link")
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = real / "runs" / "x"
    for named in ("runs/x", "./runs/../runs/x", "~/link/runs/x", str(tmp_path / "link" / "runs" / "x"), expected):
        assert rundir.resolve(named) == expected
    (expected / "a.txt").write_text("books")
    assert rundir.read_text("runs/x", "a.txt") == rundir.read_text("~/link/runs/x", "a.txt") == "books"
    with pytest.raises(ValueError, match="run_dir: expected a directory path"):
        rundir.resolve("")


def test_writes_replace_a_link_and_never_write_through_it(tmp_path):
    run_dir, outside = run_and_outside(tmp_path, "the reader's own file")
    (run_dir / "report.html").symlink_to(outside)
    with rundir.RunDir(run_dir) as run:
        run.write_text("report.html", "<html></html>")
    assert outside.read_text() == "the reader's own file"
    assert (run_dir / "report.html").read_text() == "<html></html>" and not (run_dir / "report.html").is_symlink()


def test_appends_truncates_and_parents_refuse_links_and_fifos(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "t.csv").write_text("keep\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ledger.csv").symlink_to(outside / "t.csv")
    os.mkfifo(run_dir / "rounds.csv")
    (run_dir / "figures").symlink_to(outside)
    with rundir.RunDir(run_dir) as run:
        for act in (lambda: run.append("ledger.csv", b"x"), lambda: run.truncate("ledger.csv", 0),
                    lambda: run.append("rounds.csv", b"x"), lambda: run.write_bytes("figures/a.png", b"x"),
                    lambda: run.mkdir("figures"), lambda: run.listdir("figures"), lambda: run.subdir("figures")):
            with pytest.raises(UnsafeRunFile, match="symbolic link|a FIFO"):
                act()
    assert (outside / "t.csv").read_text() == "keep\n" and sorted(p.name for p in outside.iterdir()) == ["t.csv"]


@pytest.mark.parametrize("name", ["../x", "a/../b", "/etc/passwd", "a//b", "./a", "a\n", "a\x1b[2J", ""])
def test_only_plain_relative_names_are_opened(tmp_path, name):
    with rundir.RunDir(tmp_path) as run, pytest.raises(UnsafeRunFile, match="plain relative name"):
        run.read_bytes(name)


def test_the_walk_lists_every_entry_without_following_links_and_is_bounded(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.txt").write_text("x")
    (tmp_path / "a" / "loop").symlink_to(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with rundir.RunDir(tmp_path) as run:
        assert run.walk() == {"a": "a directory", "a/b": "a directory", "a/b/f.txt": "a regular file",
                              "a/loop": "a symbolic link", "fifo": "a FIFO"}
        with pytest.raises(UnsafeRunFile, match="more than 3 entries"):
            run.walk(max_entries=3)
        with pytest.raises(UnsafeRunFile, match="deeper than 2 levels"):
            run.walk(max_depth=2)


def test_json_nested_past_the_parser_is_a_value_error_never_a_recursion_error(tmp_path):
    (tmp_path / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    with rundir.RunDir(tmp_path) as run, pytest.raises(ValueError, match="nests too deeply"):
        run.read_json("run.json")


def test_printable_escapes_what_a_terminal_would_obey():
    assert rundir.printable("ok\x1b[2K\rFORGED\n\x07") == "ok\\x1b[2K\\rFORGED\\n\\x07"
    assert rundir.printable("x" * 50, 10) == "xxxxxxx..."
