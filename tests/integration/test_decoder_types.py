"""Every built-in type, from SQL to the event's value, through a real server (the contract of ``cdc.values``).

Each case is a column type, an SQL literal and the value the event must carry. Where the expected
value is a count of days or microseconds, the server computes it (``Sql``), so BC dates and time
zones are checked against PostgreSQL itself rather than against our own arithmetic.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from cdc.event import TypeKind
from cdc.values import Interval
from tests.support.decoder_harness import DecoderSession, changes, mark
from tests.support.type_cases import (
    CASES,
    UNKNOWN_AS_TEXT,
    hstore_available,
    resolve,
    same,
    server_cases,
    server_setup,
)

pytestmark = pytest.mark.integration


def test_every_built_in_type_round_trips_from_sql_to_the_event_value(
    pg_dsn: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    cases = server_cases(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        if conn.info.server_version // 10000 in (15, 17):
            assert cases == CASES  # Debian's 15 and Maven Central's 17 hold every case, xml included
    columns = ", ".join(f"c{i} {type_}" for i, (_, type_, _, _) in enumerate(cases))
    values = ", ".join(literal for _, _, literal, _ in cases)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(server_setup(pg_dsn))
        conn.execute(f"CREATE TABLE everything (id int PRIMARY KEY, {columns})")
        expected = {f"c{i}": resolve(conn, value) for i, (_, _, _, value) in enumerate(cases)}
    with DecoderSession(pg_dsn, slot=slot_name, publication=publication_name, tables=["public.everything"]) as reader:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO everything VALUES (1, {values})")
            conn.execute("UPDATE everything SET id = 2")  # the same values again, as new and old key
            mark(conn, "end")
        events = reader.events_until("end")

    inserted, updated = changes(events)
    assert inserted.after is not None and updated.after is not None
    wrong = {
        label: (inserted.after[f"c{i}"], expected[f"c{i}"])
        for i, (label, _, _, _) in enumerate(cases)
        if not same(inserted.after[f"c{i}"], expected[f"c{i}"])
    }
    assert wrong == {}
    assert all(same(updated.after[name], value) for name, value in expected.items())
    types = {c.name: c.type for c in inserted.table.columns}
    for i, (label, _, _, _) in enumerate(cases):
        if label in UNKNOWN_AS_TEXT:
            assert (types[f"c{i}"].name, types[f"c{i}"].kind) == UNKNOWN_AS_TEXT[label]
    assert types["c0"].name == "int2"


def test_a_database_with_other_output_settings_still_decodes(
    pg_dsn: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    # Defaults of the database reach the walsender; the stream pins the settings the parsers assume.
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for setting, value in [
            ("DateStyle", "SQL, DMY"),
            ("IntervalStyle", "sql_standard"),
            ("extra_float_digits", "0"),
            ("bytea_output", "escape"),
            ("TimeZone", "America/New_York"),
        ]:
            conn.execute(f"ALTER DATABASE {dbname} SET {setting} = '{value}'")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, d date, ts timestamptz, i interval, f float8, b bytea)")
    with DecoderSession(pg_dsn, slot=slot_name, publication=publication_name, tables=["public.t"]) as reader:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO t VALUES (1, '2024-01-31', '2024-01-31 12:00:00+00', '1 day 02:00:00', 0.1, '\\x00ff')"
            )
            mark(conn, "end")
        events = reader.events_until("end")

    (row,) = changes(events)
    assert row.after == {
        "id": 1,
        "d": 19753,
        "ts": 1_706_702_400_000_000,
        "i": Interval(0, 1, 7_200_000_000),
        "f": 0.1,
        "b": b"\x00\xff",
    }


def test_types_created_after_start_up_arrive_as_text_with_their_names(
    pg_dsn: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    if not hstore_available(pg_dsn):
        pytest.skip("the hstore extension is not installed on this server (PostgreSQL contrib)")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS hstore")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with DecoderSession(pg_dsn, slot=slot_name, publication=publication_name, tables=["public.t"]) as reader:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE TYPE late_mood AS ENUM ('meh', 'great')")
            conn.execute("CREATE DOMAIN late_count AS int CHECK (VALUE >= 0)")
            conn.execute(
                "ALTER TABLE t ADD COLUMN m late_mood, ADD COLUMN ms late_mood[], ADD COLUMN n late_count, "
                "ADD COLUMN h hstore, ADD COLUMN v tsvector"
            )
            conn.execute("INSERT INTO t VALUES (1, 'great', '{meh,great}', 5, 'k=>v', 'a:1')")
            mark(conn, "end")
        events = reader.events_until("end")

    (row,) = changes(events)
    assert row.after == {"id": 1, "m": "great", "ms": "{meh,great}", "n": 5, "h": {"k": "v"}, "v": "'a':1"}
    types = {c.name: (c.type.name, c.type.kind) for c in row.table.columns}
    assert types["m"] == ("late_mood", TypeKind.UNKNOWN)
    assert types["ms"] == ("_late_mood", TypeKind.UNKNOWN)
    # For a domain the server names its base type: a domain over a built-in type is known exactly.
    assert types["n"] == ("int4", TypeKind.DOMAIN)
    assert types["h"] == ("hstore", TypeKind.BASE)
    assert types["v"] == ("tsvector", TypeKind.BASE)
