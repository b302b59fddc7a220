"""The layering rules of ARCHITECTURE.md, checked on the source: imports point down only.

``store`` and ``models`` import nothing from the other folders; ``producers`` and ``consumers`` import
``store`` and ``models`` but never each other; nothing imports ``flows``. Inside ``flows/`` the rooms
point down too: ``ops`` (everything that starts or stops a process) imports no other room, ``pools``
only ``ops``, the flows themselves ``pools`` and ``ops``, ``loop`` the flows, ``demo`` the loop; ``lab``
(benchmarks, evaluations) is a leaf that only ``cli`` imports, and nothing imports ``cli``. No two
modules import each other, even through others. Every module is read with ``ast``, so an import
inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("store", "models", "producers", "consumers", "flows")
ALLOWED: dict[str, set[str]] = {
    "store": {"store"},
    "models": {"models"},
    "producers": {"producers", "store", "models"},
    "consumers": {"consumers", "store", "models"},
    "flows": set(FOLDERS),
}
MAX_LINES = 500


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _imported_folders(path: Path) -> set[tuple[str, int]]:
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "prmloop" and len(parts) > 1:
                found.add((parts[1], node.lineno))
            elif parts[0] in FOLDERS:
                found.add((f"bare:{parts[0]}", node.lineno))
    return found


@pytest.mark.parametrize("folder", FOLDERS)
def test_imports_point_down_only(folder: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports prmloop.{target}"
        for path in _modules(folder)
        for target, line in _imported_folders(path)
        if target not in ALLOWED[folder]
    ]
    assert wrong == [], "layering broken (ARCHITECTURE.md):\n" + "\n".join(wrong)


#: Modules within 10 % of the limit, each one concern (a file is split by concern, not to pass the cap).
#: (flows/ops/stack.py was one, at 473 lines, until the reading of the services' records moved to
#: flows/ops/services.py; stack.py starts and stops them.)
ONE_CONCERN: dict[str, str] = {}


def test_no_module_is_longer_than_the_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for folder in FOLDERS
        for path in _modules(folder)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert long == [], f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


def test_a_module_near_the_limit_is_one_concern() -> None:
    near = {
        str(path.relative_to(ROOT))
        for folder in FOLDERS
        for path in _modules(folder)
        if len(path.read_text(encoding="utf-8").splitlines()) > 0.9 * MAX_LINES
    }
    assert near <= set(ONE_CONCERN), f"split by concern, or say why it is one: {sorted(near - set(ONE_CONCERN))}"


def test_every_folder_says_what_it_owns() -> None:
    for path in [ROOT / f / "__init__.py" for f in FOLDERS]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{path.relative_to(ROOT)} has no docstring saying what the folder owns"


def test_no_module_imports_another_modules_private_names() -> None:
    wrong = []
    for folder in FOLDERS:
        for path in _modules(folder):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prmloop."):
                    wrong += [
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{alias.name}"
                        for alias in node.names
                        if alias.name.startswith("_")
                    ]
    assert wrong == [], "a private name used across modules belongs to one of them, or is public:\n" + "\n".join(wrong)


#: The rooms of ``flows/`` and the rooms each may import (``flows`` is its top level: the Prefect flows).
FLOW_ROOMS: dict[str, set[str]] = {
    "ops": {"ops"},
    "pools": {"pools", "ops"},
    "flows": {"flows", "pools", "ops"},
    "loop": {"loop", "flows", "pools", "ops"},
    "demo": {"demo", "loop", "flows", "pools", "ops"},
    "lab": {"lab", "demo", "loop", "flows", "pools", "ops"},
    "cli": {"cli", "lab", "demo", "loop", "flows", "pools", "ops"},
}
#: Outside ``flows/ops``, ``flows/lab`` and ``flows/cli`` no module starts a process, but these: the
#: embedded DuckLake catalog's PostgreSQL (``pgserver``, started and stopped with the lake it serves),
#: ``initdb`` for it, and the grading sandbox (one worker process per grader, so a runaway grade is killed).
STARTS_PROCESSES = {"store/tables/pg_local.py", "store/auth/pg_auth.py", "models/grading_worker.py"}
_PROCESS = re.compile(r"\b(subprocess|multiprocessing)\b|\bos\.(fork|exec\w*|spawn\w*|posix_spawn)\(")


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in FLOW_ROOMS else "flows"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(["prmloop", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def _typing_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: annotations only, never run."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }


def _import_graph() -> dict[str, set[str]]:
    """Which modules each module imports when it runs (imports under ``TYPE_CHECKING`` left out)."""
    modules = {_module_name(path): path for folder in FOLDERS for path in _modules(folder)}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def test_the_rooms_of_flows_point_down_only() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in _import_graph().items()
        if module.startswith("prmloop.flows.")
        for target in targets
        if target.startswith("prmloop.flows.") and _room(target) not in FLOW_ROOMS[_room(module)]
    ]
    assert wrong == [], "a room of flows/ imports one above it (ARCHITECTURE.md):\n" + "\n".join(wrong)


def test_no_import_circle() -> None:
    graph = _import_graph()
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == [], "modules that import each other:\n" + "\n".join(circles)


def test_only_ops_lab_and_cli_start_processes() -> None:
    rooms = ("flows/ops/", "flows/lab/", "flows/cli/")
    wrong = [
        f"{rel}:{number}: {line.strip()}"
        for folder in FOLDERS
        for path in _modules(folder)
        if not (rel := str(path.relative_to(ROOT))).startswith(rooms) and rel not in STARTS_PROCESSES
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _PROCESS.search(line.split("#")[0]) and not line.lstrip().startswith(("#", '"', "``", ":"))
    ]
    assert wrong == [], "a process started outside flows/ops (or the lab and CLI):\n" + "\n".join(wrong)


def test_every_package_folder_is_installed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {_module_name(path) for folder in FOLDERS for path in (ROOT / folder).rglob("__init__.py")}
    assert listed == found, f"pyproject.toml's packages differ from the folders: {sorted(listed ^ found)}"
