"""Safe access to a run directory someone else may have written.

A run directory can arrive from anyone (a funder auditing contributors' books receives
it). Every file fedvalue reads or writes inside one is opened here: a path that is a
symbolic link, that resolves outside the run directory, or that is not a regular file
(a FIFO, a device, a directory where a file belongs) is refused with
:class:`UnsafeRunFile` before a byte is read or written, and reads are capped in size,
so no content of a run directory can hang a reader, make it read another file, or
make it write outside the directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Largest file read whole from a run directory (tables, records, checkpoints).
MAX_FILE_BYTES = 1024**3
#: Largest JSON file (run.json, checkpoint.json, the manifest).
MAX_JSON_BYTES = 64 * 1024**2


class UnsafeRunFile(ValueError):
    """A path in a run directory that fedvalue will not read or write."""


def resolve(path: str | os.PathLike) -> Path:
    """The absolute path of a directory a user named: ``~`` expanded, taken relative to the
    current directory, links in the path resolved. Every entry point (the CLI, ``simulate``,
    the strategy, ``load_run``, ``audit_run``, the report) resolves a run directory once, so
    every path fedvalue prints, stores or compares is this one."""
    try:
        text = os.fspath(path)
    except TypeError:
        raise TypeError(f"run_dir: expected a path (str or os.PathLike); got {type(path).__name__}.") from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text or "\x00" in text:
        raise ValueError(f"run_dir: expected a directory path; got {text!r}.")
    return Path(os.path.realpath(os.path.expanduser(text)))


def _inside(run_dir: Path, path: Path) -> Path:
    """``path`` checked component by component from ``run_dir``: no link, no way out."""
    base = Path(os.path.abspath(run_dir))
    target = Path(os.path.abspath(path))
    try:
        parts = target.relative_to(base).parts
    except ValueError:
        raise UnsafeRunFile(f"{path}: expected a path inside the run directory {run_dir}; it lies outside.") from None
    if ".." in parts:
        raise UnsafeRunFile(f"{path}: expected a path inside the run directory {run_dir}; it climbs out of it.")
    current = base
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise UnsafeRunFile(f"{current}: is a symbolic link; a run directory holds regular files only "
                                "(fedvalue never follows links out of a run directory).")
    if os.path.realpath(target) != str(target):  # the run directory itself may sit under a link; its files not
        resolved_base = os.path.realpath(base)
        if os.path.commonpath([resolved_base, os.path.realpath(target)]) != resolved_base:
            raise UnsafeRunFile(f"{path}: resolves outside the run directory {run_dir}.")
    return target


def _check_kind(run_dir: str | os.PathLike, path: str | os.PathLike, missing_ok: bool, is_kind, expected: str) -> Path:
    run_dir = resolve(run_dir)
    path = _inside(run_dir, run_dir / path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        if missing_ok:
            return path
        raise
    if not is_kind(mode):
        raise UnsafeRunFile(f"{path}: expected {expected}; it is {_kind(mode)}.")
    return path


def check_file(run_dir: str | os.PathLike, path: str | os.PathLike, *, missing_ok: bool = True) -> Path:
    """``path`` (relative to ``run_dir`` or absolute inside it) if it is a regular file or
    absent (``missing_ok``); :class:`UnsafeRunFile` otherwise. For writers: a path that
    passes can be created or replaced without writing through a link."""
    return _check_kind(run_dir, path, missing_ok, stat.S_ISREG, "a regular file")


def check_dir(run_dir: str | os.PathLike, path: str | os.PathLike = ".", *, missing_ok: bool = True) -> Path:
    """``path`` if it is a real directory inside ``run_dir`` (or absent, with ``missing_ok``)."""
    return _check_kind(run_dir, path, missing_ok, stat.S_ISDIR, "a directory")


def exists(run_dir: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether anything (a file, a link, a FIFO) sits at ``path`` in ``run_dir``."""
    return os.path.lexists(resolve(run_dir) / path)


def read_bytes(run_dir: str | os.PathLike, path: str | os.PathLike, *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file inside ``run_dir``, at most ``max_bytes`` of them.

    Opened without following a final link and without blocking (a FIFO swapped in after
    the check cannot hang the reader), then checked again on the open descriptor.
    """
    path = check_file(run_dir, path, missing_ok=False)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        raise UnsafeRunFile(f"{path}: cannot be opened as a regular file ({error.strerror}).") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeRunFile(f"{path}: expected a regular file; it is {_kind(info.st_mode)}.")
        if info.st_size > max_bytes:
            raise UnsafeRunFile(f"{path}: expected at most {max_bytes} bytes; it holds {info.st_size}.")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeRunFile(f"{path}: expected at most {max_bytes} bytes; it grew while being read.")
    return data


def read_text(run_dir: str | os.PathLike, path: str | os.PathLike, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file of ``run_dir`` (see :func:`read_bytes`)."""
    data = read_bytes(run_dir, path, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnsafeRunFile(f"{Path(run_dir) / path}: expected UTF-8 text ({error}).") from None


def list_dir(run_dir: str | os.PathLike, path: str | os.PathLike) -> list[Path]:
    """The entries of a real subdirectory of ``run_dir`` (empty when it is absent)."""
    directory = check_dir(run_dir, path)
    if not os.path.lexists(directory):
        return []
    return sorted(directory.iterdir())


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
