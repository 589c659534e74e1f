"""Kafka Connect schemas: ``ConnectSchema`` (one type's schema and how a value is encoded for it, in JSON
and in Avro), the schema node JsonConverter writes, and Debezium's fixed schemas (source block,
transaction block, envelope, truncate marker key, logical message).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

Encoder = Callable[[Any], Any]
"""A column value (as ``cdc.values`` defines it, never None) -> what the format writes."""

ColumnField = tuple[str, Encoder | None, Any]
"""(column name, encoder, unchanged-TOAST placeholder): one column of a format's plan."""


@dataclass(frozen=True, slots=True)
class ConnectSchema:
    """One Connect schema and how to encode a value for it, in JSON and in Avro.

    The type mapping is written once, here; ``cdc.sink.avro`` turns the same schema into
    an Avro schema (as Confluent's AvroData does) and writes values with ``avro``.
    """

    type: str  # Connect type: boolean int16 int32 int64 float double bytes string array struct
    encode: Encoder | None  # JSON: what orjson writes; None: the value is its own JSON
    name: str | None = None
    version: int | None = None
    doc: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()
    fields: tuple[tuple[str, ConnectSchema, bool], ...] = ()  # struct members: (field, spec, optional)
    items: ConnectSchema | None = None  # arrays
    default: str | None = None
    avro: Encoder | None = None  # Avro: what fastavro writes (bytes as bytes, NaN as NaN); None: the value itself

    def node(self, optional: bool, field: str | None = None) -> dict[str, Any]:
        """The JSON schema node, keys in JsonConverter's order."""
        node: dict[str, Any] = {"type": self.type}
        if self.type == "struct":
            node["fields"] = [spec.node(opt, name) for name, spec, opt in self.fields]
        elif self.items is not None:
            node["items"] = self.items.node(True)
        node["optional"] = optional
        if self.name is not None:
            node["name"] = self.name
        if self.version is not None:
            node["version"] = self.version
        if self.doc is not None:
            node["doc"] = self.doc
        if self.parameters:
            node["parameters"] = dict(self.parameters)
        if self.default is not None:
            node["default"] = self.default
        if field is not None:
            node["field"] = field
        return node


BOOLEAN: Final = ConnectSchema("boolean", None)
INT16: Final = ConnectSchema("int16", None)
INT32: Final = ConnectSchema("int32", None)
INT64: Final = ConnectSchema("int64", None)
STRING: Final = ConnectSchema("string", None)
BYTES_NODE: Final = ConnectSchema("bytes", None)
DOUBLE_NODE: Final = ConnectSchema("double", None)

_SNAPSHOT_ALLOWED: Final = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"

SOURCE_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.postgresql.Source",
    version=1,
    fields=(
        ("version", STRING, False),
        ("connector", STRING, False),
        ("name", STRING, False),
        ("ts_ms", INT64, False),
        (
            "snapshot",
            ConnectSchema(
                "string",
                None,
                name="io.debezium.data.Enum",
                version=1,
                parameters=(("allowed", _SNAPSHOT_ALLOWED),),
                default="false",
            ),
            True,
        ),
        ("db", STRING, False),
        ("sequence", STRING, True),
        ("ts_us", INT64, True),
        ("ts_ns", INT64, True),
        ("schema", STRING, False),
        ("table", STRING, False),
        ("txId", INT64, True),
        ("lsn", INT64, True),
        ("xmin", INT64, True),
        ("origin", STRING, True),
        ("origin_lsn", INT64, True),
    ),
)

TRANSACTION_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="event.block",
    version=1,
    fields=(("id", STRING, False), ("total_order", INT64, False), ("data_collection_order", INT64, False)),
)


def _dumps_node(node: dict[str, Any]) -> bytes:
    return orjson.dumps(node)


def envelope_schema(topic: str, row: ConnectSchema) -> ConnectSchema:
    """Debezium's ``<topic>.Envelope`` v2 around the table's ``<topic>.Value`` struct."""
    return ConnectSchema(
        "struct",
        None,
        name=f"{topic}.Envelope",
        version=2,
        fields=(
            ("before", row, True),
            ("after", row, True),
            ("source", SOURCE_SCHEMA, False),
            ("transaction", TRANSACTION_SCHEMA, True),
            ("op", STRING, False),
            ("ts_ms", INT64, True),
            ("ts_us", INT64, True),
            ("ts_ns", INT64, True),
        ),
    )


def truncate_key_schema(topic: str, key_members: Sequence[tuple[str, ConnectSchema, bool]]) -> ConnectSchema:
    """The key struct of truncate markers, ``<topic>.TruncateKey``: the table's key fields, each optional (the
    marker's are all null). The same field names as the Key, so a consumer that maps key fields to columns
    (Debezium's JDBC sink with ``primary.key.mode=record_key``) finds no new column in a marker."""
    return ConnectSchema(
        "struct", None, name=f"{topic}.TruncateKey", fields=tuple((n, spec, True) for n, spec, _ in key_members)
    )


def schema_prefix(node: dict[str, Any]) -> bytes:
    return b'{"schema":' + _dumps_node(node) + b',"payload":'


MESSAGE_KEY_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.postgresql.MessageKey",
    version=1,
    fields=(("prefix", STRING, True),),
)

MESSAGE_VALUE_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.postgresql.MessageValue",
    version=1,
    fields=(
        ("op", STRING, False),
        ("ts_ms", INT64, True),
        ("source", SOURCE_SCHEMA, False),
        (
            "message",
            ConnectSchema(
                "struct",
                None,
                name="io.debezium.connector.postgresql.Message",
                version=1,
                fields=(("prefix", STRING, True), ("content", BYTES_NODE, True)),
            ),
            False,
        ),
    ),
)
