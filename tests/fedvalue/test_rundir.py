"""Safe access to a received run directory: links, special files and ways out are refused."""

from __future__ import annotations

import os

import pytest

from fedvalue import rundir
from fedvalue.rundir import UnsafeRunFile


def test_regular_files_inside_are_read(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("hello")
    assert rundir.read_text(tmp_path, "sub/a.txt") == "hello"
    assert [p.name for p in rundir.list_dir(tmp_path, "sub")] == ["a.txt"]
    assert rundir.list_dir(tmp_path, "absent") == []


def test_links_fifos_devices_and_ways_out_are_refused(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("SECRET")
    run = tmp_path / "run"
    run.mkdir()
    (run / "link.txt").symlink_to(outside)
    (run / "linked-dir").symlink_to(tmp_path)
    (run / "zero").symlink_to("/dev/zero")
    os.mkfifo(run / "fifo")
    (run / "dir").mkdir()
    for name, words in [("link.txt", "symbolic link"), ("linked-dir/outside.txt", "symbolic link"),
                        ("zero", "symbolic link"), ("fifo", "a FIFO"), ("dir", "a directory"),
                        ("../outside.txt", "outside"), (str(outside), "outside")]:
        with pytest.raises(UnsafeRunFile, match=words):
            rundir.read_bytes(run, name)
    with pytest.raises(UnsafeRunFile, match="a regular file"):
        (run / "records").write_text("x")
        rundir.list_dir(run, "records")
    with pytest.raises(UnsafeRunFile, match="symbolic link"):
        rundir.check_file(run, "link.txt")  # writers refuse it too: nothing is written through it
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
