"""The tests' own layout: what test modules share lives in tests/support, never in another test module."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_test_module_imports_another() -> None:
    modules = sorted(TESTS.rglob("test_*.py"))
    assert len(modules) > 100  # the walk sees the suite
    found = {
        f"{path.relative_to(TESTS)} imports {name}"
        for path in modules
        for name in _imported(path)
        if name.startswith("tests.") and name.split(".")[-1].startswith("test_")
    }
    assert not found, "move what they share into tests/support: " + "; ".join(sorted(found))


def test_the_walk_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("from tests.unit.test_avro import FakeRegistry\nimport tests.support.db\n")
    assert _imported(module) == {"tests.unit.test_avro", "tests.support.db"}
