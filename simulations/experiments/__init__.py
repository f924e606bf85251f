"""One folder a family of simulations. An experiment may import :mod:`simulations.runner`,
:mod:`simulations.datasets` and the packages below them, never another experiment."""
