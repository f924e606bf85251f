"""A fresh machine: README's set-up installs the Debian packages the tests read, in one command,
and a machine without them gets one line saying which are missing and how to install them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import LONGEST_FIRST, OS_PACKAGES

ROOT = Path(__file__).resolve().parents[1]


def test_readme_installs_the_os_packages_the_ci_installs():
    readme = (ROOT / "README.md").read_text()
    assert f"sudo apt-get install -y {' '.join(OS_PACKAGES)}" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"debian_packages=({' '.join(OS_PACKAGES)})" in ci


def test_a_missing_package_is_one_line_naming_it_and_the_command():
    """No chromium on PATH stands in for a machine without the package."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "--collect-only", "-q", "tests/test_layout.py"],
                            cwd=ROOT, env={**os.environ, "PATH": ""}, capture_output=True, text=True, timeout=300,
                            check=False)
    printed = result.stdout + result.stderr
    assert result.returncode == 4, printed
    assert "the tests need Debian packages that are not installed: chromium; install them with: sudo apt-get " \
           "update && sudo apt-get install -y chromium dataset-fashion-mnist r-cran-dslabs r-cran-cardata" in printed
    assert "Traceback" not in printed and "INTERNALERROR" not in printed


def test_the_suite_s_longest_first_list_names_files_and_folders_that_exist():
    """A renamed test file would silently drop out of the workers' schedule (tests/conftest.py)."""
    assert [prefix for prefix in LONGEST_FIRST if not (ROOT / prefix).exists()] == []
