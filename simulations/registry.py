"""Every simulation of ``fedvalue run``, one record each; the command line loops over them.

Adding a simulation is one module (a config dataclass whose fields are its options, and a
``cli_main(config, options) -> exit code``) and one line in :data:`SIMULATIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simulations import (
    attacks,
    augmentation,
    fairness,
    fairness_central,
    federated_reciprocity,
    noisy_clients,
    procurement,
    reciprocity,
    replication_market,
    study,
)
from simulations.console import RunOptions


@dataclass(frozen=True)
class Simulation:
    """One simulation of the command line.

    Attributes
    ----------
    config
        Its configuration dataclass: each field is a ``--option`` (tuples comma-separated).
    main
        Runs it with a config and the :class:`~simulations.console.RunOptions`; prints; returns
        the exit code.
    out_optional
        ``--out`` may be left out (the tables are then only printed).
    resumable
        ``--resume DIR`` continues a run from its last committed round.
    utility_from_run
        Rebuilds the utility a run was valued with from its run.json, for the audit's
        recomputation (None: the audit cannot rebuild it).
    audit_from_run
        Rebuilds from a run.json what the audit checks a run against (the keywords
        ``utility``, ``noisy_clients``, ``sampled``, ``fairness`` of :func:`fedvalue.audit.verdict.audit_run`);
        takes precedence over ``utility_from_run``.
    replay_check
        For runs that save no states to recompute from: replays the run from its run.json and
        returns the audit's (checks, problems).
    help
        Help text of options this simulation alone has.
    """

    config: type
    main: Callable[[Any, RunOptions], int]
    out_optional: bool = False
    resumable: bool = False
    utility_from_run: Callable[[dict], Any] | None = None
    audit_from_run: Callable[[dict], dict] | None = None
    replay_check: Callable[[str], tuple[list[str], list[str]]] | None = None
    help: Mapping[str, str] = field(default_factory=dict)


SIMULATIONS: dict[str, Simulation] = {
    "noisy-clients": Simulation(noisy_clients.NoisyClientsConfig, noisy_clients.cli_main, resumable=True,
                                utility_from_run=noisy_clients.utility_from_run,
                                audit_from_run=noisy_clients.audit_from_run),
    "noisy-clients-study": Simulation(study.NoisyClientsStudyConfig, study.cli_main, help=study.HELP),
    "reciprocity": Simulation(reciprocity.ReciprocityConfig, reciprocity.cli_main, out_optional=True,
                              help=reciprocity.RECIPROCITY_HELP),
    "reciprocity-federated": Simulation(federated_reciprocity.FederatedReciprocityConfig,
                                        federated_reciprocity.cli_main, resumable=True,
                                        utility_from_run=federated_reciprocity.utility_from_run),
    "attacks": Simulation(attacks.AttacksConfig, attacks.cli_main, out_optional=True),
    "procurement": Simulation(procurement.ProcurementConfig, procurement.cli_main,
                              replay_check=procurement.replay_check, help=procurement.PROCUREMENT_HELP),
    "augmentation": Simulation(augmentation.AugmentationConfig, augmentation.cli_main,
                               help=augmentation.AUGMENTATION_HELP),
    "replication-market": Simulation(replication_market.ReplicationMarketConfig, replication_market.cli_main),
    "fairness": Simulation(fairness.FairnessConfig, fairness.cli_main, utility_from_run=fairness.utility_from_run,
                           audit_from_run=fairness.audit_from_run, help=fairness.HELP),
    "fairness-central": Simulation(fairness_central.FairnessCentralConfig, fairness_central.cli_main,
                                   out_optional=True, help=fairness_central.HELP),
}
