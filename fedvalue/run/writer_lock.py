"""One writer per run directory: an exclusive lock, held for the writer's lifetime.

Two processes writing one run (two ``--resume`` of it at once, or a run into an ``--out``
another run is writing) interleave their rounds: duplicated rows, a broken chain, and a
directory no resume accepts again. Every writer therefore takes an exclusive ``flock`` on
``writer.lock`` inside the run directory before it reads or writes anything else there,
and holds it while it lives; a second writer is refused at once, with the holder's PID.

- The kernel drops a ``flock`` when its holder's last descriptor closes: a writer killed
  by SIGKILL leaves no stale lock, and the resume that follows takes it.
- The file is opened relative to the run directory's descriptor without following a link
  (``O_NOFOLLOW``), and close-on-exec: a child process (Ray's) cannot inherit the lock and
  keep it after the writer dies.
- The holder removes the file when it lets go (still holding the lock, so a run that
  ended leaves none); a writer that took the lock on a file removed meanwhile (opened
  just before) sees that the name no longer leads to its file and tries again, so two
  writers never hold two files. A killed writer leaves the file (holding its PID); it is
  no part of the books (no manifest lists it).
- Within one process the lock is re-entrant: the command line holds it from before it
  verifies a resume to the run's end, and the run's books take it again. Holds are counted
  per directory (device, inode); the last release removes the file and closes the descriptor.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading

from fedvalue.run.rundir import RunDir, UnsafeRunFile, kind_of
from fedvalue.schema import LOCK_FILE

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class RunLocked(ValueError):
    """Another process holds the run directory's writer lock."""


class _Held:
    """This process's lock on one directory: the lock file's descriptor, the directory's (to
    remove the file when done) and how many holds it has."""

    def __init__(self, descriptor: int, directory: int) -> None:
        self.descriptor = descriptor
        self.directory = directory
        self.count = 0

    def close(self) -> None:
        """Remove the lock file (while still holding it, when the name still leads to it), then
        let go of it and of the directory."""
        try:
            mine, there = os.fstat(self.descriptor), os.stat(LOCK_FILE, dir_fd=self.directory, follow_symlinks=False)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                os.unlink(LOCK_FILE, dir_fd=self.directory)
        except OSError:
            pass  # removed with its directory (a run that committed nothing), or never there
        finally:
            os.close(self.descriptor)  # the kernel drops the flock with its last descriptor
            os.close(self.directory)


_held: dict[tuple[int, int], _Held] = {}
_registry = threading.RLock()  # re-entrant: a collected hold may release while another is taken


def _holder_pid(descriptor: int) -> str:
    """The PID the holder wrote into the lock file ('unknown' before it wrote one)."""
    try:
        text = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def _same_file(descriptor: int, run: RunDir) -> bool:
    """Whether the name ``writer.lock`` still leads to the file ``descriptor`` holds."""
    try:
        there = os.stat(LOCK_FILE, dir_fd=run.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(descriptor)
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _open_and_lock(run: RunDir) -> int:
    """The lock file's descriptor, locked; a file its holder removed while it was being
    locked is let go and the name opened again (module docstring)."""
    for _ in range(100):
        descriptor = _try_lock(run)
        if _same_file(descriptor, run):
            return descriptor
        os.close(descriptor)
    raise RunLocked(f"run_dir: {run.show()}: its writer lock file keeps being replaced; another process is "
                    "taking and leaving it in a loop.")


def _try_lock(run: RunDir) -> int:
    try:
        descriptor = os.open(LOCK_FILE, _FLAGS, 0o644, dir_fd=run.fd)
    except OSError as error:
        try:
            found = kind_of(os.stat(LOCK_FILE, dir_fd=run.fd, follow_symlinks=False).st_mode)
        except OSError:
            found = f"not openable ({error.strerror})"
        raise UnsafeRunFile(f"{run.show(LOCK_FILE)}: expected a regular file fedvalue can lock (the run's writer "
                            f"lock); it is {found}.") from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeRunFile(f"{run.show(LOCK_FILE)}: expected a regular file (the run's writer lock); it is "
                                f"{kind_of(mode)}.")
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLocked(
                f"run_dir: {run.show()} is being written by another fedvalue process (PID "
                f"{_holder_pid(descriptor)}, holding {run.show(LOCK_FILE)}); two writers would interleave their "
                "rounds. Wait for that run to end (or stop it: a killed writer leaves no lock), then resume it."
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


class WriterLock:
    """A hold on a run directory's writer lock (module docstring); :meth:`release` once done
    (or let it be collected: the hold is released then)."""

    def __init__(self, run: RunDir) -> None:
        self._key: tuple[int, int] | None = None
        info = os.fstat(run.fd)
        key = (info.st_dev, info.st_ino)
        self.path = run.show(LOCK_FILE)
        with _registry:
            held = _held.get(key)
            if held is None:
                held = _Held(_open_and_lock(run), os.dup(run.fd))
                _held[key] = held
            held.count += 1
            self._key = key

    @property
    def held(self) -> bool:
        return self._key is not None

    def release(self) -> None:
        """Give this hold back; the lock is released with the process's last hold."""
        with _registry:
            key, self._key = self._key, None
            held = None if key is None else _held.get(key)
            if held is None:
                return
            held.count -= 1
            if held.count <= 0:
                del _held[key]
                held.close()

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit the registry may be gone
            pass


def lock_run_dir(run: RunDir) -> WriterLock:
    """Hold ``run``'s writer lock (re-entrant within this process); :class:`RunLocked` when
    another process holds it."""
    return WriterLock(run)
