"""What changed between two Avro record schemas, field by field and in words (the registry client's
refusal message names them), and the named types of a schema document (Spark's Avro reader resolves
references with them)."""

from __future__ import annotations

from typing import Any, Final

import orjson

_NAMED: Final = frozenset({"record", "enum", "fixed"})


def describe_changes(old: Any, new: Any) -> list[str]:
    """The differences between two Avro record schemas, field by field, in words.

    Nested records are compared once each, named by their short name (``Value.email``).
    Only the shape matters here (names, types, defaults); the registry decides compatibility.
    """
    out: list[str] = []
    _diff(old, new, named_types(old), named_types(new), "", set(), out)
    return out


def named_types(schema: Any) -> dict[str, Any]:
    """Full name -> definition of every named type (records, enums, fixed) in a schema document."""
    names: dict[str, Any] = {}

    def walk(node: Any, namespace: str) -> None:
        if isinstance(node, list):
            for branch in node:
                walk(branch, namespace)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in _NAMED and isinstance(node.get("name"), str):
                full = _fullname(node["name"], node.get("namespace", namespace))
                names[full] = node
                namespace = full.rpartition(".")[0]
            if kind == "record":
                for field in node.get("fields", []):
                    walk(field.get("type"), namespace)
            elif kind == "array":
                walk(node.get("items"), namespace)
            elif kind == "map":
                walk(node.get("values"), namespace)
            elif isinstance(kind, dict | list):
                walk(kind, namespace)

    walk(schema, "")
    return names


def _fullname(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _resolve(node: Any, names: dict[str, Any]) -> Any:
    if isinstance(node, str) and node in names:
        return names[node]
    if isinstance(node, dict) and isinstance(node.get("type"), dict | list):
        return _resolve(node["type"], names)
    return node


def _label(node: Any, names: dict[str, Any]) -> str:
    node = _resolve(node, names)
    if isinstance(node, list):
        return "|".join(_label(branch, names) for branch in node)
    if isinstance(node, str):
        return node.rpartition(".")[2] if "." in node else node
    if isinstance(node, dict):
        kind = node.get("type")
        if kind in _NAMED:
            return f"{kind} {node.get('name')}"
        if kind == "array":
            return f"array<{_label(node.get('items'), names)}>"
        if kind == "map":
            return f"map<{_label(node.get('values'), names)}>"
        logical = node.get("logicalType")
        label = str(kind)
        if logical == "decimal":
            label = f"decimal({node.get('precision')},{node.get('scale')})"
        elif logical:
            label = f"{kind}/{logical}"
        connect = node.get("connect.name")
        return f"{label} ({connect})" if connect and not logical else label
    return repr(node)


def _record(node: Any, names: dict[str, Any]) -> dict[str, Any] | None:
    """The record inside ``node`` (itself, a reference to it, or the one record of a nullable union)."""
    node = _resolve(node, names)
    if isinstance(node, dict) and node.get("type") == "record":
        return node
    if isinstance(node, list):
        records = [r for r in (_record(b, names) for b in node if b != "null") if r is not None]
        if len(records) == 1 and len(node) <= 2:
            return records[0]
    return None


def _diff(
    old: Any, new: Any, old_names: dict[str, Any], new_names: dict[str, Any], path: str, seen: set[str], out: list[str]
) -> None:
    old_record, new_record = _record(old, old_names), _record(new, new_names)
    if old_record is None or new_record is None:
        old_label, new_label = _label(old, old_names), _label(new, new_names)
        if old_label != new_label:
            out.append(f"{path or 'the schema'} changed type from {old_label} to {new_label}")
        return
    if _nullable(old, old_names) != _nullable(new, new_names) and path:
        out.append(f"{path} became {'optional' if _nullable(new, new_names) else 'required'}")
    name = str(new_record.get("name", ""))
    if old_record.get("name") != name:
        out.append(f"record {old_record.get('name')} was renamed {name}")
    if name in seen:
        return
    seen.add(name)
    short = name.rpartition(".")[2]
    old_fields = {f["name"]: f for f in old_record.get("fields", []) if isinstance(f, dict) and "name" in f}
    new_fields = {f["name"]: f for f in new_record.get("fields", []) if isinstance(f, dict) and "name" in f}
    for field_name in old_fields:
        if field_name not in new_fields:
            out.append(f"{short}.{field_name} was removed")
    for field_name, field in new_fields.items():
        if field_name not in old_fields:
            kind = _label(field.get("type"), new_names)
            default = (
                "with default " + orjson.dumps(field["default"]).decode() if "default" in field else "without a default"
            )
            out.append(f"{short}.{field_name} was added ({kind}, {default})")
            continue
        _diff(
            old_fields[field_name].get("type"),
            field.get("type"),
            old_names,
            new_names,
            f"{short}.{field_name}",
            seen,
            out,
        )


def _nullable(node: Any, names: dict[str, Any]) -> bool:
    node = _resolve(node, names)
    return isinstance(node, list) and "null" in node
