"""Data frames from an installed R package's lazy-load database, read without R.

An R package that ships data keeps it in ``<library>/<package>/data/Rdata.rdx`` (a gzipped,
serialized index: object name -> (offset, length)) and ``Rdata.rdb`` (at each offset a 4-byte
big-endian length, then the zlib-compressed serialized object). The PyPI package ``rdata``
parses both and converts them to pandas; this module finds the files, checks the index's
offsets against the database and caps every read, so a damaged or hostile package directory
gives a :class:`ValueError` naming the file, never a huge allocation or a traceback.

    read_r_data_frame("dslabs", "movielens")   # Debian: apt-get install r-cran-dslabs
"""

from __future__ import annotations

import os
import struct
import warnings
import zlib
from pathlib import Path

import pandas as pd

#: Where Debian's r-cran-* packages install (then the R defaults elsewhere).
R_LIBRARIES = ("/usr/lib/R/site-library", "/usr/lib/R/library", "/usr/local/lib/R/site-library")
#: Largest decompressed object read (the dslabs movielens frame is 5.4 MB).
MAX_OBJECT_BYTES = 512 * 1024**2
#: Largest index file read.
MAX_INDEX_BYTES = 16 * 1024**2


def r_package_data_dir(package: str, libraries: tuple[str, ...] = R_LIBRARIES) -> Path:
    """``<library>/<package>/data`` of the first library holding ``package``'s lazy-load data."""
    for library in libraries:
        directory = Path(library) / package / "data"
        if (directory / "Rdata.rdx").is_file() and (directory / "Rdata.rdb").is_file():
            return directory
    debian = "r-cran-" + package.lower()
    raise ValueError(f"package: expected the R package {package!r} with its data installed (Debian: "
                     f"`apt-get install {debian}`); found no {package}/data/Rdata.rdx under "
                     f"{', '.join(libraries)}.")


def _parse(raw: bytes, where: str):
    import rdata

    try:
        with warnings.catch_warnings():  # rdata warns that a bare serialization has no file header
            warnings.simplefilter("ignore", UserWarning)
            return rdata.conversion.convert(rdata.parser.parse_data(raw))
    except Exception as error:  # noqa: BLE001 - whatever the bytes make the parser raise is a damaged file
        raise ValueError(f"{where}: expected R serialized data; it does not parse ({type(error).__name__}: "
                         f"{error}).") from None


def _decompress(data: bytes, limit: int, where: str, *, gzipped: bool) -> bytes:
    """``data`` inflated (gzip or zlib), refused past ``limit`` bytes."""
    inflater = zlib.decompressobj(wbits=(16 + zlib.MAX_WBITS) if gzipped else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as error:
        raise ValueError(f"{where}: expected {'gzip' if gzipped else 'zlib'} data ({error}).") from None
    if len(out) > limit:
        raise ValueError(f"{where}: expected at most {limit} bytes once decompressed; it holds more.")
    return out


def r_data_names(package: str, *, data_dir: str | os.PathLike | None = None) -> dict[str, tuple[int, int]]:
    """The data objects of ``package``: name -> (offset, length) in its ``Rdata.rdb``."""
    directory = Path(data_dir) if data_dir is not None else r_package_data_dir(package)
    index_path = directory / "Rdata.rdx"
    if index_path.stat().st_size > MAX_INDEX_BYTES:
        raise ValueError(f"{index_path}: expected an index of at most {MAX_INDEX_BYTES} bytes.")
    index = _parse(_decompress(index_path.read_bytes(), MAX_INDEX_BYTES, str(index_path), gzipped=True),
                   str(index_path))
    try:
        variables = index["variables"]
        return {str(name): (int(where[0]), int(where[1])) for name, where in variables.items()}
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        raise ValueError(f"{index_path}: expected a lazy-load index with a 'variables' table of "
                         "(offset, length) pairs.") from None


def read_r_data_frame(package: str, name: str, *, data_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """The data frame ``name`` of the installed R package ``package`` (pandas, R's factors as
    categoricals, integer columns as nullable integers).

    ``data_dir`` overrides where the package's ``data`` directory is looked for.
    """
    directory = Path(data_dir) if data_dir is not None else r_package_data_dir(package)
    names = r_data_names(package, data_dir=directory)
    if name not in names:
        raise ValueError(f"name: expected a data set of the R package {package!r} ({', '.join(sorted(names))}); "
                         f"got {name!r}.")
    offset, length = names[name]
    database = directory / "Rdata.rdb"
    where = f"{database} ({name})"
    size = database.stat().st_size
    if offset < 0 or length < 4 or offset + length > size:
        raise ValueError(f"{where}: expected the object within the file's {size} bytes; the index places it at "
                         f"{offset}..{offset + length}.")
    with open(database, "rb") as handle:
        handle.seek(offset)
        blob = handle.read(length)
    (declared,) = struct.unpack(">I", blob[:4])
    if declared > MAX_OBJECT_BYTES:
        raise ValueError(f"{where}: expected an object of at most {MAX_OBJECT_BYTES} bytes; it declares {declared}.")
    raw = _decompress(blob[4:], declared, where, gzipped=False)
    if len(raw) != declared:
        raise ValueError(f"{where}: expected {declared} bytes once decompressed (its length prefix); got {len(raw)}.")
    frame = _parse(raw, where)
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{where}: expected a data frame; it is a {type(frame).__name__}.")
    return frame
