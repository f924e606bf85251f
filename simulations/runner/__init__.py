"""What every experiment runs on: :func:`~simulations.runner.api.simulate` and the run directory
(:mod:`.api`), the Flower engine on Ray (:mod:`.engine`), the inner strategies of ``--strategy``
(:mod:`.inner_strategies`), parallel valuation (:mod:`.parallel`), the valuation budget
(:mod:`.budget`), progress and console output, config checks, and the
:class:`~simulations.runner.simulation.Simulation` record. Imports no experiment and no CLI."""
