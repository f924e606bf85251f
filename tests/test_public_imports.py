"""Every import that README.md, docs/*.md and examples/*.py show resolves, and every dotted name
they cite in backticks (``fedvalue.ledger.load_run``, ``strategies.aggregation.reaggregate``) exists.

Users copy these lines: a module moved inside the project must leave its public path working.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedvalue", "strategies", "clients", "simulations")
EXAMPLES = ROOT / "examples"
LOCAL_EXAMPLE_MODULES = {path.stem for path in EXAMPLES.glob("*.py")}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
IMPORT_LINE = re.compile(r"^\s*(?:from\s+[\w.]+\s+import\s+[^#\n]+|import\s+[\w., ]+)", re.M)
DOTTED = re.compile(r"`~?((?:%s)(?:\.\w+)+)(?:\([^`]*\))?`" % "|".join(PACKAGES))


def _imports_of(code: str) -> list[tuple[str, str | None]]:
    """(module, name or None) for each import in ``code``; blocks that do not parse whole
    (shell lines, elisions) are read line by line."""
    try:
        trees = [ast.parse(code)]
    except SyntaxError:
        trees = []
        for line in IMPORT_LINE.findall(code):
            line = line.strip().rstrip("(\\").strip()
            try:
                trees.append(ast.parse(line))
            except SyntaxError:
                continue
    found = []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found += [(node.module, alias.name) for alias in node.names]
    return [(module, name) for module, name in found if module.split(".")[0] in PACKAGES]


def _cases() -> list[tuple[str, str, str | None]]:
    cases = []
    for path in DOCS:
        for block in FENCE.findall(path.read_text()):
            cases += [(path.name, module, name) for module, name in _imports_of(block)]
    for path in sorted(EXAMPLES.glob("*.py")):
        cases += [(path.name, module, name) for module, name in _imports_of(path.read_text())
                  if module.split(".")[0] not in LOCAL_EXAMPLE_MODULES]
    return sorted(set(cases))


def _dotted_cases() -> list[tuple[str, str]]:
    return sorted({(path.name, match) for path in DOCS for match in DOTTED.findall(path.read_text())})


def _resolve(dotted: str) -> object:
    """Import the longest importable module prefix of ``dotted`` and get the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


def test_the_documents_show_imports():
    cases = _cases()
    assert any(module == "fedvalue.ledger" for _, module, _ in cases), "the scan found no user import"
    assert len(_dotted_cases()) > 20


@pytest.mark.parametrize(("where", "module", "name"), _cases())
def test_shown_import_resolves(where, module, name):
    imported = importlib.import_module(module)
    if name is not None and name != "*":
        assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}") is not None, \
            f"{where}: 'from {module} import {name}' fails"


@pytest.mark.parametrize(("where", "dotted"), _dotted_cases())
def test_cited_name_exists(where, dotted):
    _resolve(dotted)
