"""The suite's one check of the machine: the Debian packages some tests read (real data sets, a
headless browser) are installed, or one line says which are missing and the command that
installs them (never a traceback from deep inside a test)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

#: Debian package -> how the suite tells it is installed (.ci/run installs the same list).
OS_PACKAGES = {
    "chromium": lambda: shutil.which("chromium") or shutil.which("chromium-browser"),
    "dataset-fashion-mnist": lambda: Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz").is_file(),
    "r-cran-dslabs": lambda: _r_data("dslabs"),
    "r-cran-cardata": lambda: _r_data("carData"),
}
R_LIBRARIES = ("/usr/lib/R/site-library", "/usr/lib/R/library", "/usr/local/lib/R/site-library")


def _r_data(package: str) -> bool:
    return any((Path(library) / package / "data" / "Rdata.rdx").is_file() for library in R_LIBRARIES)


def missing_os_packages() -> list[str]:
    return [name for name, installed in OS_PACKAGES.items() if not installed()]


def install_line(missing: list[str]) -> str:
    return (f"the tests need Debian packages that are not installed: {', '.join(missing)}; install them with: "
            f"sudo apt-get update && sudo apt-get install -y {' '.join(OS_PACKAGES)}")


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = missing_os_packages()
    if missing:
        pytest.exit(install_line(missing), returncode=4)
