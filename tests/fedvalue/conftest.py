"""One small real signed run shared by the attack tests of this package (Ray starts once)."""

from __future__ import annotations

import pytest

from simulations.cli.main import main

TINY = ["--num-clients", "6", "--rounds", "3", "--clients-per-round", "2", "--local-epochs", "2", "--hidden", "8",
        "--query-timeout", "600",  # a wait, not a duration: Ray actors start slowly on a loaded machine
        "--quiet"]


@pytest.fixture(scope="session")
def signed_run(tmp_path_factory):
    """(run directory, private key, public key) of one small real ``noisy-clients`` run signed
    with a fresh key. Tests copy it before they change anything."""
    base = tmp_path_factory.mktemp("signed")
    private, public = base / "key.pem", base / "key.pub"
    assert main(["keygen", str(private), str(public)]) == 0
    assert main(["run", "noisy-clients", "--out", str(base / "run"), *TINY, "--sign-key", str(private)]) == 0
    return base / "run", private, public
