"""The noisy-federation benchmark's settings for the tests.

``PLAIN``: the tiniest benchmark (8 clients, 4 a round, 3 rounds, label flips at p = 1.0) with every
policy; mini-batches of 128, not 32: a quarter of the SGD steps of each client's epoch and of the
audit's retraining. ``TINY``: the same policies on a mixed federation of 12 clients (3 stale replayers,
3 noisy updates, a maverick; 6 honest, enough for the oracle's 4 a round), the one real benchmark run of
the default suite (``test_noisy_federation.py``)."""

from __future__ import annotations

import dataclasses

from simulations.experiments.noisy_federation.config import (
                              POLICY_NAMES,
                              NoisyFederationConfig,
)

PLAIN = NoisyFederationConfig(num_clients=8, clients_per_round=4, rounds=3, final_window=2, topk=2, poc_candidates=6,
                              krum_malicious=0, valuation_budget=16, validation_examples=200, test_examples=300,
                              flip_probabilities=(1.0,), hidden=(16,), batch_size=128, policies=tuple(POLICY_NAMES))
TINY = dataclasses.replace(PLAIN, bad_kind="stale-replayer", noisy_fraction=0.25, extra_bad_kind="noisy-update",
                           extra_bad_fraction=0.25, mavericks=1, num_clients=12)
