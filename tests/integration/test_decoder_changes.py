"""Row changes through a real server at the decoder level: TOAST, schema changes during a workload,
TRUNCATE, and a captured table dropped while streaming."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from cdc.decoder.errors import ChangeError
from cdc.event import Op, TruncateEvent
from cdc.values import UNCHANGED_TOAST
from tests.support.decoder_harness import DecoderSession, changes, mark, transactions

pytestmark = pytest.mark.integration

BIG_TEXT = "".join(f"{i:05d}" for i in range(4000))  # 20,000 characters


def reader(dsn: str, slot: str, publication: str, *tables: str) -> DecoderSession:
    return DecoderSession(dsn, slot=slot, publication=publication, tables=list(tables))


def test_an_update_that_leaves_a_toasted_column_alone_marks_it_unchanged_and_full_identity_fills_it(
    pg_dsn: str, slot_name: str, publication_name: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text, tags text[])")
        conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")  # out of line, uncompressed
    with reader(pg_dsn, slot_name, publication_name, "public.docs") as r:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO docs VALUES (1, 'draft', %s, '{a}')", (BIG_TEXT,))
            conn.execute("UPDATE docs SET title = 'final'")
            conn.execute("ALTER TABLE docs REPLICA IDENTITY FULL")
            conn.execute("UPDATE docs SET title = 'full'")
            conn.execute("UPDATE docs SET body = 'short now'")
            mark(conn, "end")
        events = r.events_until("end")

    inserted, default_identity, full_identity, body_changed = changes(events)
    assert inserted.after == {"id": 1, "title": "draft", "body": BIG_TEXT, "tags": ["a"]}
    assert default_identity.after == {"id": 1, "title": "final", "body": UNCHANGED_TOAST, "tags": ["a"]}
    assert default_identity.unchanged == frozenset({"body"})
    assert default_identity.before is None
    assert full_identity.after == {"id": 1, "title": "full", "body": BIG_TEXT, "tags": ["a"]}
    assert full_identity.unchanged == frozenset()
    assert full_identity.before == {"id": 1, "title": "final", "body": BIG_TEXT, "tags": ["a"]}
    assert body_changed.after is not None and body_changed.after["body"] == "short now"


def test_schema_changes_during_a_workload_show_in_the_following_events_and_lose_none(
    pg_dsn: str, slot_name: str, publication_name: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, a int, b text)")
        conn.execute("CREATE TABLE ticks (id serial PRIMARY KEY, at timestamptz DEFAULT now())")
    stop = threading.Event()

    def tick() -> None:  # a steady workload on another table all along
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("INSERT INTO ticks DEFAULT VALUES")

    steps = [
        "INSERT INTO items VALUES (1, 10, 'x')",
        "ALTER TABLE items ADD COLUMN c numeric(6, 2) DEFAULT 1.5",
        "INSERT INTO items VALUES (2, 20, 'y', 2.5)",
        "UPDATE items SET a = 11 WHERE id = 1",
        "ALTER TABLE items DROP COLUMN b",
        "INSERT INTO items VALUES (3, 30, 3.5)",
        "ALTER TABLE items RENAME COLUMN a TO a2",
        "INSERT INTO items VALUES (4, 40, 4.5)",
        "ALTER TABLE items ALTER COLUMN a2 TYPE text USING a2::text || '!'",  # rewrites the table
        "INSERT INTO items VALUES (5, 'fifty', 5.5)",
        "DELETE FROM items WHERE id = 2",
        "BEGIN; ALTER TABLE items ADD COLUMN d bool; INSERT INTO items VALUES (6, 'six', 6, true); "
        "UPDATE items SET d = false WHERE id = 1; COMMIT",
    ]
    with reader(pg_dsn, slot_name, publication_name, "public.items", "public.ticks") as r:
        worker = threading.Thread(target=tick)
        worker.start()
        try:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                for step in steps:
                    conn.execute(step)
        finally:
            stop.set()
            worker.join()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            ticks = conn.execute("SELECT count(*) FROM ticks").fetchone()
            table = {row[0]: row for row in conn.execute("SELECT id, a2, c, d FROM items")}
            mark(conn, "end")
        events = r.events_until("end")

    items = changes(events, "items")
    assert [(e.op, e.after) for e in items] == [
        (Op.CREATE, {"id": 1, "a": 10, "b": "x"}),
        (Op.CREATE, {"id": 2, "a": 20, "b": "y", "c": Decimal("2.50")}),
        (Op.UPDATE, {"id": 1, "a": 11, "b": "x", "c": Decimal("1.50")}),
        (Op.CREATE, {"id": 3, "a": 30, "c": Decimal("3.50")}),
        (Op.CREATE, {"id": 4, "a2": 40, "c": Decimal("4.50")}),
        (Op.CREATE, {"id": 5, "a2": "fifty", "c": Decimal("5.50")}),
        (Op.DELETE, None),
        (Op.CREATE, {"id": 6, "a2": "six", "c": Decimal("6.00"), "d": True}),
        (Op.UPDATE, {"id": 1, "a2": "11!", "c": Decimal("1.50"), "d": False}),
    ]
    assert items[6].before == {"id": 2}
    assert [c.type.name for c in items[-1].table.columns] == ["int4", "text", "numeric", "bool"]
    assert ticks is not None and len(changes(events, "ticks")) == ticks[0]
    # Replaying the events gives the table.
    state: dict[int, dict[str, Any]] = {}
    for e in items:
        if e.op is Op.DELETE:
            state.pop(e.key()["id"])
        else:
            assert isinstance(e.after, dict)
            state[e.after["id"]] = e.after
    assert sorted(state) == sorted(table)
    assert {k: (v["a2"], v["c"], v.get("d")) for k, v in state.items() if k in (1, 5, 6)} == {
        k: (row[1], row[2], row[3]) for k, row in table.items() if k in (1, 5, 6)
    }
    # PostgreSQL does not decode a table rewrite: the values ALTER ... TYPE ... USING changed in
    # rows no later statement touched are not events (a re-snapshot of the table brings them).
    assert (state[3], table[3][1]) == ({"id": 3, "a": 30, "c": Decimal("3.50")}, "30!")


def test_truncate_becomes_one_event_with_its_cascade_and_restart_identity_flags(
    pg_dsn: str, slot_name: str, publication_name: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE parent (id serial PRIMARY KEY)")
        conn.execute("CREATE TABLE child (id serial PRIMARY KEY, parent_id int REFERENCES parent)")
    with reader(pg_dsn, slot_name, publication_name, "public.parent", "public.child") as r:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO parent DEFAULT VALUES")
            conn.execute("INSERT INTO child (parent_id) VALUES (1)")
            conn.execute("TRUNCATE parent RESTART IDENTITY CASCADE")
            conn.execute("INSERT INTO parent DEFAULT VALUES")
            conn.execute("TRUNCATE child")
            mark(conn, "end")
        events = r.events_until("end")

    truncates = [e for e in events if isinstance(e, TruncateEvent)]
    assert [(sorted(t.name for t in e.tables), e.cascade, e.restart_identity) for e in truncates] == [
        (["child", "parent"], True, True),
        (["child"], False, False),
    ]
    after_restart = [e for e in changes(events, "parent") if e.op is Op.CREATE][-1]
    assert after_restart.after == {"id": 1}  # RESTART IDENTITY took effect
    assert truncates[0].ordinal == 1 and truncates[0].xid is not None


def test_a_captured_table_dropped_while_streaming_ends_its_events_and_the_others_flow_on(
    pg_dsn: str, slot_name: str, publication_name: str
) -> None:
    # DROP TABLE sends nothing: the table's earlier changes were delivered, later transactions of
    # the other tables flow on. The next start-up refuses the configuration (the table is missing).
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE doomed (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY)")
    with reader(pg_dsn, slot_name, publication_name, "public.doomed", "public.kept") as r:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO doomed VALUES (1)")
            conn.execute("BEGIN; INSERT INTO doomed VALUES (2); DROP TABLE doomed; INSERT INTO kept VALUES (1); COMMIT")
            conn.execute("INSERT INTO kept VALUES (2)")
            mark(conn, "end")
        events = r.events_until("end")

    assert [(e.table.name, e.after) for e in changes(events)] == [
        ("doomed", {"id": 1}),
        ("doomed", {"id": 2}),
        ("kept", {"id": 1}),
        ("kept", {"id": 2}),
    ]
    assert len(transactions(events)) == 3


def test_renaming_a_key_column_stops_with_an_error_that_names_the_fix(
    pg_dsn: str, slot_name: str, publication_name: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, a int)")
    with reader(pg_dsn, slot_name, publication_name, "public.items") as r:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1, 1)")
            conn.execute("ALTER TABLE items RENAME COLUMN id TO item_id")
            conn.execute("INSERT INTO items VALUES (2, 2)")
            mark(conn, "end")
        with pytest.raises(ChangeError, match=r"key column\(s\) id of public.items no longer exist.*restart"):
            r.events_until("end")
