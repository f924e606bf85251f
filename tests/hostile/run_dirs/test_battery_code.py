"""The battery's ``--code DIR`` reaches that checkout's command line and Python, whichever layout it has: a CLI
package (``simulations.cli.main``, this one) or a CLI module (``simulations/cli.py``, the versions before)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.run_dirs.attacks import Action, Case, in_checkout
from tests.hostile.run_dirs.battery import main, run_command

MAIN = "def main(argv):\n    print('{layout}', *argv)\n    return 3\n"


def _checkout(root: Path, layout: str) -> Path:
    """A stand-in checkout whose ``fedvalue`` prints its layout and arguments and exits 3."""
    (root / "fedvalue").mkdir(parents=True)
    (root / "simulations").mkdir()
    (root / "simulations" / "__init__.py").write_text("")
    if layout == "package":
        (root / "simulations" / "cli").mkdir()
        (root / "simulations" / "cli" / "__init__.py").write_text("")
        (root / "simulations" / "cli" / "main.py").write_text(MAIN.format(layout=layout))
    else:
        (root / "simulations" / "cli.py").write_text(MAIN.format(layout=layout))
    return root


@pytest.mark.parametrize("layout", ["package", "module"])
def test_reader_commands_run_from_the_checkout_given(tmp_path, layout):
    code = _checkout(tmp_path / layout, layout)
    result = run_command(Action("audit", ["audit", "DIR"]), 60, 3000, code)
    assert (result["rc"], result["stdout"].strip(), result["outcome"]) == (3, f"{layout} audit DIR", "exited")
    python = run_command(Action("cwd", ["import os; print(os.getcwd())"], python=True), 60, 3000, code)
    assert python["stdout"].strip() == str(code)


def test_a_forger_step_runs_in_the_checkout_and_its_failure_says_where(tmp_path):
    code = _checkout(tmp_path / "before", "module")
    case = Case("x", "kind", tmp_path, tmp_path / "run", tmp_path, tmp_path / "marker", tmp_path, tmp_path, 0,
                code=code)
    assert in_checkout(case, "import simulations.cli as c, sys; print(c.__file__, *sys.argv[1:])", "A") == \
        f"{code / 'simulations' / 'cli.py'} A\n"
    with pytest.raises(RuntimeError, match=f"(?s)the forger's step failed in {code}: .*ZeroDivisionError"):
        in_checkout(case, "1 / 0")


def test_code_must_be_a_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--code", str(tmp_path)])
    assert f"--code: expected a checkout of the project (fedvalue/, simulations/); got {tmp_path}" in \
        capsys.readouterr().err
