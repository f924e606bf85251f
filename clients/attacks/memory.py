"""What an attacking client remembers between rounds: the round it is in and the global models
it received before.

A simulated client is rebuilt for every message (its data and behaviour are loaded afresh in
the Ray worker), so memory lives where Flower keeps a node's own state across rounds,
``context.state``. A behaviour that needs it subclasses :class:`RoundAware`; before it trains,
:func:`prepare_round` hands it the round number and the last ``history_length`` global models
(newest first) of the same run (the ``data-key`` of the train config names the run, so several
runs served by one engine do not mix), and stores the model just received. Honest behaviours are
not RoundAware: nothing is read or stored for them.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from clients.behaviours import ClientBehaviour

#: Prefix of the state records that hold received global models: ``PREFIX|run key|round``.
PREFIX = "fedvalue-received-global"


class RoundAware(ClientBehaviour):
    """A behaviour told the round and the global models it received before (module docstring).

    Attributes
    ----------
    history_length
        How many past global models it keeps (subclasses set it).
    server_round
        The current round (0 before :func:`prepare_round`).
    past_globals
        The global models received in earlier rounds of the run, newest first.
    """

    history_length: int = 1

    def begin_round(self, server_round: int, past_globals: list[dict[str, np.ndarray]]) -> None:
        self.server_round = int(server_round)
        self.past_globals = past_globals

    @property
    def previous_global(self) -> dict[str, np.ndarray] | None:
        """A_{t−2}, the global model of the round before (None when it received none)."""
        past = getattr(self, "past_globals", [])
        return past[0] if past else None


def _records(state: RecordDict, run_key: str) -> dict[int, str]:
    """Round -> state record name of the models this run's client received."""
    found = {}
    for name in list(state.array_records):
        prefix, _, rest = name.partition("|")
        key, _, round_text = rest.rpartition("|")
        if prefix == PREFIX and key == run_key and round_text.isdigit():
            found[int(round_text)] = name
    return found


def prepare_round(behaviour: ClientBehaviour, state: RecordDict, run_key: str | None, server_round: int,
                  global_arrays: dict[str, np.ndarray]) -> None:
    """Tell a :class:`RoundAware` behaviour its round and past global models, then remember this one."""
    if not isinstance(behaviour, RoundAware):
        return
    run_key = "" if run_key is None else str(run_key)
    held = _records(state, run_key)
    earlier = sorted((t for t in held if t < server_round), reverse=True)[: behaviour.history_length]
    behaviour.begin_round(server_round, [{k: a.numpy() for k, a in state[held[t]].items()} for t in earlier])
    received = ArrayRecord({k: Array(np.asarray(v)) for k, v in global_arrays.items()})
    state[f"{PREFIX}|{run_key}|{server_round}"] = received
    for t in held:  # keep only what the next round can ask for
        if t < server_round and t not in earlier[: max(behaviour.history_length - 1, 0)]:
            del state[held[t]]
