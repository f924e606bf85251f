"""The suite's one check of the machine: the Debian packages some tests read (real data sets, a
headless browser) are installed, or one line says which are missing and the command that
installs them (never a traceback from deep inside a test). And the small real run the tests
of several folders read (:func:`signed_run`: Ray starts once a worker process for all of them). And the order in
which the suite's two worker processes (pyproject.toml: ``-n 2 --dist loadfile``) are handed its files:
a file goes whole to one worker, so that its module fixtures (a real run each) are made once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from simulations.cli.main import main

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


TINY = ["--num-clients", "6", "--rounds", "3", "--clients-per-round", "2", "--local-epochs", "2", "--hidden", "8",
        "--query-timeout", "600",  # a wait, not a duration: Ray actors start slowly on a loaded machine
        "--quiet"]


@pytest.fixture(scope="session")
def signed_run(tmp_path_factory):
    """(run directory, private key, public key) of one small real ``noisy-clients`` run (seed 0, 6
    clients, 3 rounds of 2, ``TINY``) signed with a fresh key, shared by every test that reads a
    real run's books. Tests copy it before they change anything."""
    base = tmp_path_factory.mktemp("signed")
    private, public = base / "key.pem", base / "key.pub"
    assert main(["keygen", str(private), str(public)]) == 0
    assert main(["run", "noisy-clients", "--out", str(base / "run"), *TINY, "--sign-key", str(private)]) == 0
    return base / "run", private, public


#: The longest files (real runs, dozens of processes), longest first: they are handed out before the
#: many short files, which then fill both workers to a common end (``--no-loadscope-reorder`` keeps this
#: order instead of xdist's, by number of tests, which handed a one-test real run out last). Only the
#: suite's speed depends on this list.
LONGEST_FIRST = (
    "tests/simulations/experiments/noisy_federation/",
    "tests/examples/test_examples.py",
    "tests/hostile/crashes/test_kill_points.py",
    "tests/simulations/runner/test_run_dir_paths.py",
    "tests/simulations/experiments/procurement/test_procurement.py",
    "tests/simulations/runner/test_simulate_policies.py",
    "tests/hostile/replies/test_replies.py",
    "tests/hostile/crashes/test_engine_failures.py",
    "tests/simulations/experiments/reciprocity/test_movielens.py",
    "tests/hostile/test_portability.py",
    "tests/simulations/experiments/noisy_clients/test_study.py",
    "tests/simulations/experiments/fairness/test_federated.py",
    "tests/fedvalue/analysis/test_report.py",
    "tests/hostile/manipulation/test_attacks_study.py",
    "tests/simulations/runner/test_inner_strategies.py",
)


def _rank(nodeid: str) -> int:
    return next((rank for rank, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first (a stable sort: the order within a file is kept)."""
    items.sort(key=lambda item: _rank(item.nodeid))
