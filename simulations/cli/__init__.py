"""The ``fedvalue`` command line: one module a sub-command (:mod:`.run`, :mod:`.report`, :mod:`.audit`,
:mod:`.keygen`), the options they share (:mod:`.options`) and the registry of simulations
(:mod:`.registry`), the only importer of :mod:`simulations.experiments`. Entry point:
:func:`simulations.cli.main.main` (also ``python -m simulations.cli``)."""
