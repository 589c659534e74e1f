"""cdc.snapshot.sqljson: which tables the server can build the JSON of (the SQL itself is tested against a
real server in tests/integration/test_snapshot_server_json.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.event import Column, PgType, TableSchema, TypeKind
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.snapshot.plan import Chunk, SnapshotTable
from cdc.snapshot.sqljson import json_query

ID = Column("id", PgType(20, "int8"), key=True, nullable=False)


def numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def query_for(column: Column, **settings: Any) -> Any:
    schema = TableSchema("public", "t", (ID, column))
    table = SnapshotTable("public.t", 1, schema, ("id",), ("bigint",), False)
    json_settings = JsonSettings(topic_prefix="p", database="d", **settings)
    parts = JsonSerializer(json_settings, lambda _t: 1).read_parts(schema, 0, 1, None)
    return json_query(table, parts, json_settings)


@pytest.mark.parametrize(
    "column",
    [
        Column("c", PgType(16, "bool")),
        Column("c", PgType(25, "text")),
        Column("c", PgType(1042, "bpchar"), 9),
        Column("c", PgType(3802, "jsonb")),
        Column("c", PgType(2950, "uuid")),
        Column("c", PgType(17, "bytea")),
        Column("c", PgType(1700, "numeric"), numeric(18, 4)),
        Column("c", PgType(1700, "numeric"), numeric(5, 0)),
        Column("c", PgType(1184, "timestamptz"), 3),
        Column("c", PgType(1114, "timestamp")),
        Column("c", PgType(1082, "date")),
        Column("c", PgType(99999, "mood", TypeKind.ENUM, "public", labels=("a", "b"))),
    ],
)
def test_tables_of_covered_types_get_a_query(column: Column) -> None:
    query = query_for(column)
    assert query is not None
    assert "COPY (SELECT " in repr(query.copy(Chunk("public.t", 0, None)))


@pytest.mark.parametrize(
    ("column", "settings"),
    [
        (Column("c", PgType(701, "float8")), {}),
        (Column("c", PgType(1700, "numeric")), {}),  # no declared precision: VariableScaleDecimal
        (Column("c", PgType(1700, "numeric"), numeric(19, 2)), {}),  # more than int8 holds
        (Column("c", PgType(1700, "numeric"), numeric(10, -2)), {}),  # negative scale
        (Column("c", PgType(1700, "numeric"), numeric(10, 2)), {"decimal_handling": "string"}),
        (Column("c", PgType(1114, "timestamp")), {"time_precision": "iso"}),
        (Column("c", PgType(1082, "date")), {"time_precision": "iso"}),
        (Column("c", PgType(1186, "interval")), {}),
        (Column("c", PgType(1007, "_int4", TypeKind.ARRAY, element=PgType(23, "int4"))), {}),
        (Column("c", PgType(99998, "email", TypeKind.DOMAIN, "public", element=PgType(25, "text"))), {}),
        (Column("c", PgType(99997, "hstore", TypeKind.BASE, "public")), {}),
    ],
)
def test_a_column_without_an_sql_encoding_leaves_the_table_to_the_ordinary_path(column: Column, settings: Any) -> None:
    assert query_for(column, **settings) is None
