"""What each study makes and audits: the runs (real ``fedvalue run`` commands), the run directories in them
that are audited, and the kernel sets, each an environment an auditor's machine may compute with."""

from __future__ import annotations

from dataclasses import dataclass

#: Kernel sets by name: the environment variables an audit runs under (docs/faults-and-audit.md, in its order).
KERNEL_SETS = {
    "portable": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "one-thread": {"OMP_NUM_THREADS": "1"},
    "own": {},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
}
#: The kernel sets that move a loss here (the second table's, in its order).
LOSS_KERNEL_SETS = ("mkl-compatible", "aten-default", "portable")

#: noisy-federation at the benchmark's sizes, 3 rounds, p = 1.0 (the docs' command).
BENCHMARK = ("run", "noisy-federation", "--rounds", "3", "--final-window", "3", "--flip-probabilities", "1.0", "--quiet")
#: tiny.PLAIN's sizes (tests/simulations/experiments/noisy_federation/tiny.py), the rest as the benchmark's.
PLAIN = (*BENCHMARK[:4], "--final-window", "2", "--flip-probabilities", "1.0", "--num-clients", "8",
         "--clients-per-round", "4", "--topk", "2", "--poc-candidates", "6", "--krum-malicious", "0",
         "--valuation-budget", "16", "--validation-examples", "200", "--test-examples", "300", "--hidden", "16",
         "--batch-size", "128", "--quiet")
#: conftest's TINY options of a noisy-clients run (tests/conftest.py).
TINY = ("--num-clients", "6", "--rounds", "3", "--clients-per-round", "2", "--local-epochs", "2", "--hidden", "8",
        "--query-timeout", "600", "--quiet")


@dataclass(frozen=True)
class Run:
    """One ``fedvalue`` command (``argv`` without ``--out``) made in the folder ``name``, and the run
    directories in it that are audited (``audited``: the results file's ``run`` -> the directory, relative
    to the folder; "" the folder itself). ``continues``: the same command continues an unfinished one
    (noisy-federation skips its done cells); otherwise an unfinished one is made again (``--overwrite``)."""

    name: str
    argv: tuple[str, ...]
    audited: dict[str, str]
    continues: bool = False


def cell(policy: str) -> str:
    """A noisy-federation cell's run directory at seed 0, p = 1.0, in its benchmark's folder."""
    return f"mlp/seed-0/p1/{policy}/run"


def noisy_clients(seed: int) -> Run:
    """The main job, 3 rounds, at ``seed``."""
    return Run(f"seed-{seed}", ("run", "noisy-clients", "--rounds", "3", "--seed", str(seed), "--quiet"),
               {f"seed-{seed}": ""})


BENCHMARK_RUN = Run("benchmark", (*BENCHMARK, "--policies", "topk-ads,value-guard"),
                    {"benchmark-topk-ads": cell("topk-ads"), "benchmark-value-guard": cell("value-guard")},
                    continues=True)
PLAIN_RUN = Run("plain", (*PLAIN, "--policies", "topk-ads,value-guard,value-weighted"),
                {"plain-topk-ads": cell("topk-ads"), "plain-value-guard": cell("value-guard"),
                 "plain-value-weighted": cell("value-weighted")}, continues=True)
TINY_LOSS_RUN = Run("noisy-clients-neg-loss", ("run", "noisy-clients", "--utility", "neg_loss", *TINY),
                    {"noisy-clients-neg-loss": ""})
#: ``--quick``'s run of the second table: tiny.PLAIN's command, its topk-ads cell audited (the full study reuses it).
PLAIN_TOPK_RUN = Run(PLAIN_RUN.name, PLAIN_RUN.argv, {"plain-topk-ads": cell("topk-ads")}, continues=True)

#: The second table's first column, by the results file's ``run`` (the docs' words).
RUN_LABELS = {
    "benchmark-topk-ads": "the command above, `topk-ads` (10 of 100 clients a round, MC-ADS in 100 evaluations, "
                          "1,000 validation rows)",
    "benchmark-value-guard": "the same, `value-guard` (second-order expansion: float64 derivatives, float32 anchors)",
    "plain-topk-ads": "`tiny.PLAIN`'s sizes (8 clients, 4 a round, 200 validation rows), `topk-ads`",
    "plain-value-guard": "the same, `value-guard`",
    "plain-value-weighted": "the same, `value-weighted`",
    "noisy-clients-neg-loss": "`fedvalue run noisy-clients --utility neg_loss` and conftest's `TINY` options",
}


@dataclass(frozen=True)
class Study:
    """The runs a study makes and the kernel sets it audits each audited directory under."""

    name: str
    runs: tuple[Run, ...]
    kernel_sets: tuple[str, ...]


STUDIES = {
    "kernels": Study("kernels", tuple(noisy_clients(seed) for seed in range(10)),
                     ("portable", "avx2", "mkl-compatible", "one-thread", "own")),
    "losses": Study("losses", (BENCHMARK_RUN, PLAIN_RUN, TINY_LOSS_RUN), LOSS_KERNEL_SETS),
}
#: ``--quick``: a smoke run of each study, a few minutes.
QUICK = {
    "kernels": Study("kernels", (noisy_clients(0), noisy_clients(1)), ("portable", "own")),
    "losses": Study("losses", (PLAIN_TOPK_RUN, TINY_LOSS_RUN), ("mkl-compatible", "portable")),
}


def kernel_label(name: str) -> str:
    """A kernel set as the docs' tables name it: its variables, or the run's own kernels."""
    environment = KERNEL_SETS[name]
    return ("`" + " ".join(f"{k}={v}" for k, v in environment.items()) + "`") if environment else "the run's own kernels"
