"""The audit on another machine's kernels, measured: the two kernel-set tables of docs/faults-and-audit.md
("An audit on another machine") from runs made here and audited under each kernel set.

    python -m bench.portability kernels --out DIR --keep docs/results/audit_kernels.csv
    python -m bench.portability losses --out DIR --keep docs/results/audit_kernels_loss.csv
    python -m bench.portability table docs/results/audit_kernels.csv     # the docs' table of a results file

``kernels`` makes ``fedvalue run noisy-clients --rounds 3 --seed S`` (S = 0-9) and audits each with torch's
portable kernels and MKL without AVX, the AVX2 set, MKL's compatible path, one OpenMP thread and the run's own
kernels; ``losses`` makes the ``--utility neg_loss`` runs of the second table (noisy-federation cells at the
benchmark's and at tiny.PLAIN's sizes, a small noisy-clients run) and audits each under the three kernel sets
that move a loss. Every run and every audit is a child process of the real CLI; each audit writes its report
with ``fedvalue audit --json``, whose counts say both verdicts: a run was intact under the exact comparison of
the version before exactly when nothing needed the float-rounding allowance. Both commands resume: a run whose
directories are complete and an audit whose record is kept are not made again. ``--quick``: two seeds or two
runs, two kernel sets (a smoke run of a few minutes).

Modules: plan (the runs and kernel sets of each study), measure (making the runs and audits, the results file),
tables (the results file read back and rendered as the docs' tables), __main__ (the command).
"""
