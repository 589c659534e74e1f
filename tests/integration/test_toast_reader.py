"""The fill's reader (cdc.pipeline.toast.SourceReader) against a real server: every key type it accepts finds
its row, the values come back as the decoder's converters make them, a missing row is absent, and a key type
it cannot write in a query is refused with the fix."""

from __future__ import annotations

import secrets
from typing import Any

import psycopg
import pytest

from cdc.catalog import load_types
from cdc.decoder.types import BUILTIN_TYPES, converter_for
from cdc.event import Column, PgType, TableSchema
from cdc.pipeline.toast import SourceReader, ToastFillError, key_type_supported
from cdc.snapshot.plan import session_setup

KEY_TYPES = [
    ("int4", "7"),
    ("int8", "9000000000"),
    ("text", "a key with 'quotes' and \\ backslash"),
    ("varchar(20)", "v-key"),
    ("uuid", "0b9d6c2e-6b43-4f4e-9b0a-3b2a1e4c5d6f"),
    ("numeric(10,2)", "12.50"),
    ("date", "2024-02-29"),
    ("date", "infinity"),
    ("timestamp", "2020-01-01 10:00:00.123456"),
    ("timestamp", "-infinity"),
    ("timestamptz", "2020-01-01 10:00:00.654321+02"),
    ("time", "23:59:59.999999"),
    ("bool", "true"),
    ("bytea", "\\x00ff10"),
    ("mood", "ok"),
]


def _type(conn: psycopg.Connection[Any], declared: str) -> PgType:
    row = conn.execute("SELECT %s::regtype::oid", (declared,)).fetchone()
    assert row is not None
    oid = int(row[0])
    return BUILTIN_TYPES.get(oid) or load_types(conn, [oid])[oid]


def _key_value(conn: psycopg.Connection[Any], column: Column, table: str) -> Any:
    """The key as the decoder holds it: the server's text output through the decoder's converter."""
    with conn.cursor() as cur:
        cur.execute(psycopg.sql.SQL("SELECT k FROM {}").format(psycopg.sql.Identifier(table)))
        result = cur.pgresult
        assert result is not None
        raw = result.get_value(0, 0)
    assert raw is not None
    return converter_for(column.type, column.modifier)(raw)


@pytest.mark.parametrize(("declared", "text"), KEY_TYPES, ids=[f"{d}={t}" for d, t in KEY_TYPES])
def test_a_key_of_each_supported_type_finds_its_row_and_the_value_comes_back_whole(
    pg_dsn: str, declared: str, text: str
) -> None:
    body = secrets.token_hex(8000)  # 16,000 incompressible characters: stored out of line
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        session_setup(conn, "test")
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
        conn.execute(f"CREATE TABLE t (k {declared} PRIMARY KEY, body text, doc jsonb)")
        conn.execute("INSERT INTO t VALUES (%s, %s, %s)", (text, body, '{"a": [1, 2]}'))
        conn.execute(f"CREATE TABLE other (k {declared} PRIMARY KEY)")  # a key that finds nothing
        key_column = Column("k", _type(conn, declared), -1, key=True)
        schema = TableSchema(
            "public", "t", (key_column, Column("body", BUILTIN_TYPES[25]), Column("doc", BUILTIN_TYPES[3802]))
        )
        assert key_type_supported(key_column)
        key = _key_value(conn, key_column, "t")

    reader = SourceReader(pg_dsn, session_setup)
    try:
        found = reader.read(schema, ["body", "doc"], [(key,)], 0, [])
        again = reader.read(schema, ["body", "doc"], [(key,)], 0, [])  # the prepared statement, a second time
    finally:
        reader.close()

    assert found == again == {(key,): {"body": body, "doc": '{"a": [1, 2]}'}}


def test_composite_keys_many_at_once_and_a_missing_row_is_absent(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a int, b timestamptz, body text, PRIMARY KEY (a, b))")
        conn.execute(
            "INSERT INTO t SELECT g, TIMESTAMPTZ '2021-06-01 00:00:00+00' + g * INTERVAL '1 second', 'row ' || g "
            "FROM generate_series(1, 300) g"
        )
        ts = BUILTIN_TYPES[1184]
        schema = TableSchema(
            "public",
            "t",
            (Column("a", BUILTIN_TYPES[23], key=True), Column("b", ts, key=True), Column("body", BUILTIN_TYPES[25])),
        )
    epoch = 1_622_505_600_000_000  # 2021-06-01 00:00:00 UTC in microseconds
    keys = [(g, epoch + g * 1_000_000) for g in range(1, 302)]  # 301 does not exist

    reader = SourceReader(pg_dsn, session_setup)
    try:
        found = reader.read(schema, ["body"], keys, 0, [])
    finally:
        reader.close()

    assert len(found) == 300
    assert found[(42, epoch + 42_000_000)] == {"body": "row 42"}
    assert (301, epoch + 301_000_000) not in found


def test_a_key_type_the_fill_cannot_query_is_refused_naming_the_table_and_the_fix(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (k interval PRIMARY KEY, body text)")
        key = Column("k", _type(conn, "interval"), key=True)
    schema = TableSchema("public", "t", (key, Column("body", BUILTIN_TYPES[25])))
    reader = SourceReader(pg_dsn, session_setup)
    with pytest.raises(ToastFillError, match=r"public\.t.*REPLICA IDENTITY FULL.*toast: placeholder"):
        reader.read(schema, ["body"], [(None,)], 0, [])
    reader.close()


def test_a_dropped_table_reads_as_rows_gone(pg_dsn: str) -> None:
    schema = TableSchema(
        "public", "gone", (Column("k", BUILTIN_TYPES[23], key=True), Column("body", BUILTIN_TYPES[25]))
    )
    reader = SourceReader(pg_dsn, session_setup)
    try:
        assert reader.read(schema, ["body"], [(1,)], 0, []) == {}
    finally:
        reader.close()


def test_the_read_waits_until_the_events_transaction_is_visible_then_sees_its_rows(pg_dsn: str) -> None:
    """The walsender can send a transaction before its commit is visible to other sessions: a read then would
    find a row the transaction inserted gone, or a value it changed old. An open transaction stands in for it."""
    import threading

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (k int PRIMARY KEY, body text)")
    schema = TableSchema("public", "t", (Column("k", BUILTIN_TYPES[23], key=True), Column("body", BUILTIN_TYPES[25])))
    writer = psycopg.connect(pg_dsn)
    writer.execute("INSERT INTO t VALUES (1, 'inserted by the filled transaction')")
    row = writer.execute("SELECT txid_current() % 4294967296").fetchone()  # the 32-bit xid, as pgoutput sends it
    assert row is not None
    xid = int(row[0])
    reader = SourceReader(pg_dsn, session_setup, replay_wait_s=30)
    found: dict[Any, Any] = {}
    done = threading.Event()

    def read() -> None:
        found.update(reader.read(schema, ["body"], [(1,)], 0, [xid]))
        done.set()

    thread = threading.Thread(target=read)
    thread.start()
    try:
        assert not done.wait(0.5), "the read returned before the transaction was visible"
        writer.commit()
        assert done.wait(10)
    finally:
        writer.close()
        thread.join(10)
        reader.close()
    assert found == {(1,): {"body": "inserted by the filled transaction"}}
