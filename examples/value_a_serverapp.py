"""Value the clients of your own Flower ServerApp: wrap its strategy in ``ValuingStrategy``.

    python examples/value_a_serverapp.py --out runs/serverapp
    python examples/read_ledger.py runs/serverapp

Everything but the wrapper is Flower's: a ServerApp whose main starts a strategy (here
FedAdam, a server optimizer) and a ClientApp (``clients.make_client_app`` trains a torch
model and answers the wrapper's partition-id query). The wrapper samples by partition id
(seeded), values every round's clients by within-round ADS and leave-one-out on the
server's held-out data, and writes the ledger as each round completes. Here the two apps
run on Flower's simulation engine through ``simulations.runner.run_flower_simulation``;
``simulations/experiments/noisy_clients/flower_app.py`` is a full App for ``flwr run .``.
"""

from __future__ import annotations

import argparse
import functools

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam

from clients import make_client_app
from digits_clients import digits, load_client, make_model  # your model and data (examples/digits_clients.py)
from fedvalue import AdsSettings, ValuationSettings
from fedvalue.ledger import load_run
from fedvalue.utilities import TorchModelUtility
from simulations.runner import initial_model_arrays, run_flower_simulation
from strategies import IntakeSettings, PartitionSampler, ValuingStrategy


def make_server_app(out: str, *, rounds: int, clients_per_round: int, seed: int) -> ServerApp:
    """A ServerApp running FedAdam for ``rounds`` rounds, its clients valued into ``out``."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        _, _, x_test, y_test = digits(seed)
        strategy = ValuingStrategy(
            FedAdam(eta=0.05),                                        # any Flower strategy
            TorchModelUtility(make_model(), x_test, y_test),          # U(arrays) on held-out data
            run_dir=out,
            sampler=PartitionSampler(clients_per_round, seed=seed),   # seeded sampling by partition id
            seed=seed,                                                 # MC permutations, if any
            valuation=ValuationSettings(("ads", "loo"), AdsSettings(method="auto")),  # the defaults, shown
            intake=IntakeSettings(federated_evaluation=False),         # U is the evaluation: no client rounds
        )
        strategy.start(grid, initial_model_arrays(make_model, seed), num_rounds=rounds,
                       train_config=ConfigRecord({"lr": 0.5, "local-epochs": 5, "batch-size": 32, "seed": seed}))

    return server_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", default="runs/serverapp", help="run directory for the ledger")
    parser.add_argument("--num-clients", type=int, default=10)
    parser.add_argument("--clients-per-round", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    client_app = make_client_app(functools.partial(load_client, num_clients=args.num_clients, seed=args.seed),
                                 make_model)
    server_app = make_server_app(args.out, rounds=args.rounds, clients_per_round=args.clients_per_round,
                                 seed=args.seed)
    run_flower_simulation(server_app, client_app, num_supernodes=args.num_clients)
    books = load_run(args.out)
    print(books.summary().to_string(float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {args.out}; read it with: python examples/read_ledger.py {args.out}")


if __name__ == "__main__":
    main()
