"""The package's layers (docs/architecture.md, "Layers"): each package of ``cdc`` imports only packages of
lower layers, read from the source with ``ast`` (module level and inside functions alike).

The configuration models form one unit wherever they live (``cdc.config`` and the sections it embeds), so
that a package's own section does not count as the package importing the configuration's whole tree.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

SRC: Final = Path(__file__).resolve().parents[2] / "src"

# Lowest first. A package may import packages of lower layers only (never one of its own layer).
LAYERS: Final = (
    ("lsn", "values", "compiled", "log", "process"),  # plain values and process-wide switches
    ("event", "failover", "replication", "dev"),  # the event model; the replication transport; dev services
    ("config", "schema_history"),  # the configuration models; the schema history's records
    ("selection", "columns", "decoder", "sink"),  # bytes -> events; events -> records
    ("render", "outbox", "catalog"),  # the row codec over both; outbox routing; the server's catalog
    ("instance", "observe", "snapshot"),  # the instance lock, metrics, snapshots
    ("pipeline", "status", "reference", "demo"),  # the daemon's wiring and loop; tools beside it
    ("cli",),
)
CONFIG_MODELS: Final = ("cdc.config", "cdc.declared", "cdc.toast", "cdc.snapshot.config", "cdc.outbox.config")
CONFIG_MODELS_IN_SINK: Final = ("cdc.sink.settings",)


def unit(module: str) -> str:
    for model in CONFIG_MODELS + CONFIG_MODELS_IN_SINK:
        if module == model or module.startswith(model + "."):
            return "config"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "cdc"


def layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    raise AssertionError(f"package cdc.{name} has no layer: add it to LAYERS and to docs/architecture.md")


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "cdc":
                found.update(f"cdc.{alias.name}" for alias in node.names)
            elif node.module.startswith("cdc."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("cdc."))
    return found


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def upward_imports() -> list[str]:
    wrong = []
    for path in sorted((SRC / "cdc").rglob("*.py")):
        module = module_of(path)
        here = unit(module)
        if here == "cdc":
            continue
        for target in sorted(imports(path)):
            there = unit(target)
            if there not in (here, "cdc") and layer_of(there) >= layer_of(here):
                wrong.append(
                    f"{module} (cdc.{here}, layer {layer_of(here)}) imports {target} (layer {layer_of(there)})"
                )
    return wrong


def test_every_package_imports_only_lower_layers() -> None:
    wrong = upward_imports()
    assert not wrong, "imports against the layers of docs/architecture.md:\n" + "\n".join(wrong)


def test_every_package_has_a_layer() -> None:
    packages = {unit(module_of(p)) for p in (SRC / "cdc").rglob("*.py")} - {"cdc"}
    assert len(packages) > 20
    for name in packages:
        layer_of(name)


def test_the_walk_sees_imports_in_functions_and_from_the_package(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from cdc import lsn\n\ndef f():\n    from cdc.sink.json import JsonSerializer\n    import cdc.event\n"
    )
    assert imports(source) == {"cdc.lsn", "cdc.sink.json", "cdc.event"}
    assert [unit(m) for m in ("cdc.sink.settings", "cdc.snapshot.config", "cdc.sink.json")] == [
        "config",
        "config",
        "sink",
    ]
