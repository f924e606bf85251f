"""The R lazy-load reader on the installed Debian package r-cran-dslabs (`.ci/run` installs it)."""

from __future__ import annotations

import gzip
import shutil

import pytest

from simulations.datasets.r_data import r_data_names, r_package_data_dir, read_r_data_frame


def test_movielens_is_read_whole_from_the_installed_package():
    frame = read_r_data_frame("dslabs", "movielens")
    assert frame.shape == (100_004, 7)
    assert frame["userId"].nunique() == 671 and frame["movieId"].nunique() == 9_066
    assert set(frame["rating"].unique()) <= {0.5 * k for k in range(1, 11)}
    assert "movielens" in r_data_names("dslabs") and "heights" in r_data_names("dslabs")


def test_missing_package_and_data_set_are_named():
    with pytest.raises(ValueError, match="r-cran-nosuchpackage"):
        read_r_data_frame("nosuchpackage", "x")
    with pytest.raises(ValueError, match="name: expected a data set of the R package 'dslabs'.*got 'nosuch'"):
        read_r_data_frame("dslabs", "nosuch")


def _copy_data_dir(tmp_path):
    target = tmp_path / "data"
    shutil.copytree(r_package_data_dir("dslabs"), target)
    return target


def test_an_index_pointing_past_the_database_is_refused(tmp_path):
    data_dir = _copy_data_dir(tmp_path)
    database = data_dir / "Rdata.rdb"
    with open(database, "r+b") as handle:  # cut the database short: every late offset now points past its end
        handle.truncate(1000)
    with pytest.raises(ValueError, match="expected the object within the file's 1000 bytes"):
        read_r_data_frame("dslabs", "movielens", data_dir=data_dir)


def test_garbage_in_place_of_the_index_or_an_object_is_a_value_error(tmp_path):
    data_dir = _copy_data_dir(tmp_path)
    (data_dir / "Rdata.rdx").write_bytes(gzip.compress(b"not R data at all"))
    with pytest.raises(ValueError, match="Rdata.rdx: expected R serialized data"):
        read_r_data_frame("dslabs", "movielens", data_dir=data_dir)
    data_dir = _copy_data_dir(tmp_path / "second")
    offset, length = r_data_names("dslabs")["heights"]
    with open(data_dir / "Rdata.rdb", "r+b") as handle:  # keep the length prefix, break the zlib stream
        handle.seek(offset + 4)
        handle.write(b"\x00" * (length - 4))
    with pytest.raises(ValueError, match=r"heights\): expected zlib data"):
        read_r_data_frame("dslabs", "heights", data_dir=data_dir)

