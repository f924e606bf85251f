"""What an audit found (:class:`AuditReport`): the checks verified, failed and not verifiable,
the notes, and which run it was."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedvalue.run.rundir import printable

VERIFIED, FAILED, NOT_VERIFIABLE = "verified", "failed", "not verifiable"


@dataclass
class AuditReport:
    """What an audit found. ``checks`` were verified, ``problems`` failed, ``unverifiable``
    could not be checked; ``notes`` say what no audit of these files can check.

    ``ok`` is True when no check failed; ``intact`` (the verdict ``fedvalue audit`` exits 0
    on) when, besides, nothing went unverified. ``head`` (the chain's last hash), ``seed``
    (run.json's) and ``signed_by`` (the key fingerprint the manifest or seals name;
    ``key_verified`` when their signatures were checked against a given key) say WHICH run
    this is.
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
        """Which run this is: its chain head, seed and signing key."""
        key = ("unsigned" if self.signed_by is None else
               f"signed by key {self.signed_by} ("
               + ("verified with the given public key" if self.key_verified else "not verified: no public key given")
               + ")")
        return f"head {self.head or 'none'}, seed {printable(self.seed, 40)}, {key}"
