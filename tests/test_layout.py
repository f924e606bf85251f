"""The package layout holds: fedvalue's subpackages import only what their ``__init__``
docstrings allow (and so never upward, never in a cycle), torch only under fedvalue/scoring/,
flwr and ray never under fedvalue/, the top-level packages import one way and ``import fedvalue``
loads no torch (module names may repeat across folders: tests/test_rooms.py)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FEDVALUE = ROOT / "fedvalue"
PACKAGES = ("fedvalue", "strategies", "clients", "simulations")  # bottom-up
SUBPACKAGES = sorted(path.parent.name for path in FEDVALUE.glob("*/__init__.py"))
MAY_IMPORT = re.compile(r"May import: ([^(]*)\(")
FOUNDATION = {"fedvalue._checks", "fedvalue.schema"}


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every absolute import of ``path``, at any depth (function-level imports count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _allowed() -> dict[str, set[str]]:
    allowed = {}
    for name in SUBPACKAGES:
        doc = ast.get_docstring(ast.parse((FEDVALUE / name / "__init__.py").read_text())) or ""
        match = MAY_IMPORT.search(doc.replace("\n", " "))
        assert match, f"fedvalue/{name}/__init__.py: its docstring must say 'May import: ... ('"
        listed = re.findall(r"fedvalue\.(\w+)", match.group(1))
        assert set(listed) <= set(SUBPACKAGES), f"{name}: unknown subpackages in {listed}"
        allowed[name] = set(listed)
    return allowed


def test_subpackages_exist_and_say_what_they_hold():
    assert {"valuation", "scoring", "run", "rounds", "audit", "analysis"} <= set(SUBPACKAGES)
    for name in SUBPACKAGES:
        doc = ast.get_docstring(ast.parse((FEDVALUE / name / "__init__.py").read_text()))
        assert doc and len(doc.split()) > 15, f"fedvalue/{name}/__init__.py needs a docstring"


def test_allowed_imports_form_layers_without_cycles():
    allowed = _allowed()
    done: set[str] = set()
    while len(done) < len(allowed):  # peel the layers bottom-up; a cycle leaves some unpeeled
        layer = {name for name, deps in allowed.items() if name not in done and deps <= done}
        assert layer, f"the allowed imports form a cycle among {sorted(set(allowed) - done)}"
        done |= layer


def test_each_subpackage_imports_only_what_it_may():
    allowed = _allowed()
    faces = {"fedvalue", "fedvalue.ledger", "fedvalue.utilities"}
    wrong = []
    for name in SUBPACKAGES:
        for path in sorted((FEDVALUE / name).rglob("*.py")):
            for module, line in _imports(path):
                parts = module.split(".")
                if parts[0] != "fedvalue":
                    continue
                where = f"{path.relative_to(ROOT)}:{line} {module}"
                if module in faces:
                    wrong.append(f"{where}: a face, import the module that holds the name")
                elif len(parts) > 1 and parts[1] in allowed and parts[1] not in allowed[name] | {name}:
                    wrong.append(f"{where}: {name}/ may not import {parts[1]}/")
    assert not wrong, "\n".join(wrong)


def test_root_foundation_imports_no_subpackage():
    for stem in ("_checks", "schema"):
        imported = {m for m, _ in _imports(FEDVALUE / f"{stem}.py") if m.startswith("fedvalue.")}
        assert imported <= FOUNDATION, f"fedvalue/{stem}.py imports {imported - FOUNDATION}"


def test_torch_only_in_scoring_and_no_flwr_or_ray():
    wrong = []
    for path in sorted(FEDVALUE.rglob("*.py")):
        inside_scoring = (FEDVALUE / "scoring") in path.parents
        for module, line in _imports(path):
            top = module.split(".")[0]
            if top in ("flwr", "ray") or (top == "torch" and not inside_scoring):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_import_fedvalue_loads_no_torch_flwr_or_ray():
    code = "import sys, fedvalue; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'flwr', 'ray'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_top_level_packages_import_one_way():
    rank = {name: i for i, name in enumerate(PACKAGES)}
    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for module, line in _imports(path):
                top = module.split(".")[0]
                if top in rank and rank[top] > rank[package]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module} (upward)")
    assert not wrong, "\n".join(wrong)


def test_no_core_file_over_700_lines():
    long = {str(p.relative_to(ROOT)): n for p in FEDVALUE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert not long, long
