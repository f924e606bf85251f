"""The noisy-federation benchmark in every regime of bad clients (``python -m bench.regimes``).

Modules: study (the regimes, running them seed by seed, gathering their tables), __main__ (the command), table and
figure (the docs' regimes table and figure from the results files), tuning (value-guard's tuning table), ucb_tuning
(the value-driven sampler's tuning variants: their commands and the docs' table).
"""
