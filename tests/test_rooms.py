"""The house keeps its rooms: folders small enough to read, no folder that wants to exist (three
modules with one name prefix), experiments that never import one another, a runner and data that
import no experiment, a ``bench/`` that stands on its own, short functions, and modules that
depend on a handful of others."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedvalue", "strategies", "clients", "simulations")
SIMULATIONS = ROOT / "simulations"
EXPERIMENTS = SIMULATIONS / "experiments"
MAX_FILES_PER_FOLDER = 15
MAX_LONG_FUNCTIONS, LONG_FUNCTION = 5, 80
#: The functions named by the redesign, each with its own cap.
CAPPED_FUNCTIONS = {"ads": 60, "simulate": 60, "recompute_run": 60}
MAX_PROJECT_IMPORTS = 12
FAN_OUT_EXEMPT = {"simulations.cli.registry"}  # lists every experiment by design


def _python_files(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path) -> set[str]:
    """Absolute imports of ``path`` at any depth, each as the longest name that is a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _python_files(*PACKAGES)}


def _project_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports (a name imported from a package counts as the
    package unless it is a module of its own)."""
    own = _module_name(path)
    found = set()
    for name in _imported_modules(path):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != own:
            found.add(name)
    # ``from pkg import module`` also names ``pkg``: count the module, not its package as well.
    return {m for m in found if not any(other.startswith(m + ".") for other in found)}


def test_every_folder_holds_at_most_15_python_files():
    counts = Counter(p.parent for p in _python_files(*PACKAGES, "tests", "bench", "examples"))
    crowded = {str(folder.relative_to(ROOT)): n for folder, n in counts.items() if n > MAX_FILES_PER_FOLDER}
    assert not crowded, crowded


def test_no_folder_has_three_modules_sharing_a_name_prefix():
    """Three ``knn_*`` files in one folder are a ``knn/`` folder waiting to be made (tests'
    ``test_`` is not a prefix: ``test_knn_a`` and ``test_knn_b`` share ``knn``)."""
    prefixes: Counter = Counter()
    for path in _python_files(*PACKAGES, "tests", "bench"):
        stem = path.stem.removeprefix("test_")
        if stem != "__init__" and "_" in stem.strip("_"):
            prefixes[(path.parent, stem.strip("_").split("_")[0])] += 1
    crowded = {f"{folder.relative_to(ROOT)}/{prefix}_*": n for (folder, prefix), n in prefixes.items() if n >= 3}
    assert not crowded, crowded


def test_no_module_shares_its_name_with_a_sibling_package():
    """Module names may repeat across folders (the folder is the context); within one folder a
    module ``x.py`` beside a package ``x/`` would be shadowed."""
    clashes = [str(p.relative_to(ROOT)) for p in _python_files(*PACKAGES, "tests", "bench")
               if p.stem != "__init__" and (p.parent / p.stem / "__init__.py").exists()]
    assert not clashes, clashes


def _experiment_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["simulations", "experiments"] else None


def test_experiments_import_no_other_experiment():
    wrong = []
    for path in _python_files("simulations/experiments"):
        mine = _experiment_of(_module_name(path))
        for module in _imported_modules(path):
            theirs = _experiment_of(module)
            if theirs is not None and mine is not None and theirs != mine:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_only_the_cli_imports_experiments_and_nothing_below_imports_the_cli():
    wrong = []
    for path in _python_files(*PACKAGES):
        module = _module_name(path)
        if module.startswith(("simulations.cli", "simulations.experiments")):
            continue
        for imported in _imported_modules(path):
            if imported.startswith(("simulations.experiments", "simulations.cli")):
                wrong.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_bench_stands_alone():
    """Benchmarks run as ``python -m bench.NAME``: no ``sys.path`` edits, nothing from tests/."""
    wrong = []
    for path in _python_files("bench"):
        text = path.read_text()
        if re.search(r"sys\.path\.(insert|append)", text):
            wrong.append(f"{path.relative_to(ROOT)} edits sys.path")
        wrong += [f"{path.relative_to(ROOT)} imports {m}" for m in _imported_modules(path) if m.split(".")[0] == "tests"]
    assert not wrong, "\n".join(wrong)


def _function_lengths() -> list[tuple[str, str, int]]:
    found = []
    for path in _python_files(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.name, node.end_lineno - node.lineno + 1))
    return found


def test_few_long_functions_and_the_named_ones_short():
    lengths = _function_lengths()
    long = sorted((n, f"{where} {name}") for where, name, n in lengths if n > LONG_FUNCTION)
    assert len(long) <= MAX_LONG_FUNCTIONS, f"{len(long)} functions over {LONG_FUNCTION} lines: {long}"
    over_cap = [(where, name, n) for where, name, n in lengths if name in CAPPED_FUNCTIONS and n > CAPPED_FUNCTIONS[name]]
    assert not over_cap, over_cap


def test_no_module_imports_more_than_12_project_modules():
    modules = _project_modules()
    heavy = {}
    for name, path in modules.items():
        if name in FAN_OUT_EXEMPT:
            continue
        imported = _project_imports(path, modules)
        if len(imported) > MAX_PROJECT_IMPORTS:
            heavy[name] = len(imported)
    assert not heavy, heavy


def test_readme_is_a_front_door_of_at_most_180_lines_whose_links_resolve():
    """The set-up, what the main job shows, the ways in and links; the rest lives in docs/."""
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 180
    for page in [readme, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to a missing {target}"
