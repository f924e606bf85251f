"""Every block of printed results in docs/benchmarks.md and docs/faults-and-audit.md names the run that would keep
it as a results file.

The benchmarks print their results; none writes a results file yet, and no block was kept from the run that made
it, so no block is held to a file. :data:`PENDING` lists each block by its first line with the command that made
it and what it costs, so a new block of results without an entry fails here, and an entry whose block is gone
does too. A block that is a command to type is not a result.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/benchmarks.md", "docs/faults-and-audit.md")
#: First words of a block that is a command to type, or the one line the CLI prints for bad input: not results.
COMMANDS = ("fedvalue ", "python ", "pip ", "fedvalue: error: ")
VALUATION = "python -m bench.valuation --against-floor"
#: The blocks of printed results, by first line: the command that printed them, and their size.
PENDING = {
    "  n  (a) naive s  (b) MC-200 s  (c) ours s  (a)/(c)  (b)/(c)      evals a/b/c     peak MB a/b/c  growth MB c"
    "  max|a-c|  MC err b  (d) floor s  (c)/(d)": "python -m bench.valuation (n = 6, 8, 10; minutes)",
    "  n pair  (c) ours s  (d) floor s  (c)/(d)  peak MB c": f"{VALUATION} --sizes 10 --repeats 6",
    "whole batch (current)   5.5–5.9 s": "no command: LinearStates(...).values timed by hand, blocks of rows",
    "  n pair  (c) ours s  (d) floor s  (c)/(d)  peak MB c  (c) before s  before/(d)  values":
        f"{VALUATION} --before main --threads 1 --sizes 8 10 --repeats 2; "
        f"{VALUATION} --sizes 8 10 --repeats 5 --before f881710 --threads 1",
    "  n  estimator                 max |φ − exact|  evaluations  permutations     |gap|  seconds":
        "python -m bench.estimators (an excerpt); python -m bench.estimators --sizes 14",
    "game      n  estimator   samples  evaluations    max |φ − φ*|": "python -m bench.sampling (summary lines)",
    "  n  decision estimator                   seed  evaluations  settled"
    "  agree (settled)  agree (all)  max |φ − exact|":
        "python -m bench.estimators --adaptive --sizes 14 --seeds 3 (about 5 minutes on 2 busy cores)",
    "  n   plain s   fast s  plain/fast  floor s  fast/floor  evals  peak MB plain/fast  max|plain-fast|":
        "python -m bench.valuation --model cnn --sizes 6 8 --repeats 2 --threads 1",
    "extra busy processes  setting                                min s  median s   max s":
        "python -m bench.valuation --spread",
    "round 1 valuation: 16/64 coalitions (25%), 74.8 s, ETA 224 s":
        "fedvalue run noisy-clients (the progress display, shown as an example of its lines)",
    "model    n  budget estimator               seconds   evals  max err  mean err  max stderr    rho    AUC":
        "python -m bench.large_rounds --models mlp --budgets 20 80 320 --reference 400 --json large-mlp.json",
    "model    n  budget estimator               seconds   evals  max err  mean err  max stderr":
        "python -m bench.large_rounds --models cnn --sizes 20 50",
    "round   1: elapsed     64.8 s, valuation    1.8 s (950 evaluations, ads-kernelshap), server    3180 MB, tree"
    "    4503 MB": "python -m bench.scale --no-records (1,000 clients, 50 rounds)",
    "round   1: elapsed    237.8 s, valuation    3.9 s (950 evaluations, ads-kernelshap), server    2342 MB, tree"
    "    3639 MB": "python -m bench.scale --clients 1000 --per-round 50 --rounds 1 --projection-dim 2048 --audit "
                   "--out /tmp/flowrec-scale1 (1,000 clients, 1 round; ~9 minutes)",
    "before (one actor, partition query per run, checkpoints, 0.1 s reply poll)":
        "python -m bench.study --seeds 4, here and on the version before",
    "rounds   wall s  s/round  server peak MB  tree peak MB  records MB": "python -m bench.load (200 clients)",
}


def result_blocks() -> list[str]:
    """The first line of every fenced block of :data:`DOCS` that is not a command."""
    firsts = []
    for name in DOCS:
        lines = (ROOT / name).read_text().splitlines()
        opens = [i for i, line in enumerate(lines) if line.startswith("```")][::2]
        firsts += [lines[i + 1] for i in opens if not lines[i + 1].startswith(COMMANDS)]
    return firsts


def test_every_block_of_results_names_the_run_that_would_keep_it():
    firsts = result_blocks()
    assert not [first for first in firsts if first not in PENDING], "blocks of results not in PENDING"
    assert not [first for first in PENDING if first not in firsts], "PENDING names blocks the docs no longer hold"
