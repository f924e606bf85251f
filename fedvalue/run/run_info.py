"""run.json: its text as written and read, and what it says about the run's environment and its
utility, so a third party can audit a run made by anyone's own app.

run.json holds the run's configuration as sorted, indented JSON (:func:`config_json`); the hash
chain of the ledger's tables starts from its bytes (:mod:`fedvalue.run.ledger_tables`).

The round games are v_t(S) = U(Agg_t(A_{t−1}; S)) ([ADS] Remark 4.1, Eq. 10): an audit can
recompute them only with the same U. run.json therefore names U as an importable
``"module:callable"`` (a callable of no arguments returning U), with a digest of the held-out
data U scores (:func:`held_out_digest`), beside the package versions (the platform is
:mod:`fedvalue.scoring.kernels`'s).

A run directory is untrusted input: importing a module it names runs that module's code. The
audit imports a utility only when the auditor names it (``fedvalue audit --utility``) or says
so (``--trust-run-utility``); :func:`load_utility` is the one place that imports one.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import json
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path

from fedvalue.run import rundir
from fedvalue.run.rundir import RunDir, open_run_dir
from fedvalue.schema import RUN_CONFIG_FILE

#: run.json's key naming the utility: {"reference", "type", "held_out_digest"}.
UTILITY_REFERENCE_KEY = "utility_reference"
#: Packages whose versions run.json records (as ``fedvalue run`` records them).
VERSIONED_PACKAGES = ("fedvalue", "flwr", "ray", "torch", "numpy", "pandas")
_REFERENCE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def parse_run_config(text: str, where: str = RUN_CONFIG_FILE) -> dict:
    """run.json's text as a dict; ValueError when it is not a JSON object."""
    try:
        config = rundir.loads_json(text, where)
    except ValueError as error:
        raise ValueError(f"{RUN_CONFIG_FILE}: expected the run's configuration as JSON; {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{RUN_CONFIG_FILE}: expected a JSON object of settings; got a {type(config).__name__}.")
    return config


def read_run_config(run_dir: str | os.PathLike | RunDir) -> dict:
    """run.json as a dict ({} when absent); ValueError when it is not a JSON object."""
    run = open_run_dir(run_dir)
    if not run.exists(RUN_CONFIG_FILE):
        return {}
    return parse_run_config(run.read_text(RUN_CONFIG_FILE, max_bytes=rundir.MAX_JSON_BYTES))


def config_json(data: Mapping) -> str:
    """A configuration as run.json holds it."""
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def write_json(path: str | os.PathLike, data: Mapping) -> None:
    """Write ``data`` as JSON to ``path`` atomically, never through a link at ``path``."""
    path = rundir.resolve(path)
    RunDir(path.parent, create=True).write_text(path.name, config_json(data))


def package_versions() -> dict[str, str]:
    """Python's and :data:`VERSIONED_PACKAGES`' versions (read from the installed metadata,
    nothing imported)."""
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def check_reference(reference: object, name: str = "utility") -> str:
    """``reference`` if it reads ``module:callable`` (dotted names), else a ValueError naming ``name``."""
    if not isinstance(reference, str) or not _REFERENCE.fullmatch(reference):
        raise ValueError(f"{name}: expected an importable 'module:callable' (e.g. 'my_app.task:held_out_utility', "
                         f"a function of no arguments returning U); got {reference!r}.")
    return reference


def held_out_digest(utility: object) -> str | None:
    """The digest of the held-out data ``utility`` scores (its ``held_out_digest()``, e.g.
    :meth:`fedvalue.scoring.torch_utilities.TorchModelUtility.held_out_digest`); None when it
    offers none."""
    method = getattr(utility, "held_out_digest", None)
    if not callable(method):
        return None
    digest = method()
    return digest if isinstance(digest, str) else None


def utility_entry(utility: object, reference: str | None) -> dict:
    """run.json's :data:`UTILITY_REFERENCE_KEY` entry for ``utility`` built by ``reference``."""
    kind = type(utility)
    return {"reference": reference, "type": f"{kind.__module__}.{kind.__qualname__}",
            "held_out_digest": held_out_digest(utility)}


@contextmanager
def _importable_from(directory: Path):
    """``directory`` first on ``sys.path`` for the block (as ``python -m`` puts the working
    directory), restored after."""
    entry = str(directory)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        if entry in sys.path:
            sys.path.remove(entry)


def import_reference(reference: str, name: str, *, search_path: str | Path | None = None,
                     where: str = "run it where the module is importable (its project directory, or installed)"
                     ) -> object:
    """What the ``module:callable`` ``reference`` names (not called), its module imported with
    ``search_path`` (default: the working directory) first on ``sys.path``. ValueError naming
    ``name`` and the reference: not a reference; the module does not import (``where`` says
    what to do); the module has no such name (with the module's close names, a likely typo).

    This runs the named module's code: call it only on a reference the caller chose to trust.
    """
    module_name, _, attribute = check_reference(reference, name).partition(":")
    try:
        with _importable_from(Path.cwd() if search_path is None else Path(search_path)):
            target = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - whatever the import does is reported, not raised through
        raise ValueError(f"{name} {reference!r}: cannot import it ({type(error).__name__}: {error}); "
                         f"{where}.") from None
    for depth, part in enumerate(attribute.split(".")):
        if not hasattr(target, part):
            owner = ".".join([module_name, *attribute.split(".")[:depth]])
            known = [n for n in dir(target) if not n.startswith("_")]
            close = difflib.get_close_matches(part, known, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(f"{name} {reference!r}: {owner} imports, but has no {part!r}{hint}") from None
        target = getattr(target, part)
    return target


def load_utility(reference: str, *, search_path: str | Path | None = None) -> Callable:
    """U rebuilt by calling the ``module:callable`` ``reference`` names, importing the module with
    ``search_path`` (default: the working directory) first on ``sys.path``.

    This runs the named module's code: call it only on a reference the caller chose to trust.

    Raises
    ------
    ValueError
        Naming the reference and what went wrong (not a reference, the import failed, no such
        callable, it raised, or it returned something that is not a utility).
    """
    target = import_reference(reference, "utility", search_path=search_path,
                              where="run the audit where the module is importable (its project directory, or "
                                    "installed)")
    if not callable(target):
        raise ValueError(f"utility {reference!r}: expected a callable returning U; got a {type(target).__name__}.")
    try:
        utility = target()
    except Exception as error:  # noqa: BLE001
        raise ValueError(f"utility {reference!r}: calling it raised {type(error).__name__}: {error}") from None
    if not callable(utility):
        raise ValueError(f"utility {reference!r}: expected it to return a utility U(arrays) -> float; got a "
                         f"{type(utility).__name__}.")
    return utility


def utility_mismatch(utility: object, saved: Mapping | None) -> str | None:
    """Why ``utility`` is not the one the run scored with (its held-out data's digest differs
    from the one run.json records), or None (same digest, or nothing to compare)."""
    recorded = (saved or {}).get("held_out_digest")
    rebuilt = held_out_digest(utility)
    if not isinstance(recorded, str) or rebuilt is None or rebuilt == recorded:
        return None
    return (f"the utility scores held-out data with digest {rebuilt[:19]}…; the run scored data with digest "
            f"{recorded[:19]}… (another data set, split or metric)")
