"""Connect schemas -> Avro schemas, as Confluent's AvroData writes them.

Schemas, as Debezium's Connect schemas become Avro through Confluent's AvroData
(``connect.meta.data=true``, ``schema.name.adjustment.mode=avro``, ``field.name.adjustment.mode=avro``)
    * A struct ``a.b.C`` is a record named ``C`` in namespace ``a.b``; a named type used twice
      (``before``/``after`` share ``Value``) is defined once and then referenced by full name.
    * Optional: ``["null", T]`` with default null; with a Connect default, ``[T, "null"]`` and
      that default (``source.snapshot``: ``"false"``).
    * Metadata: ``connect.doc``, ``connect.version``, ``connect.parameters``, ``connect.default``,
      ``connect.name``; int16 is an Avro int with ``connect.type: int16``.
    * Decimal: bytes with ``scale``, ``precision`` (64 when the Connect schema has none, as for
      money) and ``logicalType: decimal``. AvroData keeps ``logicalType`` even where the Avro spec
      forbids it (numeric with a negative scale or a scale above the precision, PostgreSQL 15+);
      there this module leaves it out, so that the schema parses everywhere (fastavro refuses
      it; Java's Avro ignores it); the bytes and ``connect.*`` metadata are the same.
    * Names: every dot-separated part of a record name and every field name keeps
      ``[A-Za-z0-9_]``, anything else becomes ``_``, as does a leading digit
      (``my-prefix.public.2024`` -> ``my_prefix.public._024``). Two columns whose names become the
      same field are an error.
"""

from __future__ import annotations

import re
from typing import Any, Final

from cdc.sink.connect import ConnectSchema

_DECIMAL: Final = "org.apache.kafka.connect.data.Decimal"
_DECIMAL_PRECISION_DEFAULT: Final = 64  # AvroData's, for a Decimal without connect.decimal.precision
_PRIMITIVES: Final = {
    "boolean": "boolean",
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float": "float",
    "double": "double",
    "bytes": "bytes",
    "string": "string",
}
_INVALID_NAME_CHARS: Final = re.compile(r"[^A-Za-z0-9_]")


def avro_name(name: str) -> str:
    """A Connect schema name as a valid Avro full name (``schema.name.adjustment.mode=avro``)."""
    return ".".join(avro_field_name(part) for part in name.split("."))


def avro_field_name(name: str) -> str:
    """A valid Avro name: characters outside ``[A-Za-z0-9_]``, and a leading digit, become ``_``."""
    if not name:
        return "_"
    adjusted = _INVALID_NAME_CHARS.sub("_", name)
    if adjusted[0].isdigit():
        adjusted = "_" + adjusted[1:]
    return adjusted


def avro_schema(schema: ConnectSchema) -> Any:
    """The Avro schema of a Connect struct, as AvroData writes it (one document: names defined once)."""
    return _AvroDocument().record(schema)


class _AvroDocument:
    """Connect schemas -> one Avro schema document; each named type is defined once, then referenced."""

    def __init__(self) -> None:
        self._defined: set[str] = set()

    def record(self, spec: ConnectSchema) -> Any:
        if spec.type != "struct" or spec.name is None:
            raise ValueError(f"an Avro record needs a named Connect struct, not {spec.type} {spec.name!r}")
        full = avro_name(spec.name)
        if full in self._defined:
            return full
        self._defined.add(full)
        namespace, _, name = full.rpartition(".")
        node: dict[str, Any] = {"type": "record", "name": name}
        if namespace:
            node["namespace"] = namespace
        fields: list[dict[str, Any]] = []
        for field_name, field_spec, optional in spec.fields:
            field: dict[str, Any] = {"name": avro_field_name(field_name), "type": self.field_type(field_spec, optional)}
            if optional:
                field["default"] = _default(field_spec) if field_spec.default is not None else None
            fields.append(field)
        node["fields"] = fields
        _connect_metadata(node, spec)
        return node

    def field_type(self, spec: ConnectSchema, optional: bool) -> Any:
        base = self.base(spec)
        if not optional:
            return base
        return [base, "null"] if spec.default is not None else ["null", base]

    def base(self, spec: ConnectSchema) -> Any:
        if spec.type == "struct":
            return self.record(spec)
        if spec.type == "array":
            if spec.items is None:
                raise ValueError("a Connect array needs an item schema")
            node: dict[str, Any] = {"type": "array", "items": self.field_type(spec.items, True)}
            _connect_metadata(node, spec)
            return node
        primitive = _PRIMITIVES[spec.type]
        node = {"type": primitive}
        decimal = spec.type == "bytes" and spec.name == _DECIMAL
        scale = precision = 0
        if decimal:
            parameters = dict(spec.parameters)
            scale = int(parameters.get("scale", "0"))
            precision = int(parameters.get("connect.decimal.precision", str(_DECIMAL_PRECISION_DEFAULT)))
            node["scale"] = scale
            node["precision"] = precision
        _connect_metadata(node, spec)
        if decimal and precision > 0 and 0 <= scale <= precision:
            node["logicalType"] = "decimal"
        return node if len(node) > 1 else primitive


def _connect_metadata(node: dict[str, Any], spec: ConnectSchema) -> None:
    """AvroData's ``connect.*`` properties, in its order."""
    if spec.doc is not None:
        node["connect.doc"] = spec.doc
    if spec.version is not None:
        node["connect.version"] = spec.version
    if spec.parameters:
        node["connect.parameters"] = dict(spec.parameters)
    if spec.default is not None:
        node["connect.default"] = _default(spec)
    if spec.name is not None:
        node["connect.name"] = avro_name(spec.name) if spec.type == "struct" else spec.name
    if spec.type in ("int8", "int16"):
        node["connect.type"] = spec.type


def _default(spec: ConnectSchema) -> Any:
    if spec.type != "string":
        raise ValueError(f"no Avro default for a {spec.type} Connect default {spec.default!r}")
    return spec.default
