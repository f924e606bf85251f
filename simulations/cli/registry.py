"""Every simulation of ``fedvalue run``, one line each; the command line loops over them.

Adding a simulation is one module (a config dataclass whose fields are its options, a
``cli_main(config, options) -> exit code`` and a :class:`~simulations.runner.simulation.Simulation`
record named ``SIMULATION``) and one line here. This is the only importer of ``experiments/``.
"""

from __future__ import annotations

from simulations.experiments.attacks import attacks
from simulations.experiments.fairness import adult_ij as fairness_adult
from simulations.experiments.fairness import central as fairness_central
from simulations.experiments.fairness import federated as fairness
from simulations.experiments.noisy_clients import noisy_clients, study
from simulations.experiments.noisy_federation import noisy_federation
from simulations.experiments.procurement import procurement
from simulations.experiments.reciprocity import centralized as reciprocity
from simulations.experiments.reciprocity import federated as federated_reciprocity
from simulations.experiments.synthetic_data import augmentation, replication_market
from simulations.runner.simulation import Simulation

SIMULATIONS: dict[str, Simulation] = {simulation.name: simulation for simulation in (
    noisy_clients.SIMULATION,
    study.SIMULATION,
    noisy_federation.SIMULATION,
    reciprocity.SIMULATION,
    federated_reciprocity.SIMULATION,
    attacks.SIMULATION,
    procurement.SIMULATION,
    augmentation.SIMULATION,
    replication_market.SIMULATION,
    fairness.SIMULATION,
    fairness_central.SIMULATION,
    fairness_adult.SIMULATION,
)}
