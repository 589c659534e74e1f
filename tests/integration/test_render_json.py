"""Rows the decoder renders straight into JSON text or Avro binary make the very records the typed path makes.

The streaming fast path (``RowRendering``, ``RenderedRow``) skips the typed values of most
columns. These tests take real pgoutput payloads from a server (every built-in type of
``test_decoder_types``, and edge values of each type rendered directly), feed them to a decoder
that renders and to one that does not, serialize both with the same settings and a fixed clock,
and compare the records byte for byte: topic, key, value, headers. Keys must be identical bytes,
because compaction groups records by key bytes. (Avro against a stand-in registry that numbers
subjects: the schemas are the serializer's either way; ``test_avro_registry`` has the real one.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.catalog import TableInfo
from cdc.decoder.changes import ChangeDecoder
from cdc.event import ChangeEvent, PgType
from cdc.lsn import Lsn
from cdc.render.codec import TableRenderer
from cdc.sink.avro import AvroSerializer, AvroSettings
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.record import Record
from cdc.sink.records import EventSerializer
from cdc.sink.rendering import RenderedRow
from tests.support.decoder_harness import DecoderSession, changes, mark
from tests.support.type_cases import server_cases, server_setup, xml_available

pytestmark = pytest.mark.integration

NOW_NS = 1_700_000_000_123_456_789

# Columns of the directly rendered types, each with edge values; row k takes value k % len of each.
EDGES: list[tuple[str, str, list[str]]] = [
    (
        "t",
        "text",
        [
            "'plain'",
            "''",
            "E'quote \" backslash \\\\ newline \\n tab \\t cr \\r'",
            "'é ü 😀 中'",
            "E'\\x01\\x1f control'",
            "'\\N'",
            "'%s %b %% %d'",
            "repeat('long ', 200)",
            "NULL",
            "'del \x7f'",
        ],
    ),
    (
        "n",
        "numeric(12, 2)",
        [
            "0",
            "-0.5",
            "1.25",
            "9999999999.99",
            "-9999999999.99",
            "1.27",
            "1.28",
            "-1.28",
            "-1.29",
            "0.01",
            "-0.01",
            "NULL",
            "327.67",
            "327.68",
        ],
    ),
    (
        "n0",
        "numeric(18, 0)",
        ["0", "127", "128", "-128", "-129", "999999999999999999", "-999999999999999999", "255", "256"],
    ),
    (
        "ts",
        "timestamptz",
        [
            "'2024-01-31 12:34:56.123456+00'",
            "'2024-01-31 12:34:56+00'",
            "'2024-01-31 12:34:56.5+02'",
            "'1969-12-31 23:59:59.999999+00'",
            "'0001-01-01 00:00:00+00'",
            "'9999-12-31 23:59:59.999999+00'",
            "'2000-02-29 00:00:00.000001+00'",
            "NULL",
            "'2024-06-01 00:00:00.12+05:30'",
        ],
    ),
    ("ts0", "timestamptz(0)", ["'2024-01-31 12:34:56.7+00'", "'1970-01-01 00:00:00+00'", "NULL"]),
    (
        "ts3",
        "timestamptz(3)",
        ["'2024-01-31 12:34:56.1234+00'", "'2024-01-31 12:34:56+00'", "'2024-01-31 12:34:56.1+00'"],
    ),
    ("u", "uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12'", "NULL"]),
    ("b", "bool", ["true", "false", "NULL"]),
    ("j", "jsonb", ["""'{"a": "x\\"y", "b": [1, 2.50, null]}'""", "'\"é\"'", "'[]'", "NULL"]),
    ("js", "json", ["""'{"b": 1,  "a": "\\n"}'""", "'null'"]),
    ("i2", "int2", ["-32768", "32767", "0"]),
    ("i4", "int4", ["-2147483648", "2147483647"]),
    ("i8", "int8", ["-9223372036854775808", "9223372036854775807", "NULL"]),
    ("o", "oid", ["4294967295", "0"]),
    ("v", "varchar(20)", ["'abc'", "'a\"b'"]),
    ("c", "char(4)", ["'ab'", "'abcd'"]),
    ("nm", "name", ["'a_name'"]),
    ("x", "xml", ["'<a href=\"x\">b &amp; c</a>'"]),
]
EDGE_ROWS = 20

# Values no renderer covers: the row takes the typed path (and, for NaN under 'precise', its error).
UNCOVERED: list[tuple[str, str]] = [
    ("ts", "'infinity'"),
    ("ts", "'-infinity'"),
    ("ts", "'0044-03-15 12:00:00+00 BC'"),
    ("ts", "'10000-01-01 00:00:00+00'"),
    ("n", "'NaN'"),
]

SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("json", {}),
    ("json", {"schemas_enable": True}),
    ("json", {"decimal_handling": "string"}),
    ("json", {"decimal_handling": "double", "time_precision": "iso", "interval_handling": "string"}),
    ("avro", {}),
    ("avro", {"decimal_handling": "string"}),
    ("avro", {"decimal_handling": "double", "time_precision": "iso", "interval_handling": "string"}),
]


class Registry:
    """Numbers subjects as a registry would (no compatibility checks: the schemas never change here)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def register(self, subject: str, schema: Any, source: str | None = None) -> int:
        return self.ids.setdefault(subject, len(self.ids) + 1)


def make_serializer(fmt: str, overrides: dict[str, Any]) -> EventSerializer[Any]:
    if fmt == "avro":
        return AvroSerializer(
            AvroSettings(topic_prefix="render", database="db", **overrides),
            lambda topic: 2,
            Registry(),
            clock_ns=lambda: NOW_NS,
        )
    return JsonSerializer(
        JsonSettings(topic_prefix="render", database="db", **overrides), lambda topic: 2, clock_ns=lambda: NOW_NS
    )


def records_of(
    payloads: Sequence[tuple[bytes, Lsn]],
    tables: dict[str, TableInfo],
    types: dict[int, PgType],
    fmt: str,
    overrides: dict[str, Any],
    *,
    render: bool,
) -> tuple[list[Record | str], list[ChangeEvent]]:
    """Every record (or serialization error) the payloads make, and their change events."""
    serializer = make_serializer(fmt, overrides)
    decoder = ChangeDecoder(tables, types, renderer=TableRenderer(serializer.row_rendering) if render else None)
    out: list[Record | str] = []
    events: list[ChangeEvent] = []
    for payload, lsn in payloads:
        for event in decoder.feed(payload, lsn):
            if not isinstance(event, ChangeEvent):
                continue
            events.append(event)
            try:
                out.extend(serializer.records(event))
            except Exception as exc:  # the same error, with the same text, from both paths
                out.append(f"{type(exc).__name__}: {exc}")
    return out, events


def rendered(event: ChangeEvent) -> bool:
    return type(event.after if event.after is not None else event.before) is RenderedRow


def test_rendered_rows_make_the_typed_rows_records_byte_for_byte(
    pg_dsn: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    cases = server_cases(pg_dsn)  # the PostgreSQL 16/18 wheels have no libxml: no xml column there
    edges = EDGES if xml_available(pg_dsn) else [edge for edge in EDGES if edge[1] != "xml"]
    every = ", ".join(f"c{i} {type_}" for i, (_, type_, _, _) in enumerate(cases))
    every_values = ", ".join(literal for _, _, literal, _ in cases)
    edge_columns = ", ".join(f"{name} {type_}" for name, type_, _ in edges)
    names = ", ".join(name for name, _, _ in edges)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(server_setup(pg_dsn))
        conn.execute(f"CREATE TABLE everything (id int PRIMARY KEY, {every})")
        conn.execute(f"CREATE TABLE edges (id int PRIMARY KEY, {edge_columns})")
        # A composite key of rendered types, and a column name JSON must escape (and % must not format).
        conn.execute(
            'CREATE TABLE keyed (k1 text, k2 numeric(12, 2), k3 timestamptz, "we%ird ""name" int, '
            "PRIMARY KEY (k1, k2, k3))"
        )
    tables = ["public.everything", "public.edges", "public.keyed"]
    with DecoderSession(pg_dsn, slot=slot_name, publication=publication_name, tables=tables) as reader:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO everything VALUES (1, {every_values})")
            conn.execute("UPDATE everything SET id = 2")  # a key change: the old key as a 'K' tuple
            for k in range(EDGE_ROWS):
                values = ", ".join(values[k % len(values)] for _, _, values in edges)
                conn.execute(f"INSERT INTO edges (id, {names}) VALUES ({k}, {values})")
            for k, (column, literal) in enumerate(UNCOVERED):
                conn.execute(f"INSERT INTO edges (id, {column}) VALUES ({1000 + k}, {literal})")
            conn.execute("UPDATE edges SET i4 = 7 WHERE id < 5")  # no old tuple
            conn.execute("DELETE FROM edges WHERE id IN (5, 6)")  # old key 'K'
            conn.execute("ALTER TABLE edges REPLICA IDENTITY FULL")
            conn.execute("UPDATE edges SET t = 'full' WHERE id IN (7, 8, 1000)")  # whole old rows 'O'
            conn.execute("DELETE FROM edges WHERE id IN (9, 1001)")
            conn.execute(
                "INSERT INTO keyed VALUES ('a\"b', -1.5, '2024-01-31 12:00:00.25+00', 1), ('é', 0, '1999-12-31 "
                "23:59:59+00', NULL)"
            )
            conn.execute("UPDATE keyed SET k2 = k2 + 1")  # key changes: delete, tombstone, create with key headers
            conn.execute("DELETE FROM keyed")
            mark(conn, "end")
        events = reader.events_until("end")
        payloads = list(reader.payloads)
        known_tables, known_types = reader.tables, reader.types
    assert len(changes(events)) == 2 + EDGE_ROWS + len(UNCOVERED) + 5 + 2 + 3 + 2 + 2 + 2 + 2

    for fmt, overrides in SETTINGS:
        typed, typed_events = records_of(payloads, known_tables, known_types, fmt, overrides, render=False)
        fast, fast_events = records_of(payloads, known_tables, known_types, fmt, overrides, render=True)
        assert not any(rendered(e) for e in typed_events)
        assert fast == typed, (fmt, overrides)
        # The rendered path was taken wherever every value is covered, and only there.
        by_table: dict[str, list[bool]] = {}
        for event in fast_events:
            by_table.setdefault(event.table.name, []).append(rendered(event))
        assert all(by_table["keyed"]), (fmt, overrides)
        edge_ids = [(e.after if e.after is not None else e.before) for e in typed_events if e.table.name == "edges"]
        # NaN is uncovered only where it is rendered directly (precise); elsewhere its typed value is written.
        nan_rendered = overrides.get("decimal_handling", "precise") != "precise"
        expected = [
            isinstance(row, dict) and (row["id"] < 1000 or (nan_rendered and str(row.get("n")) == "NaN"))
            for row in edge_ids
        ]
        assert by_table["edges"] == expected, (fmt, overrides)
        assert len(typed) > 2 * EDGE_ROWS
    # Under 'precise' the NaN row fails the same way on both paths, naming the column and the fix.
    for fmt in ("json", "avro"):
        precise, _ = records_of(payloads, known_tables, known_types, fmt, {}, render=True)
        errors = [r for r in precise if isinstance(r, str)]
        assert any("'n'" in e and "decimal_handling" in e for e in errors), (fmt, errors)
