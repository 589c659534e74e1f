"""The shape of the package, read from the source with ``ast``: no import cycle, no upward import, small files.

The graph has an edge for every ``import`` and ``from ... import`` anywhere in a module (at
module level, inside functions, under ``TYPE_CHECKING``): a function-level import is a dependency
too, only a later one. Importing ``cdc.a.b`` runs the package ``cdc.a`` first, so such an import
is also an edge to ``cdc.a`` (unless the importer is inside ``cdc.a``, already being imported).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

SRC: Final = Path(__file__).resolve().parents[2] / "src"
PACKAGE: Final = SRC / "cdc"
MAX_LINES: Final = 600

# What the decoder (bytes in, events out) must never depend on, directly or through another module.
DECODER_MUST_NOT_IMPORT: Final = ("cdc.config", "cdc.catalog", "cdc.sink", "cdc.snapshot", "cdc.pipeline", "cdc.outbox")

# One-way layers between packages (docs/architecture.md): the package on the left never depends, directly or
# through another module, on those on the right. The row codec (cdc.render) writes the sink's bytes fast;
# what the bytes are (RowRendering, RenderedRow, each format's row_rendering) is the sink's.
NEVER_IMPORTS: Final = {"cdc.sink": ("cdc.render",)}

# What a compiled extension (.pyx) may import of the package at its own import: the decoder's value parsers
# only. cdc.compiled loads every extension, and every layer imports cdc.compiled.
EXTENSION_MAY_IMPORT: Final = ("cdc.decoder.types",)


@dataclass(frozen=True, slots=True)
class Edge:
    target: str
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


MODULES: Final = {module_name(p): p for p in source_files()}


def _known(name: str) -> str | None:
    """The longest prefix of ``name`` that is a module of the package (None for other packages)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The names one import statement imports, as absolute dotted names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        base = module.split(".")
        if MODULES[module].name != "__init__.py":
            base.pop()
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, node.module] if node.module else base)
    else:
        assert node.module is not None
        prefix = node.module
    for alias in node.names:
        yield f"{prefix}.{alias.name}"  # a submodule, or a name in the module: _known() tells which


def imports_of(module: str) -> list[Edge]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    edges: dict[str, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for name in _imported(module, node):
            target = _known(name)
            if target is None:
                continue
            # The packages on the way are imported first, unless the importer is inside them.
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                step = ".".join(parts[:depth])
                if step == module or module.startswith(step + "."):
                    continue
                if step in MODULES:
                    edges.setdefault(step, node.lineno)
    return sorted((Edge(t, line) for t, line in edges.items()), key=lambda e: e.target)


GRAPH: Final = {m: imports_of(m) for m in MODULES}


def _cycle_through(start: str) -> list[tuple[str, Edge]] | None:
    """A shortest import path from ``start`` back to itself, as (importer, edge) steps."""
    came_from: dict[str, tuple[str, Edge]] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for module in frontier:
            for edge in GRAPH[module]:
                if edge.target == start:
                    path = [(module, edge)]
                    while module != start:
                        previous = came_from[module]
                        path.append(previous)
                        module = previous[0]
                    return path[::-1]
                if edge.target not in came_from:
                    came_from[edge.target] = (module, edge)
                    following.append(edge.target)
        frontier = following
    return None


def _describe(path: list[tuple[str, Edge]]) -> str:
    return " -> ".join(f"{importer} (line {edge.line})" for importer, edge in path) + f" -> {path[0][0]}"


def _reachable(start: str) -> dict[str, list[tuple[str, Edge]]]:
    """Every module ``start`` imports, directly or not, with one import path to it."""
    paths: dict[str, list[tuple[str, Edge]]] = {start: []}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for module in frontier:
            for edge in GRAPH[module]:
                if edge.target not in paths:
                    paths[edge.target] = [*paths[module], (module, edge)]
                    following.append(edge.target)
        frontier = following
    return paths


def test_the_graph_sees_module_level_function_level_and_package_imports() -> None:
    # Known edges of each kind, so that an empty graph cannot pass the tests below.
    assert "cdc.lsn" in {e.target for e in GRAPH["cdc.decoder.pgoutput"]}  # module level
    assert "cdc.pipeline" in {e.target for e in GRAPH["cdc.cli"]}  # inside a function
    assert "cdc.outbox" in {e.target for e in GRAPH["cdc.pipeline.routing"]}  # the package of cdc.outbox.route
    assert "cdc.decoder.types.convert" in {e.target for e in GRAPH["cdc.decoder.types"]}  # a package's own module
    assert "cdc.decoder.types" not in {e.target for e in GRAPH["cdc.decoder.types.convert"]}


def test_no_module_imports_itself_back_through_others() -> None:
    reachable = {m: set(_reachable(m)) - {m} for m in GRAPH}
    cycles: dict[frozenset[str], str] = {}
    for module in sorted(GRAPH):
        members = frozenset({module} | {other for other in reachable[module] if module in reachable[other]})
        path = _cycle_through(module)
        if path is not None and members not in cycles:
            cycles[members] = f"{len(members)} modules ({', '.join(sorted(members))}), e.g. {_describe(path)}"
    assert not cycles, "import cycles:\n" + "\n".join(cycles.values())


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m == "cdc.decoder" or m.startswith("cdc.decoder.")))
def test_the_decoder_depends_on_no_configuration_catalog_sink_snapshot_pipeline_or_outbox(module: str) -> None:
    upward = {
        target: path
        for target, path in _reachable(module).items()
        if any(target == f or target.startswith(f + ".") for f in DECODER_MUST_NOT_IMPORT)
    }
    assert not upward, f"{module} imports, directly or not:\n" + "\n".join(
        f"{target}: {' -> '.join(f'{importer} (line {edge.line})' for importer, edge in path)} -> {target}"
        for target, path in sorted(upward.items())
    )


@pytest.mark.parametrize(
    ("module", "forbidden"),
    sorted(
        (m, forbidden)
        for package, forbidden in NEVER_IMPORTS.items()
        for m in MODULES
        if m == package or m.startswith(package + ".")
    ),
)
def test_the_sink_never_imports_the_row_codec(module: str, forbidden: tuple[str, ...]) -> None:
    upward = {
        target: path
        for target, path in _reachable(module).items()
        if any(target == f or target.startswith(f + ".") for f in forbidden)
    }
    assert not upward, f"{module} imports, directly or not:\n" + "\n".join(
        f"{target}: {' -> '.join(f'{importer} (line {edge.line})' for importer, edge in path)} -> {target}"
        for target, path in sorted(upward.items())
    )


def test_the_chooser_is_a_leaf_and_the_extensions_it_loads_import_only_the_decoders_value_parsers() -> None:
    assert GRAPH["cdc.compiled"] == [], "cdc.compiled imports other modules of the package"
    extensions = sorted(PACKAGE.rglob("*.pyx"))
    assert len(extensions) >= 5
    imported = re.compile(r"^\s*(?:from|import)\s+(cdc(?:\.\w+)*)", re.MULTILINE)
    wrong = {
        path.relative_to(SRC).as_posix(): name
        for path in extensions
        for name in imported.findall(path.read_text())
        if not any(name == allowed or name.startswith(allowed + ".") for allowed in EXTENSION_MAY_IMPORT)
    }
    assert not wrong, f"compiled extensions importing the package beyond {EXTENSION_MAY_IMPORT}: {wrong}"


def _lines(relative: str) -> int:
    return len((PACKAGE / relative).read_text().splitlines())


def test_no_file_is_over_600_lines() -> None:
    relatives = [p.relative_to(PACKAGE).as_posix() for p in source_files()]
    long = {r: _lines(r) for r in relatives if _lines(r) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: " + ", ".join(f"{r} ({n})" for r, n in sorted(long.items()))


def test_no_two_test_modules_share_a_file_name() -> None:
    # pytest imports test modules outside a package by their base name ("rootdir" import mode), so two
    # test_x.py in tests/unit and tests/integration make the second fail to collect: in a full run only.
    tests = Path(__file__).resolve().parents[1]
    by_name: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            by_name.setdefault(path.name, []).append(path.relative_to(tests).as_posix())
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, "rename one of: " + "; ".join(", ".join(sorted(p)) for p in shared.values())


# Flat lookup tables may run longer: one entry a line, nothing to split.
LONG_TABLES: Final = {"cdc/sink/typemap.py:_builtin_spec"}
MAX_FUNCTION_LINES: Final = 80


def test_no_function_is_over_80_lines_but_the_flat_lookup_tables() -> None:
    """The daemon's package and the Spark jobs' (``spark/cdc_views``)."""
    spark = SRC.parent / "spark"
    long = []
    for path in [*source_files(), *sorted((spark / "cdc_views").rglob("*.py"))]:
        root = spark if path.is_relative_to(spark) else SRC
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1 if node.end_lineno else 0
                name = f"{path.relative_to(root)}:{node.name}"
                if lines > MAX_FUNCTION_LINES and name not in LONG_TABLES:
                    long.append(f"{name} ({lines} lines)")
    assert not long, f"over {MAX_FUNCTION_LINES} lines (split into named steps): " + ", ".join(long)
