"""Reading a key file as ssh does: a private key nobody else can read, one PEM block, nothing else.

A key file is read once, from one descriptor (what is checked is what is parsed):

- it is a regular file (never a FIFO or a device) of at most :data:`MAX_KEY_BYTES`;
- a private key is readable and writable by its owner only: a mode with any group or
  other bit (``mode & 0o077``) is refused, naming the file, its mode and the fix
  (``chmod 600``), as OpenSSH refuses an "UNPROTECTED PRIVATE KEY FILE";
- it holds exactly one PEM block (RFC 7468: ``-----BEGIN LABEL-----``, base64 lines,
  ``-----END LABEL-----``) and nothing but whitespace around it: a second key, or data
  after the block, is refused (a parser that takes the first block and ignores the rest
  would sign with a key the file's reader never looked at).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from fedvalue.run.rundir import kind_of, printable

#: Largest key file read (a PEM key is a few hundred bytes).
MAX_KEY_BYTES = 65536
#: One PEM block: its label, base64 body and the matching end line.
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n[A-Za-z0-9+/=\r\n]*?-----END \1-----")
_BEGIN = re.compile(rb"-----BEGIN ")


def _fail(what: str, why: str) -> ValueError:
    return ValueError(f"{what}: expected a PEM key file written by `fedvalue keygen`; {why}.")


def _check_private_mode(what: str, path: Path, info: os.stat_result) -> None:
    if info.st_mode & 0o077:
        raise ValueError(
            f"{what}: {printable(path)} is a private key readable or writable by others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}); a private key must be readable by its owner only. Run: chmod 600 "
            f"{printable(path)}")


def _check_one_block(what: str, path: Path, data: bytes) -> None:
    blocks = len(_BEGIN.findall(data))
    if blocks != 1:
        raise _fail(what, f"{printable(path)} holds {blocks} PEM blocks (one key expected)")
    found = _PEM_BLOCK.search(data)
    if found is None:
        raise _fail(what, f"{printable(path)} holds no whole PEM block")
    before, after = data[:found.start()], data[found.end():]
    if before.strip():
        raise _fail(what, f"{printable(path)} holds {len(before.strip())} bytes before its PEM block")
    if after.strip():
        raise _fail(what, f"{printable(path)} holds {len(after.strip())} bytes of trailing data after its PEM block")


def read_key_file(path: str | os.PathLike, what: str, *, private: bool) -> bytes:
    """The bytes of the key file ``path`` (module docstring); ValueError naming ``what`` (the
    parameter) and the file otherwise. ``private``: refuse a mode others can read."""
    path = Path(path).expanduser()
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise _fail(what, f"{printable(path)} cannot be opened ({error.strerror})") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _fail(what, f"{printable(path)} is {kind_of(info.st_mode)}")
        if info.st_size > MAX_KEY_BYTES:
            raise ValueError(f"{what}: expected a PEM key file of at most {MAX_KEY_BYTES} bytes; {printable(path)} "
                             f"holds {info.st_size}.")
        if private:
            _check_private_mode(what, path, info)
        data = handle.read(MAX_KEY_BYTES + 1)
    if len(data) > MAX_KEY_BYTES:
        raise ValueError(f"{what}: expected a PEM key file of at most {MAX_KEY_BYTES} bytes; {printable(path)} grew "
                         "while being read.")
    _check_one_block(what, path, data)
    return data
