"""The printed blocks of docs/benchmarks.md and docs/faults-and-audit.md: the file of docs/results/ each held block
is an excerpt of (:data:`BLOCKS_HELD`, kept by the run's ``--keep FILE``: :func:`bench.kept_output`), or the run
that printed it (:data:`BLOCKS_PENDING`). tests/test_benchmark_blocks.py holds the docs to these lists.
"""

from __future__ import annotations

#: The docs whose blocks these lists hold.
BLOCK_DOCS = ("docs/benchmarks.md", "docs/faults-and-audit.md")
#: The blocks of printed results, by first line: the command that printed them, and their size.
BLOCKS_PENDING: dict[str, str] = {
}


#: Blocks kept by their run, by first line: the file of docs/results/ that holds them.
BLOCKS_HELD: dict[str, str] = {
    "(c) ours against (d) its matmuls alone, and (c) as of HEAD; "
    "2 alternating run(s) per n; torch threads: 1; load average before: 0.03 0.68 1.31": "valuation_same_code.txt",
    "  n  (a) naive s  (b) MC-200 s  (c) ours s  (a)/(c)  (b)/(c)      evals a/b/c     peak MB a/b/c  growth MB c"
    "  max|a-c|  MC err b  (d) floor s  (c)/(d)": "valuation.txt",
    "  n pair  (c) ours s  (d) floor s  (c)/(d)  peak MB c": "valuation_floor.txt",
    "  n   plain s   fast s  plain/fast  floor s  fast/floor  evals  peak MB plain/fast  max|plain-fast|":
        "valuation_cnn.txt",
    "  n  estimator                 max |φ − exact|  evaluations  permutations     |gap|  seconds": "estimators.txt",
    "game      n  estimator   samples  evaluations    max |φ − φ*|": "sampling.txt",
    "  n  decision estimator                   seed  evaluations  settled  agree (settled)  agree (all)  max |φ − exact|":
        "estimators_adaptive.txt",
    "identical rounds (exact ADS + LOO, 10 clients, 1,024 coalitions; digits MLP, 450 held-out), 5 per child; load "
    "average before: 4.83 4.31 2.73": "valuation_spread.txt",
    "model    n  budget estimator               seconds   evals  max err  mean err  max stderr    rho    AUC":
        "large_rounds_mlp.txt",
    "real Fashion-MNIST rounds; held-out images: MLP 1000, CNN 300; one torch thread; load average before: 0.2 0.8 1.2":
        "large_rounds_cnn.txt",
    "1000 clients, 50 a round, 50 rounds, flows True, projection none, records False, budget 1000, query batch all; "
    "load average 0.2 0.8 1.2": "scale_1000.txt",
    "round 1 valuation: 543/3,709 coalitions (15%), 10.0 s, ETA 59 s": "progress_example.txt",
    "noisy-clients, 200 clients, 20 per round (MC-ADS + LOO per round); load average before: 2.4 3.5 3.7": "load.txt",
    "noisy-clients study, 4 seeds, 32 runs of 5 rounds": "study_4.txt",
    "1000 clients, 50 a round, 3 rounds; idle queries all at once against 32 at a time, 2 pairs; load average 3.2 4.3 5.7":
        "scale_query_batch.txt",
    "1000 clients, 50 a round, 50 rounds, flows True, projection 2048, records True, budget 1000, query batch 32; load "
    "average 4.0 7.2 7.8": "scale_projected_50.txt",
}
