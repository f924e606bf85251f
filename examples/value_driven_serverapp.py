"""Act on the books in your own ServerApp: train whom the values say helps, weigh what they send.

    python examples/value_driven_serverapp.py --out runs/value-driven
    python examples/value_driven_serverapp.py --policy value-guard --out runs/value-guard

The noisy-federation benchmark's value-driven policies (docs/reproductions.md) in a few lines: the
wrapper values each round's clients by within-round ADS on the server's held-out data.

- ``value-ucb``: a ``ValueEliminationSampler`` trains the clients with the largest upper confidence
  bounds on their accumulated values, never those the values have ruled out, and ``ValueWeighting``
  aggregates FedAvg's weights times each reply's positive value (replies that did not help the round
  are left out); values by MC-ADS with a budget of 100 coalition evaluations a round.
- ``value-guard``, built to do no harm: the same rule on all but a fifth of each round's slots, those
  drawn uniformly among every client (ruled out or not); a client is ruled out only after 2 valued
  rounds; replies are down-weighted by exp(r_i) (softmax, τ = 1) rather than dropped; values are the
  fixed-weight round game's second-order expansion (a client that returns the model it got is worth
  exactly 0; no coalition evaluated).

Everything else is Flower's: a ServerApp whose main
starts the strategy, and a ClientApp (``clients.make_client_app``). Some clients here train on
noisy labels (examples/digits_clients.py); the script prints which clients the sampler has ruled
out after each round.
"""

from __future__ import annotations

import argparse
import functools

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from clients import make_client_app
from digits_clients import digits, load_client, make_model, noisy_clients  # your model and data
from fedvalue import AdsSettings, ValuationSettings
from fedvalue.ledger import load_run
from fedvalue.utilities import TorchModelUtility
from simulations.runner import initial_model_arrays, run_flower_simulation
from strategies import IntakeSettings, ValueEliminationSampler, ValueWeighting, ValuingStrategy


def policy_parts(policy: str, clients_per_round: int, seed: int):
    """(sampler, acceptance, valuation) of ``policy``: ``"value-ucb"`` or ``"value-guard"`` (module docstring)."""
    if policy == "value-guard":
        sampler = ValueEliminationSampler(clients_per_round, confidence=0.5, selection="ucb", min_rounds=2,
                                          explore=0.2, seed=seed)                 # a fifth of the slots explore
        acceptance = ValueWeighting("ads", kind="softmax", temperature=1.0)        # n_i × exp(r_i), normalized
        valuation = ValuationSettings(("ads",), AdsSettings(method="second-order"), coalition_rule="fixed-weight")
        return sampler, acceptance, valuation
    sampler = ValueEliminationSampler(clients_per_round, confidence=0.5, selection="ucb", seed=seed)
    return sampler, ValueWeighting("ads"), ValuationSettings(("ads",), AdsSettings(method="mc", budget=100))


def make_server_app(out: str, *, rounds: int, clients_per_round: int, seed: int, ruled_out: list,
                    policy: str = "value-ucb") -> ServerApp:
    """A ServerApp training FedAvg for ``rounds`` rounds with the value-driven ``policy``; the clients the
    sampler has ruled out after each round are appended to ``ruled_out``."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        _, _, x_held_out, y_held_out = digits(seed)
        sampler, acceptance, valuation = policy_parts(policy, clients_per_round, seed)
        strategy = ValuingStrategy(
            FedAvg(),                                                                    # any FedAvg-family strategy
            TorchModelUtility(make_model(), x_held_out, y_held_out, metric="neg_loss"),  # U on held-out data
            run_dir=out,
            sampler=sampler,
            acceptance=acceptance,
            seed=seed,
            valuation=valuation,
            intake=IntakeSettings(federated_evaluation=False),                           # U is the evaluation
        )
        strategy.on_round = lambda row: ruled_out.append(sorted(sampler.flagged))
        strategy.start(grid, initial_model_arrays(make_model, seed), num_rounds=rounds,
                       train_config=ConfigRecord({"lr": 0.5, "local-epochs": 5, "batch-size": 32, "seed": seed}))

    return server_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", default="runs/value-driven", help="run directory for the ledger")
    parser.add_argument("--policy", choices=("value-ucb", "value-guard"), default="value-ucb")
    parser.add_argument("--num-clients", type=int, default=10)
    parser.add_argument("--num-noisy", type=int, default=4)
    parser.add_argument("--clients-per-round", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    client_app = make_client_app(functools.partial(load_client, num_clients=args.num_clients, seed=args.seed,
                                                   num_noisy=args.num_noisy), make_model)
    ruled_out: list = []
    server_app = make_server_app(args.out, rounds=args.rounds, clients_per_round=args.clients_per_round,
                                 seed=args.seed, ruled_out=ruled_out, policy=args.policy)
    run_flower_simulation(server_app, client_app, num_supernodes=args.num_clients)
    noisy = sorted(noisy_clients(args.num_clients, args.num_noisy, args.seed))
    books = load_run(args.out)
    for row, out in zip(books.rounds.itertuples(), ruled_out):
        print(f"round {row.round}: trained {row.clients}; ruled out {out}")
    print(f"noisy clients {noisy}; held-out utility {books.rounds['utility_before'].iloc[0]:.4f} -> "
          f"{books.rounds['utility_realized'].iloc[-1]:.4f}")
    print(f"wrote {args.out}; read it with: python examples/read_ledger.py {args.out}")


if __name__ == "__main__":
    main()
