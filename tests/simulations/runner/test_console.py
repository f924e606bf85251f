"""What the command line prints while long commands run: a progress bar with an ETA, off with --quiet."""

from __future__ import annotations

import io

from rich.console import Console

from simulations.runner.console import progress_bar


def test_progress_bar_counts_steps_shows_eta_and_the_last_step_text():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with progress_bar(3, "study", console=console) as advance:
        advance("seed 0 done")
        advance("seed 1 done")
        advance("seed 2 done")
    text = out.getvalue()
    assert "3/3" in text and "ETA" in text and "seed 2 done" in text


def test_quiet_progress_prints_nothing(capsys):
    with progress_bar(2, "study", enabled=False) as advance:
        advance("seed 0 done")
        advance()
    assert capsys.readouterr() == ("", "")
