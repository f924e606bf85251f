"""What an audit found (:class:`AuditReport`): the checks verified, failed and not verifiable,
the notes, and which run it was."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedvalue._checks import counted
from fedvalue.run.rundir import printable

VERIFIED, FAILED, NOT_VERIFIABLE = "verified", "failed", "not verifiable"


@dataclass
class AuditReport:
    """What an audit found. ``checks`` were verified, ``problems`` failed, ``unverifiable``
    could not be checked; ``notes`` say what no audit of these files can check.

    ``ok`` is True when no check failed; ``intact`` (the verdict ``fedvalue audit`` exits 0
    on) when, besides, nothing went unverified. ``head`` (the chain's last hash), ``seed``
    (run.json's) and ``signed_by`` (the key fingerprint the manifest or seals name;
    ``key_verified`` when their signatures were checked against a given key, ``key_failed``
    when they do not verify with it, ``model_failed`` when ``model.sig`` does not) say WHICH run
    this is. ``stopped`` names the check the audit stopped at before it read the tables (a
    signature, ``model.sig``, the manifest's digests); ``rounds`` and ``ledger_rows`` then count
    the tables' lines as the files hold them, unchecked (``tables_checked`` False). ``measured``
    holds what the recompute counted, by name (empty when it did not run): how the replies matched
    their replayed training (bit for bit, to the element-wise tolerance, only within float rounding;
    :class:`~fedvalue.audit.training_replay.ReplayTally`) and the numbers that recomputed only within
    float32 rounding of the utility (:class:`~fedvalue.audit.rounding_envelope.EnvelopeTally`), with
    their largest differences: what an exact comparison would have failed, which no verdict shows.
    """

    run_dir: str
    rounds: int = 0
    ledger_rows: int = 0
    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    head: str | None = None
    seed: object = None
    signed_by: str | None = None
    key_verified: bool = False
    key_failed: bool = False
    model_failed: bool = False
    stopped: str | None = None
    tables_checked: bool = False
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def intact(self) -> bool:
        return not self.problems and not self.unverifiable

    @property
    def verdict(self) -> str:
        if self.problems:
            return "NOT intact"
        return "NOT verifiable" if self.unverifiable else "intact"

    def verdicts(self) -> list[tuple[str, str]]:
        """(status, what) for every check, in the order verified, failed, not verifiable."""
        return ([(VERIFIED, c) for c in self.checks] + [(FAILED, p) for p in self.problems]
                + [(NOT_VERIFIABLE, u) for u in self.unverifiable])

    def identity(self) -> str:
        """Which run this is: its chain head, seed and signing key, claiming only what was verified."""
        if self.signed_by is None:
            key = "unsigned"
        elif self.key_failed:
            key = f"names key {self.signed_by} (its signatures do NOT verify with the given public key)"
        elif self.key_verified and self.model_failed:
            key = (f"signed by key {self.signed_by} (its seals' and manifest's signatures verify with the given public "
                   "key; model.sig does NOT)")
        elif self.key_verified:
            key = f"signed by key {self.signed_by} (verified with the given public key)"
        else:
            key = f"signed by key {self.signed_by} (not verified: no public key given)"
        head = self.head or (f"not read (the audit stopped at {self.stopped})" if self.stopped else "none")
        return f"head {head}, seed {printable(self.seed, 40)}, {key}"

    def summary(self) -> str:
        """The audit's last line: the rounds and ledger rows (as read, when the audit stopped before
        checking them) and the verdict."""
        unchecked = "" if self.tables_checked or not self.stopped else " in its tables, not checked"
        return (f"{self.run_dir}: {counted(self.rounds, 'round')}, {counted(self.ledger_rows, 'ledger row')}{unchecked}: "
                f"{self.verdict}")

    def as_dict(self) -> dict:
        """The report as plain data (``fedvalue audit --json``): the run, the verdict, every check,
        finding, unverifiable check and note, and what the recompute measured."""
        return {"run_dir": self.run_dir, "verdict": self.verdict, "intact": self.intact, "rounds": self.rounds,
                "ledger_rows": self.ledger_rows, "head": self.head, "seed": printable(self.seed, 40),
                "identity": self.identity(), "checks": list(self.checks), "problems": list(self.problems),
                "unverifiable": list(self.unverifiable), "notes": list(self.notes), "measured": dict(self.measured)}
