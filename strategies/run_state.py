"""The valuing strategy's run directory: open it (or resume it), commit each round with the
server's state, close it. The order of files on disk is :class:`fedvalue.run.writer.RunBooks`'
concern; this module holds what only the strategy side knows: which server objects a
checkpoint saves and how a resumed run takes them back.

A checkpoint saves, as data (:mod:`strategies.aggregation.server_state`, never pickled), the inner
strategy (optimizer moments), the sampler, the claim review (each client's last claim), what
the books' hooks keep between rounds (the pending first-order check of TracIn flows) and the
global random state Flower's randomized strategies draw from. Resuming applies it to the objects the resumed run built afresh,
after checking on copies that it fits (before the run directory is cut).
"""

from __future__ import annotations

import copy
import logging
import os
import random as random_module
import shutil
from pathlib import Path
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from flwr.app import ArrayRecord
from flwr.supercore.logger import log

from fedvalue._checks import counted
from fedvalue.run.archive import RoundRecord
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.run.run_info import UTILITY_REFERENCE_KEY, package_versions, utility_entry
from fedvalue.run.settings import RunSettings
from fedvalue.valuation.settings import RENORMALIZED
from fedvalue.schema import LedgerRow, RoundRow
from fedvalue.run.writer import Restored, RunBooks
from fedvalue.scoring.kernels import kernel_platform
from strategies.aggregation import server_state
from strategies.aggregation.random_state import RandomState
from strategies.arrays import numpy_to_arrays

class RunInterrupted(RuntimeError):
    """The run was asked to stop (SIGINT, SIGTERM) and did, after its last round committed."""


#: The saved objects, in the order a resumed run takes them back.
PARTS = ("strategy", "sampler", "claims")


@dataclass
class ServerParts:
    """The server's objects a checkpoint saves besides A_t."""

    strategy: object
    sampler: object
    claims: object
    #: What the books' hooks keep between rounds, by key (:meth:`strategies.round_hook.RoundHook.saved`).
    hook_state: Mapping[str, object]
    #: The global random state (set only on parts taken from a checkpoint).
    random: RandomState | None = None


def capture_state(parts: ServerParts) -> tuple[object, dict]:
    """``parts`` and the global random state now, as data (:func:`strategies.aggregation.server_state.capture`);
    TypeError naming ``checkpoint`` when an object holds state that is not data."""
    random = RandomState.capture()
    try:
        clash = set(parts.hook_state) & {*PARTS, "random"}
        if clash:
            raise ValueError(f"hook_state: a hook's state may not be saved under {sorted(clash)}; it names the "
                             "server's own parts.")
        return server_state.capture({
            "strategy": parts.strategy, "sampler": parts.sampler, "claims": parts.claims, **parts.hook_state,
            "random": (random.numpy, random.python, random.torch_cpu),
        })
    except server_state.StateNotCaptured as error:
        raise TypeError(f"checkpoint: saving the server's state for resume failed: {error}") from None


def take_state(state: tuple[object, dict], parts: ServerParts, *, into_copies: bool) -> ServerParts:
    """``parts`` with the saved ``state`` applied (``into_copies``: applied to copies, a dry
    run). ValueError when the state does not fit this run's objects."""
    saved = server_state.load(*state)
    targets = tuple(getattr(parts, part) for part in PARTS)
    if into_copies:
        targets = copy.deepcopy(targets)
    try:
        taken = [server_state.apply(target, saved[part], part) for part, target in zip(PARTS, targets)]
        numpy_state, python_state, torch_state = saved["random"]
        np.random.RandomState().set_state(numpy_state)  # each part checked on a generator of its own
        random_module.Random().setstate(python_state)
        if torch_state is not None:  # saved once torch was loaded (RandomState)
            import torch

            torch.Generator().set_state(torch_state)
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as error:
        raise ValueError(f"the saved server state does not fit this run ({error})") from None
    hook_state = {key: value for key, value in saved.items() if key not in {*PARTS, "random"}}
    return ServerParts(*taken, hook_state, RandomState(numpy_state, python_state, torch_state, None))


class RunState:
    """The run directory of one valuing strategy (``run_dir`` None: books in memory only).

    :meth:`open` writes (or, resuming, verifies and rewinds) the directory once;
    :meth:`commit` commits a round with the server's state; :meth:`close` writes the
    manifest once every planned round committed. ``noisy_clients``, the run's ground truth
    (:attr:`strategies.book_settings.BookSettings.noisy_clients`), is joined into the
    ledger's ``noisy`` column as rows are written.
    """

    def __init__(self, run_dir: str | None, settings: RunSettings, noisy_clients: Collection | None = None) -> None:
        if settings.resume and run_dir is None:
            raise ValueError("resume: expected run_dir, the directory of the run to continue; got None.")
        self.run_dir = run_dir
        self.settings = settings
        self.noisy_clients = noisy_clients
        self.save_records = settings.save_records and run_dir is not None
        self.checkpoint = settings.checkpoint and run_dir is not None
        self.books: RunBooks | None = None
        #: The rows of the rounds committed so far (a resumed run's from its directory).
        self.rounds: list[RoundRow] = []
        self.opened = False
        #: Whether :meth:`open` made the run directory (a new run into a path that did not exist).
        self.made_dir = False
        #: Where a resumed run continues from (None: a new run).
        self.resumed: Restored | None = None
        self._resumed_random: RandomState | None = None

    @property
    def resume(self) -> bool:
        return self.settings.resume

    @property
    def ledger(self) -> LedgerWriter | None:
        """The open run directory's ledger (None before :meth:`open` or without a run directory)."""
        return None if self.books is None else self.books.ledger

    def open(self, parts: ServerParts, config: Mapping | None = None) -> ServerParts | None:
        """Open the directory with ``config`` as run.json (default: the settings' run_config);
        resuming, the server's parts taken from its verified checkpoint (None when it holds no
        state, or for a new run). Runs once."""
        if self.opened:
            return None
        self.opened = True
        if self.run_dir is None:
            return None
        if self.checkpoint:
            capture_state(parts)  # a state that is not data is refused before anything is written
        self.made_dir = not self.resume and not Path(os.path.expanduser(os.fspath(self.run_dir))).exists()
        config = self.settings.run_config if config is None else config
        if parts.claims is not None:  # the audit allows claim rows only in a run whose run.json names a review
            config = {**(config or {}), "claim_review": repr(parts.claims)}
        if config is not None:  # where the run started: an auditor elsewhere learns why training replays differ
            config = {**config, "platform": kernel_platform()}
        check = (lambda state: take_state(state, parts, into_copies=True)) if self.resume else None
        self.books = RunBooks(self.run_dir, config=config, resume=self.resume, signer=self.settings.signer,
                              save_records=self.save_records, checkpoint=self.checkpoint,
                              noisy_clients=self.noisy_clients, check_state=check)
        if not self.resume:
            return None
        self.resumed = self.books.restored
        self.rounds = self.books.committed_rounds()
        state = self.resumed.state
        if state is None:
            return None
        taken = take_state(state, parts, into_copies=False)
        self._resumed_random = taken.random
        return taken

    def continue_from(self, num_rounds: int, initial_arrays: ArrayRecord) -> tuple[int, ArrayRecord]:
        """(rounds already committed, the arrays to start from) for a run of ``num_rounds``:
        (0, ``initial_arrays``) for a new run; resumed, round k's A_k, with the global random
        state put back as it was after round k (the draws Flower's strategies make continue as
        in an uninterrupted run). k = ``num_rounds`` (a writer killed after its last commit,
        before its manifest) leaves no round to run, only the run's close. ValueError when
        the run holds more rounds than ``num_rounds``."""
        done = 0 if self.resumed is None else self.resumed.round
        if done > num_rounds:
            raise ValueError(f"num_rounds: the run in {self.books.run_dir} already completed {counted(done, 'round')}; got "
                             f"num_rounds={num_rounds}, so there is nothing to resume.")
        if not done:
            return 0, initial_arrays
        self._resumed_random.restore()
        return done, numpy_to_arrays(self.resumed.arrays)

    def commit(self, server_round: int, round_row: RoundRow, ledger_rows: list[LedgerRow], record: RoundRecord,
               realized: dict, parts: ServerParts) -> None:
        """Round ``server_round``'s record, rows, commit mark, checkpoint and seal
        (:meth:`fedvalue.run.writer.RunBooks.commit`; nothing on disk without a run directory); its
        row joins :attr:`rounds` once committed."""
        if self.books is not None:
            self.books.commit(server_round, round_row, ledger_rows, record=record if self.save_records else None,
                              realized=realized, state=capture_state(parts) if self.checkpoint else None)
        self.rounds.append(round_row)

    def close(self, num_rounds: int | None) -> None:
        """The final manifest (:mod:`fedvalue.run.seals`), once every planned round committed."""
        if self.books is None or not self.rounds or self.rounds[-1].round != num_rounds:
            return
        self.books.close(num_rounds)

    def release(self) -> None:
        """Let go of the run directory's writer lock (the run ended, finished or not)."""
        if self.books is not None:
            self.books.release()

    def remove_unstarted(self) -> str | None:
        """After a failure: a new run that committed no round removes the directory it made
        (run.json and the start checkpoint, nothing anyone can use), says so in the log and
        returns its path; a directory that was there before, a resumed run, or one that committed
        a round is kept (None)."""
        if not self.made_dir or self.rounds or self.books is None:
            return None
        self.release()
        path = self.books.run_dir  # resolved when the books opened
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            return None
        log(logging.WARNING, "fedvalue: the run failed before its first round committed; %s, which it had made, "
            "was removed", path)
        return str(path)

    def log_start(self, strategy_name: str, methods) -> None:
        """The run's start line: the inner strategy, the methods, where the books are, and whether
        the run is signed (by the key with which fingerprint)."""
        signer = self.settings.signer
        log(logging.INFO, "fedvalue: valuing %s's clients by %s into %s, %s", strategy_name, list(methods),
            self.books.run_dir, "unsigned" if signer is None else f"signed by key {signer.fingerprint} "
            f"({signer.algorithm})")


def run_json(valuing, num_rounds: int | None) -> dict | None:
    """run.json of a :class:`strategies.ValuingStrategy` run (None: no run directory).

    The caller's ``RunSettings.run_config`` when given (the simulations write their own), with the
    utility's reference added when U was given as one. Otherwise what the wrapper knows, so that
    a run of anyone's own ServerApp can be read and audited from its directory: the inner
    strategy, seed, methods and estimator, sampler and acceptance, planned rounds, flows and their
    projection, the fixed-weight game's second-order expansion (only when booked), the utility (its
    ``module:callable`` when given as one, its type, the digest of its held-out data), the package
    versions (and, added when the books open, the platform).
    """
    if valuing.run_state.run_dir is None:
        return None
    utility = utility_entry(valuing.utility, valuing.utility_reference)
    given = valuing.run_state.settings.run_config
    if given is not None:
        if valuing.utility_reference is None or UTILITY_REFERENCE_KEY in given:
            return dict(given)
        return {**given, UTILITY_REFERENCE_KEY: utility}
    sampler = valuing.sampler
    config = {
        "written_by": "strategies.ValuingStrategy",
        "strategy": type(valuing.strategy).__name__,
        "seed": valuing.seed,
        "num_rounds": num_rounds,
        "methods": list(valuing.methods),
        "valuation": valuing.valuation.ads.as_dict(),
        # Absent for the default rule: run.json of earlier runs reads the same.
        "coalition_rule": None if valuing.valuation.coalition_rule == RENORMALIZED else valuing.valuation.coalition_rule,
        "sampler": None if sampler is None else described(sampler),
        "clients_per_round": None if sampler is None else sampler.clients_per_round,
        "acceptance": described(valuing.acceptance),
        "flows": valuing.flows,
        "flows_projection": _as_json(valuing.book_settings.flows_projection(valuing.seed)),
        # Absent when off: run.json of earlier runs reads the same.
        "fixed_second_order": True if valuing.book_settings.fixed_second_order else None,
        UTILITY_REFERENCE_KEY: utility,
        "versions": package_versions(),
    }
    return {key: value for key, value in config.items() if value is not None}


def _as_json(setting) -> dict | None:
    return None if setting is None else setting.as_json()


def described(policy: object) -> dict:
    """A policy object as run.json holds it: its type and its plain settings (no memory address,
    so the same settings write the same bytes)."""
    plain = {key: value for key, value in sorted(vars(policy).items())
             if not key.startswith("_") and isinstance(value, bool | int | float | str)}
    return {"type": type(policy).__name__, **plain}
