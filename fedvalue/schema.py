"""The ledger's contract, named once: file names, client statuses, methods and columns.

Every writer and reader of a run directory (the ledger writer, the audit, detection,
the strategies that book rounds) takes these names from here.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Hashable
from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    """A client's status in a round's rows (a ``str``: written and compared as its value)."""

    #: Valued this round (its reply made the round game).
    OK = "ok"
    #: Sampled, but no usable reply (an error, a timeout, arrays or metrics Flower's
    #: aggregation would choke on); its ``reason`` says which.
    FAILED = "failed"
    #: Replied with NaN/inf arrays: kept out of the aggregate and booked with the harm it
    #: would have done; its ``reason`` says which arrays.
    REJECTED = "rejected"
    #: Not sampled this round: booked only for what it received (TracIn inflow).
    IDLE = "idle"


STATUS_OK, STATUS_FAILED, STATUS_REJECTED, STATUS_IDLE = Status.OK, Status.FAILED, Status.REJECTED, Status.IDLE
CLIENT_STATUSES = tuple(Status)
#: Statuses of replies that carry arrays and a weight.
WEIGHED_STATUSES = (Status.OK, Status.REJECTED)
#: Statuses of clients that were sampled but not valued: their rows carry a reason.
PROBLEM_STATUSES = (STATUS_FAILED, STATUS_REJECTED)


@dataclass(frozen=True)
class ClientEntry:
    """One sampled client's outcome in a round, as its round record holds it and its rows book it.

    ``weight`` is its aggregation weight (ok and rejected replies); ``num_examples`` is what
    its valuation rows book as its example count; ``reason`` why it was not valued (failed
    and rejected clients).
    """

    client_id: Hashable
    status: str
    weight: float | None = None
    num_examples: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class ClaimEntry:
    """One reviewed claim of a round (a ``claim_capped`` or ``claim_jumped`` row): what the
    client claimed, the weight aggregated and booked instead, and its reply's status."""

    client_id: Hashable
    method: str
    claimed: float
    used: float
    status: str


#: ledger.csv, one row per (round, client, method); ``reason`` is empty unless the row's
#: status is failed or rejected.
LEDGER_COLUMNS = ("round", "client_id", "method", "value", "stderr", "num_examples", "status", "noisy", "reason")
#: rounds.csv, one row per round; ``num_unaggregatable`` counts the coalitions the inner
#: strategy returned no arrays for (valued at v_t(∅)); ``hash`` is the chain link.
ROUND_COLUMNS = (
    "round", "clients", "num_clients", "num_failed", "utility_before", "utility_after",
    "utility_realized", "num_evaluations", "valuation_seconds", "ads_method", "efficiency_gap",
    "num_unaggregatable", "hash",
)

#: The files of a run directory (records and checkpoints: :mod:`fedvalue.archive`).
LEDGER_FILE = "ledger.csv"
LEDGER_PARQUET_FILE = "ledger.parquet"
ROUNDS_FILE = "rounds.csv"
RUN_CONFIG_FILE = "run.json"
#: The first-order check of TracIn flows ([RECIP], Remark 2.5): per round and client, the
#: actual change of its inference loss against the change its flows predict.
FIRST_ORDER_FILE = "first_order.csv"
FIRST_ORDER_COLUMNS = ("round", "client_id", "loss_before", "loss_after", "actual_change", "predicted_change")

#: Ledger methods: the valuations per round, top-k selection marks, TracIn flows (and the
#: name each has in summaries); claim-review flags start with CLAIM_PREFIX.
VALUATION_METHODS = ("ads", "loo")
SELECTED = "selected"
FLOW_METHODS = {"tracin_inflow": "inflow", "tracin_outflow": "outflow", "tracin_self": "self"}
CLAIM_PREFIX = "claim_"
CLAIM_CAPPED = CLAIM_PREFIX + "capped"
CLAIM_JUMPED = CLAIM_PREFIX + "jumped"
#: Fairness books (fedvalue.fair_books): the round game valued with U = −gap (method ->
#: ledger name), each client's first-order fairness influence, the I-JACK factor.
FAIRNESS_VALUATION_METHODS = {"ads": "ads_fairness", "loo": "loo_fairness"}
FAIRNESS_INFLUENCE = "fairness_influence"
FAIR_WEIGHT = "fair_weight"
#: Fairness influence with curvature (fedvalue.fair_curvature) and its FedAvg-renormalized derivative.
FAIRNESS_INFLUENCE_CURVATURE = "fairness_influence_curvature"
FAIRNESS_WEIGHT_DERIVATIVE = "fairness_weight_derivative"


_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def client_key(client_id: Hashable) -> Hashable:
    """A client id as every reader compares it: an int, or a string holding an int's
    decimal form (as a CSV returns it), is that int; any other id is itself."""
    if isinstance(client_id, bool):
        return client_id
    if isinstance(client_id, numbers.Integral):
        return int(client_id)
    if isinstance(client_id, str) and _INTEGER_TEXT.fullmatch(client_id):
        return int(client_id)
    return client_id


def client_sort_key(client_id: Hashable) -> tuple:
    """Sort key for client ids: integer ids (:func:`client_key`) numerically, then the rest
    by their text."""
    key = client_key(client_id)
    return (0, key, "") if isinstance(key, int) else (1, 0, str(client_id))


#: The rest of a run directory's layout: commitments (:mod:`fedvalue.seals`), round records
#: and checkpoints (:mod:`fedvalue.archive`). Every name a run writes is one of these.
SEALS_FILE = "seals.jsonl"
MANIFEST_FILE = "manifest.json"
RECORDS_DIR = "records"
CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_DIR = "checkpoint"
#: What ``fedvalue report`` writes into a run directory after the run: not part of the books
#: (no manifest lists them); the audit accepts them as regular files only.
REPORT_FILE = "report.html"
FIGURES_DIR = "figures"


def record_name(server_round: int) -> str:
    """Round t's record, relative to the run directory."""
    return f"{RECORDS_DIR}/round-{int(server_round):06d}.npz"


def checkpoint_names(server_round: int) -> tuple[str, str]:
    """Round k's checkpoint files, relative to the run directory: A_k, and the server's
    state as data (:mod:`fedvalue.state_codec`)."""
    stem = f"{CHECKPOINT_DIR}/round-{int(server_round):06d}"
    return stem + ".npz", stem + "-state.npz"


_RECORD_NAME = re.compile(r"round-(\d{6})\.npz")


def record_round(name: str) -> int | None:
    """The round of a record's file name inside records/ (None unless the name is exactly
    a record's: ``round-NNNNNN.npz``)."""
    match = _RECORD_NAME.fullmatch(name)
    return int(match.group(1)) if match else None
