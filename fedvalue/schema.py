"""The ledger's contract, named once: file names, client statuses, methods and columns.

Every writer and reader of a run directory (the ledger writer, the audit, detection,
the strategies that book rounds) takes these names from here.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields, replace
from enum import StrEnum


#: The reply metric that holds a client's example count: the default aggregation weight of Flower's
#: FedAvg family (the wire's and the round record's name for it).
NUM_EXAMPLES_KEY = "num-examples"

class Status(StrEnum):
    """A client's status in a round's rows (a ``str``: written, compared and shown as its value)."""

    __repr__ = str.__repr__  # messages list statuses as the text a user writes

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


CLIENT_STATUSES = tuple(Status)
#: Statuses of replies that carry arrays and a weight.
WEIGHED_STATUSES = (Status.OK, Status.REJECTED)
#: Statuses of clients that were sampled but not valued: their rows carry a reason.
PROBLEM_STATUSES = (Status.FAILED, Status.REJECTED)


@dataclass(frozen=True)
class ClientEntry:
    """One sampled client's outcome in a round, as its round record holds it and its rows book it.

    ``weight`` is its aggregation weight (ok and rejected replies); ``num_examples`` is what
    its valuation rows book as its example count; ``reason`` why it was not valued (failed
    and rejected clients; None when none was given: an empty text is taken as none).
    """

    client_id: Hashable
    status: Status | str
    weight: float | None = None
    num_examples: int | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.reason == "":
            object.__setattr__(self, "reason", None)


@dataclass(frozen=True)
class ClaimEntry:
    """One reviewed claim of a round (a ``claim_capped`` or ``claim_jumped`` row): what the
    client claimed, the weight aggregated and booked instead, and its reply's status."""

    client_id: Hashable
    method: Method | str
    claimed: float
    used: float
    status: Status | str


#: The files of a run directory (records and checkpoints: :mod:`fedvalue.run.archive`).
LEDGER_FILE = "ledger.csv"
LEDGER_PARQUET_FILE = "ledger.parquet"
ROUNDS_FILE = "rounds.csv"
RUN_CONFIG_FILE = "run.json"
#: The first-order check of TracIn flows ([RECIP], Remark 2.5): per round and client, the
#: actual change of its inference loss against the change its flows predict.
FIRST_ORDER_FILE = "first_order.csv"
FIRST_ORDER_COLUMNS = ("round", "client_id", "loss_before", "loss_after", "actual_change", "predicted_change")

class Method(StrEnum):
    """A ledger row's ``method`` (a ``str``: written and compared as its value). A plug-in
    book (:mod:`fedvalue.rounds.book_kind`) may book methods of its own; these are the core's."""

    __repr__ = str.__repr__  # messages list methods as the text a user writes

    #: The round game's values ([ADS] Remark 4.1, Eq. 10) and leave-one-out.
    ADS = "ads"
    LOO = "loo"
    #: Top-k marks: 1 when the client was aggregated, 0 when not.
    SELECTED = "selected"
    #: TracIn flows ([RECIP] §4): what a client received, gave and did to itself.
    TRACIN_INFLOW = "tracin_inflow"
    TRACIN_OUTFLOW = "tracin_outflow"
    TRACIN_SELF = "tracin_self"
    #: Fairness books (fedvalue.rounds.fairness_round): the round game valued with U = −gap, each
    #: client's first-order fairness influence, the I-JACK factor.
    ADS_FAIRNESS = "ads_fairness"
    LOO_FAIRNESS = "loo_fairness"
    FAIRNESS_INFLUENCE = "fairness_influence"
    FAIR_WEIGHT = "fair_weight"
    #: Fairness influence with curvature (fedvalue.scoring.fairness.curvature) and its FedAvg-renormalized derivative.
    FAIRNESS_INFLUENCE_CURVATURE = "fairness_influence_curvature"
    FAIRNESS_WEIGHT_DERIVATIVE = "fairness_weight_derivative"
    #: Value-weighted aggregation (fedvalue.rounds.kinds.value_weights): the factor w_i on FedAvg's weight.
    VALUE_WEIGHT = "value_weight"
    #: The Shapley value of the fixed-weight round game's second-order expansion, booked beside ADS
    #: (fedvalue.rounds.kinds.fixed_second_order): u_k·(g + ½ H U).
    ADS_FIXED_SECOND_ORDER = "ads_fixed_second_order"
    #: Its defended form, booked with the defences (fedvalue.rounds.defences.second_order): free-riders 0, a
    #: near-duplicate cluster paid as one claim.
    ADS_FIXED_SECOND_ORDER_DEFENDED = "ads_fixed_second_order_defended"
    #: Claim-review flags: a claimed weight lowered by a cap, a claim that jumped.
    CLAIM_CAPPED = "claim_capped"
    CLAIM_JUMPED = "claim_jumped"


#: Ledger methods: the valuations per round, top-k selection marks, TracIn flows (and the
#: name each has in summaries); claim-review flags start with CLAIM_PREFIX.
VALUATION_METHODS = (Method.ADS, Method.LOO)
FLOW_METHODS = {Method.TRACIN_INFLOW: "inflow", Method.TRACIN_OUTFLOW: "outflow", Method.TRACIN_SELF: "self"}
CLAIM_PREFIX = "claim_"
#: Fairness books (fedvalue.rounds.fairness_round): valuation method -> its ledger name on the
#: fairness game, the influence, the I-JACK factor; with curvature, its influence and derivative.
FAIRNESS_VALUATION_METHODS = {Method.ADS: Method.ADS_FAIRNESS, Method.LOO: Method.LOO_FAIRNESS}


def _missing(value: object) -> bool:
    """True for what a ledger cell holds as nothing: None, NaN, pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pd.NA (whose comparison is NA, not a bool)
    except TypeError:
        return True


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One row of ledger.csv: a client's booking under one method in one round.

    Every book builds its rows as these (:meth:`fedvalue.rounds.book_kind.RoundContext.row`), with
    ``noisy`` None, and :meth:`fedvalue.run.ledger_tables.LedgerWriter.write_round` writes them,
    joining the run's noisy clients (:func:`with_ground_truth`); its fields are
    :data:`LEDGER_COLUMNS`, in order. Nothing is spelled by a stand-in: a value, standard
    error, example count, noisy flag or reason that is not known is None (written as an
    empty cell), never NaN, zero or an empty string; ``status`` is a :class:`Status`.
    """

    round: int
    client_id: Hashable
    method: str
    value: float | None
    stderr: float | None
    num_examples: int | None
    status: Status
    noisy: bool | None = None
    #: Why a failed or rejected client was not valued (None otherwise).
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.status not in CLIENT_STATUSES:
            raise ValueError(f"status: expected one of {[str(s) for s in CLIENT_STATUSES]}; got {self.status!r}.")
        object.__setattr__(self, "status", Status(self.status))
        for name in ("value", "stderr", "num_examples", "noisy"):
            if _missing(getattr(self, name)):
                object.__setattr__(self, name, None)
        if self.reason is not None and (_missing(self.reason) or self.reason == ""):
            object.__setattr__(self, "reason", None)

    @classmethod
    def from_mapping(cls, row: Mapping[str, object]) -> LedgerRow:
        """A row given as a mapping of the ledger's columns (``noisy`` and ``reason`` may be
        left out); ValueError naming a missing or unknown column."""
        if isinstance(row, LedgerRow):
            return row
        unknown = [str(k) for k in row if k not in LEDGER_COLUMNS]
        missing = [c for c in LEDGER_COLUMNS[:-2] if c not in row]
        if unknown or missing:
            raise ValueError(f"ledger row: expected the columns {list(LEDGER_COLUMNS)} (noisy and reason optional); "
                             f"got {'unknown ' + str(unknown) if unknown else ''}"
                             f"{' and ' if unknown and missing else ''}{'no ' + str(missing) if missing else ''}.")
        return cls(**row)

    def as_dict(self) -> dict[str, object]:
        """The row as a mapping of the ledger's columns, in order."""
        return {name: getattr(self, name) for name in LEDGER_COLUMNS}


#: ledger.csv, one row per (round, client, method): :class:`LedgerRow`'s fields, in order;
#: ``reason`` is empty unless the row's status is failed or rejected.
LEDGER_COLUMNS = tuple(f.name for f in fields(LedgerRow))


def with_ground_truth(rows: Iterable[LedgerRow], noisy_clients: Collection[Hashable] | None) -> list[LedgerRow]:
    """The rows with the run's ground truth joined: each row's ``noisy`` cell says whether its
    client is one of the run's noisy clients. With none known (None) the rows are kept as
    they are. Only the writer applies it (:class:`fedvalue.run.ledger_tables.LedgerWriter`):
    a round's books never know which clients a simulation made noisy."""
    if noisy_clients is None:
        return list(rows)
    return [replace(row, noisy=row.client_id in noisy_clients) for row in rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRow:
    """One row of rounds.csv without its ``hash`` (the chain link the writer adds): what a round
    booked as a whole.

    :func:`fedvalue.rounds.booking.book_round` builds it, :meth:`fedvalue.run.ledger_tables.LedgerWriter.write_round`
    writes it and :func:`fedvalue.run.ledger_reader.round_rows_of` reads it back; its fields are
    :data:`ROUND_COLUMNS` but the last, in order. Counts are ints; a utility or gap that is not a
    number (a diverged model's loss) or not known is None (written as an empty cell), as is
    ``num_unaggregatable`` when the round was aggregated by the weighted mean without counting.
    The defaults are what a round that valued nothing books.
    """

    round: int
    #: The sampled clients' ids in reply order, space-separated, as rounds.csv holds them.
    clients: str
    num_clients: int
    num_failed: int
    #: v_t(∅) = U(A_{t−1}).
    utility_before: float | None
    #: v_t(I_t) (None when no client replied usably).
    utility_after: float | None = None
    #: U(A_t), the state the run moved to.
    utility_realized: float | None
    num_evaluations: int = 0
    valuation_seconds: float = 0.0
    ads_method: str | None = None
    #: Σφ_t − (v_t(I_t) − v_t(∅)) ([ADS] Prop. 4.2).
    efficiency_gap: float | None = None
    #: Coalitions the inner strategy returned no arrays for (valued at v_t(∅)).
    num_unaggregatable: int | None = None

    def __post_init__(self) -> None:
        for name, whole, optional in _ROUND_NUMBERS:
            object.__setattr__(self, name, _round_number(name, getattr(self, name), whole, optional))
        if not isinstance(self.clients, str):
            raise ValueError(f"round row: clients: expected the clients' ids as rounds.csv writes them (text, "
                             f"space-separated); got {type(self.clients).__name__} {self.clients!r:.80}.")
        method = None if _missing(self.ads_method) or self.ads_method == "" else self.ads_method
        if method is not None and not isinstance(method, str):
            raise ValueError(f"round row: ads_method: expected the estimator's name (text) or None; got {method!r:.80}.")
        object.__setattr__(self, "ads_method", method)

    @classmethod
    def from_mapping(cls, row: Mapping[str, object]) -> RoundRow:
        """A row given as a mapping of rounds.csv's columns (a ``hash`` is left out: the writer
        chains each row itself; columns with a default may be left out); ValueError naming a
        missing or unknown column."""
        if isinstance(row, RoundRow):
            return row
        unknown = [str(k) for k in row if k not in ROUND_COLUMNS]
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in row]
        if unknown or missing:
            raise ValueError(f"round row: expected the columns {list(ROUND_COLUMNS)} (round to utility_before and "
                             f"utility_realized required, the rest optional, hash ignored); got "
                             f"{'unknown ' + str(unknown) if unknown else ''}"
                             f"{' and ' if unknown and missing else ''}{'no ' + str(missing) if missing else ''}.")
        return cls(**{k: v for k, v in row.items() if k != "hash"})

    def as_dict(self) -> dict[str, object]:
        """The row as a mapping of rounds.csv's columns but ``hash``, in order."""
        return {name: getattr(self, name) for name in ROUND_COLUMNS[:-1]}

    def __getitem__(self, column: str) -> object:
        """A cell by its column name (``row["round"]``), as the rows were read when they were
        dicts (a round's ``on_round`` callback); new code reads the attributes."""
        if column not in ROUND_COLUMNS[:-1]:
            raise KeyError(column)
        return getattr(self, column)


#: (field, whole number, may be None) of each number a round row holds.
_ROUND_NUMBERS = (
    ("round", True, False), ("num_clients", True, False), ("num_failed", True, False),
    ("utility_before", False, True), ("utility_after", False, True), ("utility_realized", False, True),
    ("num_evaluations", True, False), ("valuation_seconds", False, False), ("efficiency_gap", False, True),
    ("num_unaggregatable", True, True),
)


def _round_number(name: str, value: object, whole: bool, optional: bool) -> int | float | None:
    """A round row's number as its field holds it; ValueError naming the field otherwise."""
    kind = "whole number" if whole else "number"
    if _missing(value):
        if optional:
            return None
        raise ValueError(f"round row: {name}: expected a {kind}; got {value!r}.")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"round row: {name}: expected a {kind}; got {type(value).__name__} {value!r:.80}.")
    if not whole:
        return float(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise ValueError(f"round row: {name}: expected a {kind}; got {value!r}.")


#: rounds.csv, one row per round: :class:`RoundRow`'s fields, in order, then ``hash``, the
#: chain link.
ROUND_COLUMNS = (*(f.name for f in fields(RoundRow)), "hash")


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


#: The rest of a run directory's layout: commitments (:mod:`fedvalue.run.seals`), round records
#: and checkpoints (:mod:`fedvalue.run.archive`). Every name a run writes is one of these.
SEALS_FILE = "seals.jsonl"
MANIFEST_FILE = "manifest.json"
#: The run's signature in the OpenSSF Model Signing format (model-signing's default name),
#: written after the manifest with an EC key (:mod:`fedvalue.run.model_signature`).
MODEL_SIGNATURE_FILE = "model.sig"
RECORDS_DIR = "records"
CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_DIR = "checkpoint"
#: What ``fedvalue report`` writes into a run directory after the run: not part of the books
#: (no manifest lists them); the audit accepts them as regular files only.
REPORT_FILE = "report.html"
FIGURES_DIR = "figures"
#: The lock a writing process holds on its run directory (:mod:`fedvalue.run.writer_lock`):
#: not part of the books (no manifest lists it); it holds the writer's PID.
LOCK_FILE = "writer.lock"
#: What ``fedvalue report --payout`` writes: each client's payment from the books.
PAYOUT_FILE = "payout.csv"


def record_name(server_round: int) -> str:
    """Round t's record, relative to the run directory."""
    return f"{RECORDS_DIR}/round-{int(server_round):06d}.npz"


def checkpoint_names(server_round: int) -> tuple[str, str]:
    """Round k's checkpoint files, relative to the run directory: A_k, and the server's
    state as data (:mod:`fedvalue.run.state_codec`)."""
    stem = f"{CHECKPOINT_DIR}/round-{int(server_round):06d}"
    return stem + ".npz", stem + "-state.npz"


_RECORD_NAME = re.compile(r"round-(\d{6})\.npz")


def record_round(name: str) -> int | None:
    """The round of a record's file name inside records/ (None unless the name is exactly
    a record's: ``round-NNNNNN.npz``)."""
    match = _RECORD_NAME.fullmatch(name)
    return int(match.group(1)) if match else None
