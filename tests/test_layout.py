"""The package layout holds: fedvalue's subpackages import only what their ``__init__``
docstrings allow (and so never upward, never in a cycle), torch only under fedvalue/scoring/,
flwr and ray never under fedvalue/, the top-level packages import one way, ``import fedvalue``
loads no torch, and strategies/ stands on few floors of modules, without circles, its hooks/ and
policies/ importing only what their docstrings allow. (Module names may repeat across folders:
tests/test_rooms.py.)

The helpers here resolve an imported name to the module that defines it, through the faces that
re-export it, and stack a package's modules into floors; tests/test_rooms.py measures fan-out
with them."""

from __future__ import annotations

import ast
import functools
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
MAX_STRATEGIES_FLOORS = 6
#: strategies/ subpackages whose ``__init__`` docstring says what of strategies/ they may import.
STRATEGIES_LAYERED = ("hooks", "policies")


# --- Imports resolved to the module that defines each name -------------------------------------


def module_name(path: Path) -> str:
    """``strategies/hooks/flows.py`` -> ``strategies.hooks.flows``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_modules(*tops: str) -> dict[str, Path]:
    """Every module under the folders ``tops`` (relative to the root), by dotted name."""
    paths = sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)
    return {module_name(path): path for path in paths}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def is_face(path: Path) -> bool:
    """A face only re-exports: its body is a docstring, ``from ... import`` lines and ``__all__``
    (a docstring-only ``__init__.py`` is a face with nothing behind it)."""
    for index, node in enumerate(_tree(path).body):
        docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        all_names = isinstance(node, (ast.Assign, ast.AnnAssign)) and ast.unparse(node).startswith("__all__")
        if not (docstring or all_names or isinstance(node, ast.ImportFrom)):
            return False
    return True


@functools.cache
def _module_level_bindings(path: Path) -> dict[str, tuple[str, str]]:
    """The names ``path`` binds with a module-level ``from M import N [as A]``: A -> (M, N)."""
    bindings = {}
    for node in _tree(path).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            bindings |= {alias.asname or alias.name: (node.module, alias.name) for alias in node.names}
    return bindings


def defining_module(module: str, name: str, modules: dict[str, Path]) -> str | None:
    """The project module that defines what ``from module import name`` imports: the submodule
    ``module.name`` if there is one, else ``module`` itself unless ``module`` only re-exports the
    name, in which case the module it re-exports from, followed to the end (through faces and any
    other module that passes the name on). None when ``module`` is not a project module; a name
    that comes into the project from outside counts as the project module it comes through."""
    seen = set()
    while (module, name) not in seen:
        seen.add((module, name))
        if f"{module}.{name}" in modules:
            return f"{module}.{name}"
        if module not in modules:
            return None
        source = _module_level_bindings(modules[module]).get(name)
        if source is None or source[0] not in modules and f"{source[0]}.{source[1]}" not in modules:
            return module
        module, name = source
    return module


def imported_names(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) for every absolute import of ``path`` at any depth
    (function-level and ``if TYPE_CHECKING:`` imports are dependencies too)."""
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
    return found


def defining_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that define what ``path`` imports (``import a.b`` names the longest
    prefix that is a project module), ``path``'s own module left out."""
    found = set()
    for module, name, _ in imported_names(path):
        if name is not None:
            found.add(defining_module(module, name, modules))
        else:
            while module and module not in modules:
                module = module.rpartition(".")[0]
            found.add(module or None)
    return found - {None, module_name(path)}


def _behind_face(module: str, modules: dict[str, Path]) -> set[str]:
    """What a face re-exports, each name resolved to its defining module (faces behind faces too)."""
    behind, faces = set(), [module]
    while faces:
        face = faces.pop()
        for source in _module_level_bindings(modules[face]).values():
            target = defining_module(*source, modules)
            if target in modules and is_face(modules[target]) and target != face:
                faces.append(target)
            elif target is not None:
                behind.add(target)
    return behind


def import_graph(package: str) -> dict[str, list[str]]:
    """``package``'s modules and, for each, the modules of the package it imports.

    Each module is a node; A -> B when A imports a name that B defines (resolved with
    :func:`defining_module`, imports at any depth). A face that only re-exports is resolved through
    to the modules behind it and is no node itself.
    """
    modules = python_modules(package.replace(".", "/"))
    nodes = {name for name, path in modules.items() if not is_face(path)}
    graph = {}
    for name in sorted(nodes):
        targets = set()
        for target in defining_modules(modules[name], modules):
            targets |= {target} if target in nodes else _behind_face(target, modules)
        graph[name] = sorted((targets & nodes) - {name})
    return graph


def import_floors(package: str) -> tuple[dict[str, int], list[list[str]]]:
    """The floor each of ``package``'s modules stands on, and the import circles among them.

    A module that imports nothing of the package (:func:`import_graph`) stands on floor 1; any
    other on 1 + the highest floor of what it imports. The modules of a circle share one floor
    (the circle counted as one node), and each circle is reported.
    """
    graph = import_graph(package)
    circles = _strongly_connected(graph)
    circle_of = {name: tuple(circle) for circle in circles for name in circle}
    floors: dict[str, int] = {}

    def floor(name: str) -> int:
        if name not in floors:
            members = circle_of.get(name, (name,))
            below = [floor(target) for member in members for target in graph[member] if target not in members]
            for member in members:
                floors[member] = 1 + max(below, default=0)
        return floors[name]

    for name in graph:
        floor(name)
    return floors, circles


def floor_chain(name: str, floors: dict[str, int], graph: dict[str, list[str]]) -> list[str]:
    """``name`` and, floor by floor, a module beneath it one floor lower: the stack that sets its floor."""
    chain = [name]
    while floors[chain[-1]] > 1:
        below = [target for target in graph[chain[-1]] if floors[target] == floors[chain[-1]] - 1]
        if not below:  # only a circle's own members beneath: the circle is the floor
            break
        chain.append(below[0])
    return chain


def _strongly_connected(edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node (a module importing itself
    is left out by the caller): each an import circle, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(circles)


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


def test_strategies_stands_on_at_most_6_floors_without_circles():
    """A reader climbs strategies/ one floor at a time (protocol and replies at the bottom, the
    valuing strategy at the top); more than 6 floors, or a circle, means a round's parts reach
    into one another instead of being called in order."""
    graph = import_graph("strategies")
    floors, circles = import_floors("strategies")
    assert not circles, f"strategies/ imports in circles: {circles}"
    high = {name: floor for name, floor in floors.items() if floor > MAX_STRATEGIES_FLOORS}
    assert not high, (
        f"strategies/ stands on {max(floors.values())} floors (at most {MAX_STRATEGIES_FLOORS}); "
        f"{' -> '.join(floor_chain(max(floors, key=floors.get), floors, graph))}; above floor "
        f"{MAX_STRATEGIES_FLOORS}: {dict(sorted(high.items(), key=lambda item: -item[1]))}")


def _strategies_may_import(subpackage: str) -> set[str] | None:
    """What of strategies/ a subpackage's ``__init__`` docstring allows, from its ``May import:``
    line read as fedvalue's are (up to the first '(' or the sentence's end): each dotted
    ``strategies.x`` names a module, or a subpackage and everything in it. None without the line."""
    doc = " ".join((ast.get_docstring(_tree(ROOT / "strategies" / subpackage / "__init__.py")) or "").split())
    match = re.search(r"May import: (.*?)(?:\(|\.(?:\s|$))", doc)
    return set(re.findall(r"strategies(?:\.\w+)+", match.group(1))) if match else None


def test_strategies_hooks_and_policies_import_only_what_they_may():
    """hooks/ and policies/ are the parts a round calls: they may import the modules beneath them
    that their docstrings name (never train_round or valuing, which call them), resolved to the
    module that defines each name, so that importing through a face hides nothing."""
    modules = python_modules("strategies")
    wrong = []
    for subpackage in STRATEGIES_LAYERED:
        allowed = _strategies_may_import(subpackage)
        if allowed is None:
            wrong.append(f"strategies/{subpackage}/__init__.py: its docstring must say 'May import: strategies.x, ... ('")
        allowed = (allowed or set()) | {f"strategies.{subpackage}"}
        for path in sorted((ROOT / "strategies" / subpackage).glob("*.py")):
            for module, name, line in imported_names(path):
                if module.split(".")[0] != "strategies":
                    continue
                target = defining_module(module, name, modules) if name else module
                where = f"{path.relative_to(ROOT)}:{line} {module}"
                if name is not None and is_face(modules[module]) and target != module:
                    wrong.append(f"{where} (a face): import the module that holds {name}")
                elif not any(target == entry or target.startswith(entry + ".") for entry in allowed):
                    wrong.append(f"{where}: strategies/{subpackage}/ may not import {target}")
    wrong = list(dict.fromkeys(wrong))  # one line an import statement and target, not one a name
    assert not wrong, "\n".join(wrong)
