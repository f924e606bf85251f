"""The noisy-federation benchmark in every regime of bad clients (``python -m bench.regimes``).

Modules: study (the regimes, running them seed by seed, gathering their tables), __main__ (the command).
"""
