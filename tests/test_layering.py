"""The layering rules of ARCHITECTURE.md, checked on the source: imports point down only.

``store`` and ``models`` import nothing from the other folders; ``producers`` and ``consumers`` import
``store`` and ``models`` but never each other; nothing imports ``flows``. Every module is read with
``ast``, so an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
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


def test_no_module_is_longer_than_the_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for folder in FOLDERS
        for path in _modules(folder)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert long == [], f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


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
