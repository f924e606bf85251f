"""The run layer's settings: how a valued run keeps its directory (:class:`RunSettings`), and what
a round record notes of the run that wrote it (:class:`RoundSettings`): the settings its books were computed
under (methods, ADS estimator, seed), how the round was aggregated and what it books beside
the valuation (flows, selection marks, fairness, value weights, defences, the fixed-weight game's
second-order expansion).

One typed object from the strategy that writes it to every reader (the books' plug-ins, the
replay, the audit); the record's archive holds it as one JSON object (:meth:`RoundSettings.as_json`),
read back by :meth:`RoundSettings.from_json`, which treats it as untrusted: a wrong key or value
is a ValueError naming the field. The defences' and the rules' settings stay JSON objects here
because their types live in the layers above (:class:`fedvalue.rounds.defences.settings.DefenceSettings`
parses ``defences``, :class:`fedvalue.flows.projected_flows.FlowsProjection` ``flows_projection``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedvalue._checks import check_choice
from fedvalue.run.seals import Signer
from fedvalue.schema import NUM_EXAMPLES_KEY
from fedvalue.valuation.settings import COALITION_RULES, RENORMALIZED, AdsSettings

#: The estimator of MC's standard errors (``AdsSettings.stderr_estimator``) of a round record that does
#: not name one: records were written so before it was a setting, and a record of it still leaves it out
#: (an earlier record reads and writes back byte for byte).
LEGACY_STDERR_ESTIMATOR = "plain"

#: ``aggregation`` of a round the weighted mean aggregated (the FedAvg family) and of one the
#: inner strategy's own code aggregated (replayed by the audit).
WEIGHTED_MEAN, BY_STRATEGY = "weighted-mean", "strategy"


@dataclass(frozen=True)
class RunSettings:
    """How a valued run keeps its directory, checked once when made.

    Parameters
    ----------
    run_config
        The run's configuration, written to ``run.json`` (resuming: compared with it).
    save_records
        Save each round's record (A_{t−1}, every reply's arrays and weight, gradients) before
        the round commits, so ``fedvalue audit`` can recompute every value.
    checkpoint
        After each round commits, save A_t and the server's state as data so the run can
        resume (a strategy holding state that is not data is refused when the books open).
    resume
        Continue the run from its last checkpoint, verified before anything is cut.
    sign_key
        The :class:`fedvalue.run.seals.Signer` of each round's seal, the final manifest and,
        with an EC key, the closed run's ``model.sig`` (:mod:`fedvalue.run.model_signature`)
        (``Signer.from_file(pem)`` reads a key from ``fedvalue keygen``); settings read no file.

    What the run tells its caller as it goes is a callback, not a setting
    (:class:`strategies.valuing_settings.RunCallbacks`).
    """

    run_config: Mapping | None = None
    save_records: bool = True
    checkpoint: bool = True
    resume: bool = False
    sign_key: Signer | None = None

    def __post_init__(self) -> None:
        if self.run_config is not None and not isinstance(self.run_config, Mapping):
            raise TypeError(f"run_config: expected a mapping (written to run.json) or None; got "
                            f"{type(self.run_config).__name__}.")
        for name in ("save_records", "checkpoint", "resume"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise TypeError(f"{name}: expected True or False; got {getattr(self, name)!r}.")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.sign_key is not None and not isinstance(self.sign_key, Signer):
            raise TypeError(f"sign_key: expected a fedvalue.run.seals.Signer or None; got "
                            f"{type(self.sign_key).__name__}. Read a key file with Signer.from_file(path).")

    @property
    def signer(self) -> Signer | None:
        return self.sign_key


@dataclass(frozen=True)
class FairnessNote:
    """The fairness books a round keeps ([FAIRINFL], [FAIRIJ]): the group gap valued (U = −gap),
    the accuracy gap beside it, the acceptance rule acting on the fairness scores (None: none),
    and the damping δ of the influence with curvature (None: not booked)."""

    gap: str
    utility_gap: str | None = None
    rule: Mapping[str, Any] | None = None
    damping: float | None = None

    def as_json(self) -> dict:
        note = {"gap": self.gap, "utility_gap": self.utility_gap, "rule": dict(self.rule) if self.rule else None}
        if self.damping is not None:
            note["curvature"] = {"damping": self.damping}
        return note

    @classmethod
    def from_json(cls, note: object) -> FairnessNote:
        note = _object("fairness", note, {"gap", "utility_gap", "rule", "curvature"})
        curvature = note.get("curvature")
        damping = None
        if curvature is not None:
            damping = _object("fairness.curvature", curvature, {"damping"}).get("damping")
            if isinstance(damping, bool) or not isinstance(damping, (int, float)):
                raise ValueError(f"fairness.curvature.damping: expected a number; got {_shown(damping)}.")
        rule = note.get("rule")
        return cls(gap=_text("fairness.gap", note.get("gap")),
                   utility_gap=None if note.get("utility_gap") is None else _text("fairness.utility_gap",
                                                                                   note["utility_gap"]),
                   rule=None if rule is None else _object("fairness.rule", rule), damping=damping)


@dataclass(frozen=True)
class RoundSettings:
    """The settings a round's books were computed under.

    Parameters
    ----------
    methods
        The valuation methods booked (``"ads"``, ``"loo"``), in order.
    valuation
        The ADS estimator's settings ([ADS] Alg. 1; :class:`fedvalue.valuation.settings.AdsSettings`).
    seed
        The run's seed; the round's generator is derived from it and the round number.
    strategy
        The inner Flower strategy's class name.
    aggregation
        ``"weighted-mean"`` (the FedAvg family: A_t = Σ n_u A_u / Σ n_u) or ``"strategy"``
        (the inner strategy's own code, replayed from the record).
    weighted_by_key
        The reply metric holding each client's aggregation weight n_u.
    flows
        Whether the round books TracIn flows ([RECIP]) from the clients' gradients.
    flows_projection
        The random projection the flows were booked through, as JSON (``dim``, ``seed``, ``kind``,
        ``chunk_size``: :class:`fedvalue.flows.projected_flows.FlowsProjection` parses it); the record
        then keeps every gradient and update projected, k numbers each. None (absent from the
        record): the full vectors.
    reject_non_finite
        Whether replies with NaN or ±inf were kept from the inner strategy.
    selection
        Whether the acceptance policy's choice is booked as selection marks.
    fairness
        The fairness books kept (None: none).
    weighting
        The value-weighting rule (None: the inner strategy's own weights).
    defences
        The defences' settings as JSON (None: none).
    acceptance
        The acceptance rule that set which replies the inner strategy saw, where the audit must
        derive it again (``"representatives"``; None: the policy the books name).
    notes
        What book kinds registered outside the package note of the run, by kind name (JSON
        objects; None: none).
    coalition_rule
        How the round game aggregates a coalition (:data:`fedvalue.valuation.settings.COALITION_RULES`;
        absent from the record for the default, ``"renormalized"``, so earlier records read the same).
    fixed_second_order
        Whether the round books ``ads_fixed_second_order``, the Shapley value of the fixed-weight round
        game's second-order expansion (:mod:`fedvalue.rounds.kinds.fixed_second_order`); absent from the
        record when False, so every other record's bytes are as before.

    A run's rounds share one :class:`RoundSettings`, made when its books open; what differs
    from round to round (the partitions the sampler chose from, the replies the inner strategy
    was given, why its state could not be saved) are fields of the round record
    (:class:`fedvalue.run.archive.RoundRecord`), kept beside these in the record's archive
    (:data:`ROUND_FACTS`).
    """

    methods: tuple[str, ...] = ()
    valuation: AdsSettings = AdsSettings()
    seed: int = 0
    strategy: str = ""
    aggregation: str = WEIGHTED_MEAN
    weighted_by_key: str = NUM_EXAMPLES_KEY
    flows: bool = False
    flows_projection: Mapping[str, Any] | None = None
    reject_non_finite: bool = True
    selection: bool = False
    fairness: FairnessNote | None = None
    weighting: Mapping[str, Any] | None = None
    defences: Mapping[str, Any] | None = None
    acceptance: str | None = None
    notes: Mapping[str, Any] | None = None
    coalition_rule: str = RENORMALIZED
    fixed_second_order: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.valuation, AdsSettings):
            raise TypeError(f"valuation: expected an AdsSettings; got {type(self.valuation).__name__}.")
        object.__setattr__(self, "methods", tuple(self.methods))
        check_choice("coalition_rule", self.coalition_rule, COALITION_RULES)
        if not isinstance(self.fixed_second_order, bool):
            raise TypeError(f"fixed_second_order: expected True or False; got {self.fixed_second_order!r}.")

    @property
    def by_strategy(self) -> bool:
        """Whether the inner strategy's own code aggregated the round (not the weighted mean)."""
        return self.aggregation != WEIGHTED_MEAN

    @property
    def by_examples(self) -> bool:
        """Whether the aggregation weights are example counts."""
        return self.weighted_by_key == NUM_EXAMPLES_KEY

    def as_json(self) -> dict:
        """The settings as the record's archive holds them (absent keys for what is None)."""
        valuation = self.valuation.as_dict()
        if valuation.get("stderr_estimator") == LEGACY_STDERR_ESTIMATOR:  # as records were written before it
            del valuation["stderr_estimator"]
        written = {"methods": list(self.methods), "valuation": valuation, "seed": self.seed,
                   "strategy": self.strategy, "aggregation": self.aggregation,
                   "weighted_by_key": self.weighted_by_key, "flows": self.flows,
                   "reject_non_finite": self.reject_non_finite, "selection": self.selection}
        optional = {"fairness": None if self.fairness is None else self.fairness.as_json(),
                    "weighting": None if self.weighting is None else dict(self.weighting),
                    "flows_projection": None if self.flows_projection is None else dict(self.flows_projection),
                    "defences": None if self.defences is None else dict(self.defences),
                    "acceptance": self.acceptance,
                    "notes": None if not self.notes else {kind: dict(note) for kind, note in self.notes.items()},
                    "coalition_rule": None if self.coalition_rule == RENORMALIZED else self.coalition_rule,
                    "fixed_second_order": True if self.fixed_second_order else None}
        return {**written, **{key: value for key, value in optional.items() if value is not None}}

    @classmethod
    def from_json(cls, written: object) -> RoundSettings:
        """Settings from a record's JSON object (untrusted: ValueError naming the field). A
        record of an older version may lack what it did not note then (its defaults)."""
        written = _object("settings", written, {f.name for f in dataclasses.fields(cls)})
        for name in ("methods", "valuation", "seed"):
            if name not in written:
                raise ValueError(f"settings: expected the key {name!r}; the record's settings have "
                                 f"{sorted(written)[:12]}.")
        valuation = _object("valuation", written["valuation"], {f.name for f in dataclasses.fields(AdsSettings)})
        # A record written before the estimator of MC's standard errors was a setting booked the plain one.
        valuation.setdefault("stderr_estimator", LEGACY_STDERR_ESTIMATOR)
        try:
            ads_settings = AdsSettings(**valuation)
        except (TypeError, ValueError) as error:
            raise ValueError(f"valuation.{error}") from None
        fields = {"methods": _texts("methods", written["methods"]), "valuation": ads_settings,
                  "seed": _integer("seed", written["seed"])}
        for name in ("strategy", "weighted_by_key", "acceptance"):
            if written.get(name) is not None:
                fields[name] = _text(name, written[name])
        # A record that does not say how it was aggregated is not taken for a weighted mean.
        fields["aggregation"] = check_choice("aggregation", written.get("aggregation", BY_STRATEGY),
                                             (WEIGHTED_MEAN, BY_STRATEGY))
        for name in ("flows", "reject_non_finite", "selection"):
            if name in written:
                fields[name] = _flag(name, written[name])
        if written.get("fairness") is not None:
            fields["fairness"] = FairnessNote.from_json(written["fairness"])
        for name in ("weighting", "defences", "flows_projection"):
            if written.get(name) is not None:
                fields[name] = _object(name, written[name])
        if written.get("coalition_rule") is not None:
            fields["coalition_rule"] = check_choice("coalition_rule", written["coalition_rule"], COALITION_RULES)
        if written.get("fixed_second_order") is not None:
            fields["fixed_second_order"] = _flag("fixed_second_order", written["fixed_second_order"])
        if written.get("notes") is not None:
            notes = _object("notes", written["notes"])
            fields["notes"] = {kind: _object(f"notes.{kind}", note) for kind, note in notes.items()}
        return cls(**fields)


#: What the record's archive keeps beside a round's settings, per round: why the inner strategy's
#: state was not saved for replay, the partitions the sampler chose from when some registered
#: nodes were gone, and the positions of the replies the inner strategy was given.
ROUND_FACTS = ("replay_missing", "available", "passed")


def round_facts_as_json(replay_missing: str | None, available: tuple | None, passed: tuple | None) -> dict:
    """A round's :data:`ROUND_FACTS` as its archive holds them beside the settings (absent keys for None)."""
    facts = {"replay_missing": replay_missing, "available": None if available is None else list(available),
             "passed": None if passed is None else list(passed)}
    return {key: value for key, value in facts.items() if value is not None}


def round_facts_from_json(written: Mapping) -> dict:
    """The :data:`ROUND_FACTS` among a record's settings object (untrusted: ValueError naming the
    field), as keyword arguments of :class:`fedvalue.run.archive.RoundRecord`."""
    facts: dict[str, object] = {}
    if written.get("replay_missing") is not None:
        facts["replay_missing"] = _text("replay_missing", written["replay_missing"])
    if written.get("available") is not None:
        facts["available"] = tuple(_ids("available", written["available"]))
    if written.get("passed") is not None:
        facts["passed"] = tuple(_integer("passed", k) for k in _list("passed", written["passed"]))
    return facts


def _shown(value: object) -> str:
    return json.dumps(value, default=repr)[:80] if not isinstance(value, str) else repr(value[:80])


def _object(name: str, value: object, keys: set[str] | None = None) -> dict:
    if not isinstance(value, Mapping) or any(not isinstance(k, str) for k in value):
        raise ValueError(f"{name}: expected a JSON object; got {_shown(value)}.")
    unknown = sorted(set(value) - keys) if keys is not None else []
    if unknown:
        raise ValueError(f"{name}: expected only the keys {sorted(keys)}; got also {unknown[:5]}.")
    return dict(value)


def _list(name: str, value: object) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{name}: expected a list; got {_shown(value)}.")
    return value


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected text; got {_shown(value)}.")
    return value


def _texts(name: str, value: object) -> tuple[str, ...]:
    return tuple(_text(name, item) for item in _list(name, value))


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer; got {_shown(value)}.")
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false; got {_shown(value)}.")
    return value


def _ids(name: str, value: object) -> list:
    ids = _list(name, value)
    if any(isinstance(c, bool) or not isinstance(c, (int, str)) for c in ids):
        raise ValueError(f"{name}: expected a list of client ids (integers or text); got {_shown(value)}.")
    return ids
