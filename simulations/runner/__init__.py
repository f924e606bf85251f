"""What every experiment runs on: :func:`~simulations.runner.api.simulate` (:mod:`.api`) and the
run directory (:mod:`.out_dir`), the Flower engine on Ray (:mod:`.engine`; its settings, :mod:`.engine_settings`;
the grid a ServerApp is handed, :mod:`.grid`), the inner strategies of
``--strategy`` (:mod:`.inner_strategies`), parallel valuation (:mod:`.parallel`), the valuation budget
(:mod:`.budget`), progress and console output, config checks, the results files a docs table is rendered
from (:mod:`.results_files`), and the :class:`~simulations.runner.simulation.Simulation` record. Imports no
experiment and no CLI.

This package is the experiments' face of the runner: an experiment imports from here, never
from its modules."""

from fedvalue._checks import check_choice, check_integer, check_number, check_open_unit, check_unit_interval
from fedvalue.run.run_info import read_run_config, write_json
from simulations.runner.api import (
    check_some_client_valued,
    initial_model_arrays,
    package_versions,
    seeded_server_generators,
    simulate,
)
from simulations.runner.budget import check_budget, parse_budget
from simulations.runner.config_checks import (
    DIFFERENTIABLE_UTILITY,
    check_devices,
    check_integers,
    check_numbers,
    clients_device,
    fixed_second_order_asked,
    saved_config,
)
from simulations.runner.console import print_federated_run, progress_bar, round_progress
from simulations.runner.engine import run_flower_simulation, serve, torch_threads
from simulations.runner.engine_settings import (
    EngineSettings,
    check_engine_keys,
    check_ray_address,
    default_max_parallel_clients,
    flat_fields,
    flat_settings,
    nest_settings,
)
from simulations.runner.grid import replies_in_send_order
from simulations.runner.inner_strategies import (
    STRATEGY_PARAMETERS,
    build_strategy,
    check_strategy,
    client_mods,
    fedavg_without_evaluation,
    skipped_evaluation_unannounced,
)
from simulations.runner.parallel import RayParallelUtility, valuation_workers_advice
from simulations.runner.progress import ValuationProgress
from simulations.runner.results_files import read_results, results_command, results_header, write_results
from simulations.runner.out_dir import prepare_run_dir, write_run_config
from simulations.runner.simulation import Simulation

__all__ = [
    "build_strategy",
    "check_budget",
    "check_choice",
    "check_devices",
    "check_integer",
    "check_integers",
    "check_engine_keys",
    "check_number",
    "check_numbers",
    "check_open_unit",
    "check_ray_address",
    "check_some_client_valued",
    "check_strategy",
    "check_unit_interval",
    "client_mods",
    "clients_device",
    "default_max_parallel_clients",
    "DIFFERENTIABLE_UTILITY",
    "EngineSettings",
    "fedavg_without_evaluation",
    "fixed_second_order_asked",
    "flat_fields",
    "flat_settings",
    "initial_model_arrays",
    "nest_settings",
    "package_versions",
    "parse_budget",
    "prepare_run_dir",
    "print_federated_run",
    "progress_bar",
    "RayParallelUtility",
    "read_results",
    "results_command",
    "results_header",
    "valuation_workers_advice",
    "replies_in_send_order",
    "round_progress",
    "run_flower_simulation",
    "saved_config",
    "seeded_server_generators",
    "serve",
    "simulate",
    "skipped_evaluation_unannounced",
    "Simulation",
    "STRATEGY_PARAMETERS",
    "torch_threads",
    "ValuationProgress",
    "write_results",
    "write_run_config",
    "read_run_config",
    "write_json",
]
