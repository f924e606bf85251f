"""What a resume checks before it acts, reading only: the run directory's own commitments.

:func:`verify_resume` reads ``checkpoint.json`` and round k's seal and checks, changing
nothing: the seal's signature (with the signer's key), that the sizes ``checkpoint.json``
names are the sealed ones and no longer than the tables, that the hash chain over the
tables cut to those sizes starts at the genesis (SHA-256 of run.json), has k rounds and
ends at the seal's head, that the checkpoint files' digests are the sealed ones, and that
they parse as data (arrays and a JSON state; nothing is unpickled, so nothing runs).

Nothing here reads a *setting* of run.json: its bytes enter only the genesis hash. So a
caller verifies a directory before it takes any setting from it (a Ray address to probe,
a data path to read): a directory the signer did not write is refused first.

A checkpoint of round 0 (the pointer a new run writes at its start, or none in a run made
before it) is accepted while no round is committed, and in the window of round 1: at
most one round in rounds.csv and seals of round 1 at most (a writer killed after round
1's commit mark, before checkpoint.json switched to it). Resuming then starts again from
round 0; that round committed nothing a checkpoint holds, and the same seed recomputes
it byte for byte. A directory that committed nothing carries no signature to check:
resuming it starts the run its run.json describes, as ``fedvalue run`` with those
settings would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from fedvalue._checks import counted
from fedvalue.run import rundir
from fedvalue.run.archive import APPEND_ONLY_FILES, npz_from_bytes, read_checkpoint_pointer, state_from_bytes
from fedvalue.run.ledger_tables import chain_from_lines, genesis_hash, table_lines
from fedvalue.run.rundir import RunDir
from fedvalue.run.seals import Signer, read_seals
from fedvalue.schema import (
    CHECKPOINT_FILE,
    LEDGER_FILE,
    MANIFEST_FILE,
    MODEL_SIGNATURE_FILE,
    ROUNDS_FILE,
    RUN_CONFIG_FILE,
    SEALS_FILE,
    checkpoint_names,
)

Arrays = dict[str, np.ndarray]


@dataclass
class Restored:
    """What a resumed run continues from: round ``round`` (0: from the start), A_k and the
    server's state as data (:mod:`fedvalue.run.state_codec`: a JSON tree and its arrays)."""

    round: int
    arrays: Arrays | None
    state: tuple[object, Arrays] | None


@dataclass
class ResumePlan:
    """A verified resume: where it continues from and the table sizes it cuts back to."""

    restored: Restored
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def round(self) -> int:
        return self.restored.round


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def committed_rounds(rounds_text: str) -> int:
    """Rounds whose rounds.csv line is whole (a torn last line is not committed)."""
    return sum(1 for line in table_lines(rounds_text) if line.endswith("\n"))


def refusal(run: RunDir, why: str) -> ValueError:
    return ValueError(f"resume: the run in {run.show()} {why}; not resumed (nothing was changed).")


def verify_resume(run: RunDir, signer: Signer | None = None) -> ResumePlan:
    """Everything resume checks in the directory, reading only (module docstring); the cut
    it implies. ValueError naming the problem; nothing is changed."""
    if not run.exists(RUN_CONFIG_FILE):
        raise ValueError(f"resume: expected a run directory holding run.json; {run.show()} has none.")
    tables = {name: run.read_bytes(name) for name in APPEND_ONLY_FILES if run.exists(name)}
    committed = committed_rounds(tables.get(ROUNDS_FILE, b"").decode("utf-8", "replace"))
    if run.exists(MANIFEST_FILE):
        unsigned = signer is not None and signer.signs_model and not run.exists(MODEL_SIGNATURE_FILE)
        raise ValueError(f"resume: the run in {run.show()} already completed {counted(committed, 'round')} (it holds its "
                         "final manifest); there is nothing to resume."
                         + (f" Its {MODEL_SIGNATURE_FILE} is missing (stopped at its close): "
                            "fedvalue.run.model_signature.sign_closed_run(DIR, Signer.from_file(KEY)) writes it once "
                            "the manifest verifies." if unsigned else ""))
    try:
        pointer = read_checkpoint_pointer(run)
        seals = read_seals(run)
    except ValueError as error:
        raise refusal(run, f"holds a checkpoint or seals that are not fedvalue's ({error})") from None
    if pointer is None or pointer[0] == 0:
        _check_start(run, pointer, committed, seals)
        return ResumePlan(Restored(0, None, None))
    k, sizes = pointer
    seal = _sealed_checkpoint(run, k, sizes, seals, signer)
    _check_tables(run, k, sizes, tables, seal)
    data = _checkpoint_files(run, k, seal)
    arrays_name, state_name = checkpoint_names(k)
    try:
        arrays, _ = npz_from_bytes(data["npz"], run.show(arrays_name))
        state = state_from_bytes(data["state"], run.show(state_name))
    except ValueError as error:
        raise refusal(run, f"has a checkpoint of round {k} that does not restore ({error})") from None
    return ResumePlan(Restored(k, arrays, state), sizes)


def check_restorable(run: RunDir, plan: ResumePlan,
                     check_state: Callable[[tuple[object, Arrays]], None] | None) -> None:
    """``check_state`` (raising ValueError when the resumed run cannot take the verified
    server state: another strategy than the one saved) as a refusal naming the round."""
    if check_state is None or plan.restored.state is None:
        return
    try:
        check_state(plan.restored.state)
    except ValueError as error:
        raise refusal(run, f"has a checkpoint of round {plan.round} that does not restore ({error})") from None


def _check_start(run: RunDir, pointer, committed: int, seals: list[dict]) -> None:
    """A start from round 0: nothing committed, or (with the start's pointer) round 1's window."""
    in_round_one = pointer is not None and committed <= 1 and all(s["round"] <= 1 for s in seals)
    if (committed or seals) and not in_round_one:
        raise refusal(run, f"holds {committed} committed rounds and {len(seals)} seals but no checkpoint of a "
                           "committed round")


def _sealed_checkpoint(run: RunDir, k: int, sizes: Mapping[str, int], seals: list[dict],
                       signer: Signer | None) -> dict:
    """Round k's one seal: signed by ``signer``, naming the sizes checkpoint.json names."""
    mine = [s for s in seals if s["round"] == k]
    if len(mine) != 1:
        raise refusal(run, f"holds {len(mine)} seals of its checkpoint's round {k} in {SEALS_FILE}, not one")
    seal = mine[0]
    if signer is not None and (problem := signer.verifier().problem(seal)) is not None:
        raise refusal(run, f"has a round {k} seal not signed by the given key ({problem})")
    if seal.get("sizes") != sizes:
        raise refusal(run, f"names table sizes in {CHECKPOINT_FILE} that round {k}'s seal did not commit to"
                      + ("" if "sizes" in seal else " (its seals were written by an older version)"))
    return seal


def _check_tables(run: RunDir, k: int, sizes: Mapping[str, int], tables: Mapping[str, bytes], seal: dict) -> None:
    """The tables cut to the sealed sizes chain from run.json's genesis to round k's sealed head."""
    for name, size in sizes.items():
        if len(tables.get(name, b"")) < size:
            raise refusal(run, f"has a {name} shorter than at the checkpoint of round {k}")
    prefix = {name: tables.get(name, b"")[:sizes.get(name, 0)].decode("utf-8", "replace")
              for name in (LEDGER_FILE, ROUNDS_FILE)}
    try:
        heads = chain_from_lines(genesis_hash(run), table_lines(prefix[LEDGER_FILE]), table_lines(prefix[ROUNDS_FILE]))
    except ValueError as error:
        raise refusal(run, f"does not chain up to its checkpoint ({error})") from None
    if len(heads) != k or heads[-1] != seal.get("head"):
        raise refusal(run, f"ends its chain at round {len(heads)} elsewhere than round {k}'s seal")


def _checkpoint_files(run: RunDir, k: int, seal: dict) -> dict[str, bytes]:
    """Round k's checkpoint files, each with the digest its seal committed to."""
    digests = seal.get("checkpoint") or {}
    data = {}
    for key, name in zip(("npz", "state"), checkpoint_names(k)):
        try:
            data[key] = run.read_bytes(name)
        except (FileNotFoundError, rundir.UnsafeRunFile) as error:
            raise refusal(run, f"lacks its checkpoint file {name} ({error})") from None
        if digests.get(key) != _digest(data[key]):
            raise refusal(run, f"has a checkpoint file {name} that differs from the one round {k}'s seal committed to")
    return data
