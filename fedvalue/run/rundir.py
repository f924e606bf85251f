"""One way into and out of a run directory, which may have come from anyone.

A run directory can arrive from anyone (a funder auditing contributors' books receives
it). Every file fedvalue reads or writes inside one goes through a :class:`RunDir`:

- the directory's path is resolved once (``~`` expanded, taken relative to the current
  directory, links in the path the user named resolved: :func:`resolve`) and the
  directory is opened once; every path fedvalue prints or compares is that resolved one;
- every component inside it is opened relative to that directory descriptor without
  following links (``openat`` with ``O_NOFOLLOW``, ``O_DIRECTORY`` for directories), so
  neither a link nor a directory swapped for a link between a check and a use can take a
  read or a write outside the run directory;
- only regular files are read or written (a FIFO, a device, a socket or a directory where
  a file belongs is refused; opened non-blocking, so a FIFO cannot hang the reader), reads
  are capped in size, and names must be plain relative names (no ``..``, no empty or
  ``.`` components, no control characters);
- writes go to a temporary file beside the target and replace it atomically, after an
  fsync of the file and then of the directory.

Anything else raises :class:`UnsafeRunFile` (a ``ValueError``) naming the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Largest file read whole from a run directory (tables, records, checkpoints).
MAX_FILE_BYTES = 1024**3
#: Largest JSON file (run.json, checkpoint.json, the manifest).
MAX_JSON_BYTES = 64 * 1024**2
#: Most entries :meth:`RunDir.walk` lists (all levels together) and how deep it goes.
MAX_ENTRIES = 100_000
MAX_DEPTH = 16

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeRunFile(ValueError):
    """An entry of a run directory that fedvalue will not read or write."""


def resolve(path: str | os.PathLike) -> Path:
    """The absolute path of a directory a user named: ``~`` expanded, relative to the
    current directory, links in the path resolved. Every entry point calls it once."""
    if isinstance(path, RunDir):
        return path.path
    try:
        text = os.fspath(path)
    except TypeError:
        raise TypeError(f"run_dir: expected a path (str or os.PathLike); got {type(path).__name__}.") from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text or "\x00" in text:
        raise ValueError(f"run_dir: expected a directory path; got {text!r}.")
    return Path(os.path.realpath(os.path.expanduser(text)))


def printable(text: object, limit: int = 200) -> str:
    """``text`` safe for a terminal or a one-line message: control characters (escape
    sequences, carriage returns, newlines) shown as escapes, at most ``limit`` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def check_name(name: str | os.PathLike) -> tuple[str, ...]:
    """The components of a name inside a run directory; :class:`UnsafeRunFile` unless it is a
    plain relative name ('/'-separated; no empty, '.' or '..' component; no control character)."""
    text = os.fspath(name)
    if isinstance(text, bytes) or not isinstance(text, str):
        raise UnsafeRunFile(f"{name!r}: expected a name inside the run directory.")
    parts = tuple(text.split("/"))
    if (not text or text.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or any(not c.isprintable() for c in text)):
        raise UnsafeRunFile(f"{printable(text)}: expected a plain relative name inside the run directory (no "
                            "'..', no empty or '.' parts, no control characters).")
    return parts


def kind_of(mode: int) -> str:
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


class RunDir:
    """An open run directory (module docstring).

    Parameters
    ----------
    path
        The directory, as a user named it (resolved once, :func:`resolve`).
    create
        Create it (and its parents) when it does not exist.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist (and ``create`` is False).
    UnsafeRunFile
        ``path`` is not a directory.
    """

    def __init__(self, path: str | os.PathLike, *, create: bool = False) -> None:
        self.path = resolve(path)
        if create:
            os.makedirs(self.path, exist_ok=True)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise FileNotFoundError(f"run_dir: expected a directory; {self.path} does not exist.") from None
        except NotADirectoryError:
            raise UnsafeRunFile(f"run_dir: expected a directory; {self.path} is not one.") from None

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    def show(self, name: str = ".") -> str:
        """The entry's path for a message (control characters escaped)."""
        return printable(self.path if name == "." else f"{self.path}/{name}", 400)

    # -- walking ----------------------------------------------------------------------------

    @contextmanager
    def _parent(self, name: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """(descriptor of the entry's directory, its last component), every directory on the
        way opened without following a link (``create``: missing ones are made)."""
        parts = check_name(name)
        opened: list[int] = []
        current = self.fd
        try:
            for depth, part in enumerate(parts[:-1], start=1):
                try:
                    current = os.open(part, _DIRECTORY, dir_fd=current)
                except FileNotFoundError:
                    if not create:
                        raise FileNotFoundError(f"{self.show('/'.join(parts[:depth]))}: does not exist.") from None
                    os.mkdir(part, 0o777, dir_fd=current)
                    current = os.open(part, _DIRECTORY, dir_fd=current)
                except OSError as error:
                    raise UnsafeRunFile(self._refusal("/".join(parts[:depth]), current, part, "a directory",
                                                      error)) from None
                opened.append(current)
            yield current, parts[-1]
        finally:
            for descriptor in opened:
                os.close(descriptor)

    def _refusal(self, name: str, dir_fd: int, leaf: str, expected: str, error: OSError | None = None) -> str:
        try:
            found = kind_of(os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            found = f"not openable ({error.strerror})" if error is not None else "not openable"
        if found == "a symbolic link":
            found += " (fedvalue never follows links inside a run directory)"
        return f"{self.show(name)}: expected {expected}; it is {found}."

    def kind(self, name: str) -> str | None:
        """What sits at ``name`` (:func:`kind_of`'s words), None when nothing does."""
        try:
            with self._parent(name) as (directory, leaf):
                return kind_of(os.stat(leaf, dir_fd=directory, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        """Whether anything (a file, a link, a FIFO) sits at ``name``."""
        return self.kind(name) is not None

    def is_file(self, name: str) -> bool:
        return self.kind(name) == "a regular file"

    def size(self, name: str) -> int:
        """Size in bytes of the regular file ``name``."""
        with self._open(name, _READ) as descriptor:
            return os.fstat(descriptor).st_size

    def listdir(self, name: str = ".") -> list[str]:
        """The names in the real subdirectory ``name`` (sorted; empty when it is absent)."""
        if name == ".":
            return sorted(os.listdir(self.fd))
        try:
            with self._parent(name) as (directory, leaf):
                try:
                    descriptor = os.open(leaf, _DIRECTORY, dir_fd=directory)
                except FileNotFoundError:
                    return []
                except OSError as error:
                    raise UnsafeRunFile(self._refusal(name, directory, leaf, "a directory", error)) from None
        except FileNotFoundError:
            return []
        try:
            return sorted(os.listdir(descriptor))
        finally:
            os.close(descriptor)

    def walk(self, *, max_entries: int = MAX_ENTRIES, max_depth: int = MAX_DEPTH) -> dict[str, str]:
        """Every entry at every level: relative name -> kind, links and special files
        included but never followed. UnsafeRunFile past ``max_entries`` or ``max_depth``."""
        found: dict[str, str] = {}

        def visit(descriptor: int, prefix: str, depth: int) -> None:
            for entry in sorted(os.listdir(descriptor)):
                name = prefix + entry
                if len(found) >= max_entries:
                    raise UnsafeRunFile(f"{self.show()}: holds more than {max_entries} entries.")
                kind = kind_of(os.stat(entry, dir_fd=descriptor, follow_symlinks=False).st_mode)
                found[name] = kind
                if kind == "a directory":
                    if depth >= max_depth:
                        raise UnsafeRunFile(f"{self.show(name)}: nested deeper than {max_depth} levels.")
                    child = os.open(entry, _DIRECTORY, dir_fd=descriptor)
                    try:
                        visit(child, name + "/", depth + 1)
                    finally:
                        os.close(child)

        visit(self.fd, "", 1)
        return found

    # -- reading ----------------------------------------------------------------------------

    @contextmanager
    def _open(self, name: str, flags: int, mode: int = 0o666) -> Iterator[int]:
        """A descriptor of the regular file ``name``, opened without following a link."""
        with self._parent(name, create=bool(flags & os.O_CREAT)) as (directory, leaf):
            try:
                descriptor = os.open(leaf, flags, mode, dir_fd=directory)
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.show(name)}: does not exist.") from None
            except OSError as error:
                raise UnsafeRunFile(self._refusal(name, directory, leaf, "a regular file", error)) from None
        try:
            found = os.fstat(descriptor).st_mode
            if not stat.S_ISREG(found):
                raise UnsafeRunFile(f"{self.show(name)}: expected a regular file; it is {kind_of(found)}.")
            yield descriptor
        finally:
            os.close(descriptor)

    def read_bytes(self, name: str, *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
        """The bytes of the regular file ``name``, at most ``max_bytes`` of them."""
        with self._open(name, _READ) as descriptor:
            size = os.fstat(descriptor).st_size
            if size > max_bytes:
                raise UnsafeRunFile(f"{self.show(name)}: expected at most {max_bytes} bytes; it holds {size}.")
            return _read_all(descriptor, max_bytes, self.show(name))

    def sha256(self, name: str, *, max_bytes: int = MAX_FILE_BYTES) -> str:
        """SHA-256 of the regular file ``name`` (at most ``max_bytes``), hashed as it streams:
        a chunk in memory at a time, never the file."""
        with self._open(name, _READ) as descriptor:
            size = os.fstat(descriptor).st_size
            if size > max_bytes:
                raise UnsafeRunFile(f"{self.show(name)}: expected at most {max_bytes} bytes; it holds {size}.")
            digest, total = hashlib.sha256(), 0
            while chunk := os.read(descriptor, min(1 << 24, max_bytes + 1 - total)):
                total += len(chunk)
                if total > max_bytes:
                    raise UnsafeRunFile(f"{self.show(name)}: expected at most {max_bytes} bytes; it grew while "
                                        "being read.")
                digest.update(chunk)
            return digest.hexdigest()

    def read_text(self, name: str, *, max_bytes: int = MAX_FILE_BYTES) -> str:
        """The UTF-8 text file ``name`` (see :meth:`read_bytes`)."""
        data = self.read_bytes(name, max_bytes=max_bytes)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UnsafeRunFile(f"{self.show(name)}: expected UTF-8 text ({error.reason} at byte "
                                f"{error.start}).") from None

    def read_json(self, name: str, *, max_bytes: int = MAX_JSON_BYTES):
        """The JSON file ``name`` parsed (:func:`loads_json`); ValueError naming it otherwise."""
        return loads_json(self.read_text(name, max_bytes=max_bytes), self.show(name))

    def subdir(self, name: str) -> RunDir:
        """The real subdirectory ``name`` opened as a run directory of its own (never through
        a link: its path is this directory's, walked component by component)."""
        with self._parent(name) as (directory, leaf):
            try:
                descriptor = os.open(leaf, _DIRECTORY, dir_fd=directory)
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.show(name)}: does not exist.") from None
            except OSError as error:
                raise UnsafeRunFile(self._refusal(name, directory, leaf, "a directory", error)) from None
        child = RunDir.__new__(RunDir)
        child.path, child.fd = self.path / name, descriptor
        return child

    # -- writing ----------------------------------------------------------------------------

    def mkdir(self, name: str) -> None:
        """Make the real directory ``name`` (and its parents); nothing when it is one already."""
        with self._parent(name, create=True) as (directory, leaf):
            try:
                os.mkdir(leaf, 0o777, dir_fd=directory)
            except FileExistsError:
                found = os.stat(leaf, dir_fd=directory, follow_symlinks=False).st_mode
                if not stat.S_ISDIR(found):
                    raise UnsafeRunFile(f"{self.show(name)}: expected a directory; it is {kind_of(found)}.") from None

    def write_bytes(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data`` atomically and durably: written to ``name.tmp``,
        fsynced, renamed over ``name`` (a link there is replaced, never written through),
        then the directory fsynced. A crash leaves the old file or the new, never a torn one."""
        parts = check_name(name)
        tmp = "/".join(parts[:-1] + (parts[-1] + ".tmp",))
        with self._parent(name, create=True) as (directory, leaf):
            self._unlink_at(directory, leaf + ".tmp", tmp)
            try:
                descriptor = os.open(leaf + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                     | os.O_CLOEXEC, 0o666, dir_fd=directory)
            except OSError as error:
                raise UnsafeRunFile(self._refusal(tmp, directory, leaf + ".tmp", "a new file", error)) from None
            try:
                _write_all(descriptor, data)
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            try:
                found = os.stat(leaf, dir_fd=directory, follow_symlinks=False).st_mode
            except FileNotFoundError:
                found = None
            if found is not None and stat.S_ISDIR(found):
                os.unlink(leaf + ".tmp", dir_fd=directory)
                raise UnsafeRunFile(f"{self.show(name)}: expected a regular file; it is a directory.")
            os.replace(leaf + ".tmp", leaf, src_dir_fd=directory, dst_dir_fd=directory)
            os.fsync(directory)

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(name, text.encode("utf-8"))

    def append(self, name: str, data: bytes) -> int:
        """Append ``data`` to the regular file ``name`` (created when absent) and fsync it;
        returns the file's size after."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        with self._open(name, flags) as descriptor:
            _write_all(descriptor, data)
            os.fsync(descriptor)
            return os.fstat(descriptor).st_size

    def truncate(self, name: str, size: int) -> None:
        """Cut the regular file ``name`` to ``size`` bytes (durably)."""
        with self._open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC) as descriptor:
            os.ftruncate(descriptor, size)
            os.fsync(descriptor)

    def unlink(self, name: str, *, missing_ok: bool = True) -> None:
        """Remove the entry ``name`` (a file or a link; never what a link points to)."""
        try:
            with self._parent(name) as (directory, leaf):
                self._unlink_at(directory, leaf, name, missing_ok=missing_ok)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def _unlink_at(self, directory: int, leaf: str, name: str, *, missing_ok: bool = True) -> None:
        try:
            os.unlink(leaf, dir_fd=directory)
        except FileNotFoundError:
            if not missing_ok:
                raise FileNotFoundError(f"{self.show(name)}: does not exist.") from None
        except (IsADirectoryError, PermissionError) as error:
            raise UnsafeRunFile(f"{self.show(name)}: expected a file to remove; it is a directory "
                                f"({error.strerror}).") from None


def _read_all(descriptor: int, max_bytes: int, shown: str) -> bytes:
    """The file's bytes, at most ``max_bytes``, holding one copy of them: one read into one
    buffer of the size ``fstat`` gave, returned as it is. Only a file that changed while it
    was read (a short read, or bytes past that size: read on, up to ``max_bytes``) costs a
    second copy, when its parts are joined."""
    size = min(os.fstat(descriptor).st_size, max_bytes)
    parts = [os.read(descriptor, size) if size else b""]
    total = len(parts[0])
    while chunk := os.read(descriptor, min(1 << 24, max_bytes + 1 - total)):
        parts.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise UnsafeRunFile(f"{shown}: expected at most {max_bytes} bytes; it grew while being read.")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(descriptor, view)
        view = view[written:]


def loads_json(text: str, what: str):
    """``text`` parsed as JSON; ValueError naming ``what`` for anything that is not JSON,
    nested past the parser's depth included (never a RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{what}: its JSON nests too deeply to be read.") from None
    except ValueError as error:
        raise ValueError(f"{what}: is not JSON ({printable(error, 120)}).") from None


def open_run_dir(run_dir: str | os.PathLike | RunDir, *, create: bool = False) -> RunDir:
    """``run_dir`` itself when it is an open :class:`RunDir`, else the directory opened."""
    return run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir, create=create)


# One-call helpers (each opens the directory): tests and scripts that read one file.


def read_bytes(run_dir: str | os.PathLike | RunDir, name: str, *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    return open_run_dir(run_dir).read_bytes(name, max_bytes=max_bytes)


def read_text(run_dir: str | os.PathLike | RunDir, name: str, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    return open_run_dir(run_dir).read_text(name, max_bytes=max_bytes)


def exists(run_dir: str | os.PathLike | RunDir, name: str) -> bool:
    return open_run_dir(run_dir).exists(name)
