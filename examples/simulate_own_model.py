"""Your own model, data and Flower strategy through ``simulations.simulate``.

    python examples/simulate_own_model.py --out runs/own-model
    python examples/read_ledger.py runs/own-model

The model and the clients' data are in ``digits_clients.py`` (scikit-learn's digits, each
client with an inference split, which TracIn flows need). The model is a plain ``torch.nn``
MLP that does not seed itself: ``simulate`` builds it with the run's seed, so the same
``--seed`` gives the same ledger, byte for byte.
"""

from __future__ import annotations

import argparse
import functools

from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from digits_clients import digits, load_client, make_model, noisy_clients  # your model and data (examples/digits_clients.py)
from fedvalue.utilities import TorchModelUtility
from simulations import simulate
from strategies import BookSettings, PartitionSampler


class DecayingLrFedAvg(FedAvg):
    """Your own strategy: FedAvg whose clients' learning rate decays by ``decay`` each round."""

    def __init__(self, *, decay: float = 0.8, **kwargs) -> None:
        super().__init__(**kwargs)
        self.decay = decay

    def configure_train(self, server_round, arrays, config, grid):
        config = ConfigRecord({**dict(config), "lr": float(config["lr"]) * self.decay ** (server_round - 1)})
        return super().configure_train(server_round, arrays, config, grid)


def run(out: str, *, num_clients: int = 10, clients_per_round: int = 5, rounds: int = 5, local_epochs: int = 5,
        num_noisy: int = 3, seed: int = 0, **options):
    """Simulate on Ray and return the run's books (``fedvalue.ledger.Run``)."""
    _, _, x_test, y_test = digits(seed)
    loader = functools.partial(load_client, num_clients=num_clients, seed=seed, num_noisy=num_noisy)
    return simulate(
        strategy=DecayingLrFedAvg(decay=0.8),                           # the server evaluates through the utility
        model_factory=make_model,                                       # () -> torch.nn.Module
        load_client_data=loader,                                        # partition id -> ClientData
        num_clients=num_clients,
        num_rounds=rounds,
        utility=TorchModelUtility(make_model(), x_test, y_test),        # U(arrays): held-out accuracy
        sampler=PartitionSampler(clients_per_round, seed=seed),         # seeded sampling by partition id
        train_config={"lr": 0.5, "local-epochs": local_epochs, "batch-size": 32},
        seed=seed,
        books=BookSettings(flows=True,                                  # TracIn inflow / outflow too
                           noisy_clients=noisy_clients(num_clients, num_noisy, seed)),  # the "noisy" column
        out=out,
        **options,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", default="runs/own-model", help="run directory for the ledger")
    parser.add_argument("--num-clients", type=int, default=10)
    parser.add_argument("--clients-per-round", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--num-noisy", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    books = run(args.out, num_clients=args.num_clients, clients_per_round=args.clients_per_round,
                rounds=args.rounds, local_epochs=args.local_epochs, num_noisy=args.num_noisy, seed=args.seed)
    print(books.rounds[["round", "clients", "utility_before", "utility_realized"]].to_string(index=False))
    print(books.summary().to_string(float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {args.out}; read it with: python examples/read_ledger.py {args.out}")


if __name__ == "__main__":
    main()
