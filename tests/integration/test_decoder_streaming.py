"""Streamed in-progress transactions against a real server: the decoder's events equal those of the same
transactions received whole, in commit order, with rolled-back savepoints left out.

The replication connections run with ``logical_decoding_work_mem=64kB`` so that a few thousand rows make
the server stream a transaction in blocks before it commits.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.event import ChangeEvent, Op, TruncateEvent, TxBegin, TxCommit
from cdc.values import UNCHANGED_TOAST
from tests.support.decoder_harness import DecoderSession, changes, mark, transactions

pytestmark = pytest.mark.integration

WORK_MEM = "64kB"
SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL, balance numeric(12, 2));
CREATE TABLE bulk (id int PRIMARY KEY, filler text);
CREATE TABLE docs (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
"""
TABLES = ["public.accounts", "public.bulk", "public.docs"]
BIG_TEXT = "".join(f"{i:05d}" for i in range(2000))  # 10,000 characters, stored out of line


@pytest.fixture
def db(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return pg_dsn


def session(
    db: str, slot: str, publication: str, tmp_path: Path, *, streaming: bool, create_slot: bool = True
) -> DecoderSession:
    return DecoderSession(
        db,
        slot=slot,
        publication=publication,
        tables=TABLES,
        streaming=streaming,
        spool_dir=tmp_path / f"spool-{slot}",
        work_mem=WORK_MEM,
        create_slot=create_slot,
    )


def run(conn: psycopg.Connection[Any], *statements: str) -> None:
    for statement in statements:
        conn.execute(statement)


def test_a_streamed_workload_decodes_to_exactly_the_events_of_the_same_workload_received_whole(
    db: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    # Two slots created at the same point read the same WAL, one with streaming 'on', one without.
    streamed = session(db, slot_name, publication_name, tmp_path, streaming=True).prepare()
    whole = session(db, slot_name + "_whole", publication_name, tmp_path, streaming=False).prepare()
    with psycopg.connect(db, autocommit=True) as conn, psycopg.connect(db, autocommit=True) as other:
        run(conn, "INSERT INTO accounts VALUES (1, 'ada', 10), (2, 'bob', 20)")
        run(conn, f"INSERT INTO docs VALUES (1, 'draft', '{BIG_TEXT}')")
        run(
            conn,
            "BEGIN",
            "INSERT INTO bulk SELECT g, repeat('a', 100) FROM generate_series(1, 3000) g",
            "UPDATE accounts SET balance = balance + 1",
            "UPDATE accounts SET id = 3 WHERE id = 2",  # a key change: the old key comes along
            "DELETE FROM accounts WHERE id = 1",
            "UPDATE docs SET title = 'final'",  # the TOASTed body is unchanged
            "SELECT pg_logical_emit_message(true, 'outbox', 'inside')",
            "SAVEPOINT doomed",
            "INSERT INTO bulk SELECT g, repeat('b', 100) FROM generate_series(10001, 13000) g",
            "ROLLBACK TO SAVEPOINT doomed",
            "SAVEPOINT kept",
            "INSERT INTO bulk SELECT g, repeat('c', 100) FROM generate_series(20001, 22000) g",
            "RELEASE SAVEPOINT kept",
            "ALTER TABLE accounts ADD COLUMN note text DEFAULT 'n/a'",
            "INSERT INTO accounts VALUES (4, 'cy', 40, 'after the DDL')",
        )
        # Small transactions commit while the big one is still open, between its stream blocks.
        run(other, "INSERT INTO bulk VALUES (-1, 'committed first')")
        run(conn, "INSERT INTO bulk SELECT g, repeat('d', 100) FROM generate_series(30001, 32000) g")
        run(other, "INSERT INTO bulk VALUES (-2, 'committed second')")
        run(conn, "TRUNCATE docs", "COMMIT")
        run(conn, "BEGIN", "INSERT INTO bulk SELECT g, 'rolled back' FROM generate_series(40001, 44000) g", "ROLLBACK")
        run(conn, "INSERT INTO accounts VALUES (5, 'dee', 50, 'later')")
        mark(conn, "end")

    with streamed:
        got = streamed.events_until("end")
    with whole:
        expected = whole.events_until("end")

    assert streamed.kinds.get("S", 0) > 3 and streamed.kinds.get("c", 0) == 1, streamed.kinds
    assert "S" not in whole.kinds
    assert got == expected
    groups = transactions(got)
    big = next(g for g in groups if len(g) > 1000)
    inserted = [e.key()["id"] for e in changes(big, "bulk") if e.op is Op.CREATE]
    assert inserted == [*range(1, 3001), *range(20001, 22001), *range(30001, 32001)]
    assert [e.ordinal for e in big[1:-1] if not isinstance(e, TxBegin | TxCommit)] == list(range(1, len(big) - 1))
    commit = big[-1]
    assert isinstance(commit, TxCommit) and commit.event_count == len(big) - 2
    # Commit order: the two small transactions committed before the big one did.
    small = [changes(g, "bulk")[0].key()["id"] for g in groups if len(g) == 3 and changes(g, "bulk")]
    assert small == [-1, -2]
    assert groups.index(big) > max(i for i, g in enumerate(groups) if changes(g, "bulk") and len(g) == 3)
    docs = changes(big, "docs")
    assert docs[0].after == {"id": 1, "title": "final", "body": UNCHANGED_TOAST}
    assert docs[0].unchanged == frozenset({"body"})
    assert any(isinstance(e, TruncateEvent) for e in big)
    after_ddl = [e for e in changes(got, "accounts") if e.after and e.after["id"] in (4, 5)]
    assert [e.after for e in after_ddl] == [
        {"id": 4, "name": "cy", "balance": 40, "note": "after the DDL"},
        {"id": 5, "name": "dee", "balance": 50, "note": "later"},
    ]
    ids = {e.key()["id"] for e in changes(got, "bulk")}
    assert not ids & {*range(10001, 13001), *range(40001, 44001)}  # the rolled-back savepoint and transaction
    assert list((tmp_path / f"spool-{slot_name}").glob("*.spool")) == []


def test_a_relation_sent_inside_a_streamed_transaction_describes_the_table_for_the_transactions_after_it(
    db: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    # The table gains a column (nothing written since), then a streamed transaction writes to it:
    # the server sends the new Relation only inside that stream, and nothing to the next writer.
    with session(db, slot_name, publication_name, tmp_path, streaming=True) as reader:
        with psycopg.connect(db, autocommit=True) as conn:
            run(conn, "INSERT INTO accounts VALUES (-1, 'old', 0)")
            run(conn, "ALTER TABLE accounts ADD COLUMN extra int")
            run(
                conn,
                "BEGIN",
                "INSERT INTO bulk VALUES (0, 'start')",
                "SAVEPOINT s",
                "INSERT INTO accounts SELECT g, repeat('x', 100), 0, 1 FROM generate_series(1, 3000) g",
                "ROLLBACK TO SAVEPOINT s",
                "INSERT INTO accounts SELECT g, repeat('y', 100), 0, 2 FROM generate_series(1, 3000) g",
                "COMMIT",
            )
            run(conn, "INSERT INTO accounts VALUES (-3, 'next', 0, 3)")
            mark(conn, "end")
        events = reader.events_until("end")

    assert reader.kinds.get("S", 0) > 1
    rows = [e.after for e in changes(events, "accounts")]
    assert rows[0] == {"id": -1, "name": "old", "balance": 0}
    assert len(rows) == 3002 and all(r is not None and r["extra"] == 2 for r in rows[1:-1])
    assert rows[-1] == {"id": -3, "name": "next", "balance": 0, "extra": 3}


def test_ddl_committed_while_a_streamed_transaction_waits_is_seen_by_the_transactions_after_both(
    db: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    # The streamed transaction writes to the table in a savepoint and rolls it back, which releases
    # its lock; another transaction adds a column and commits; the streamed one commits later.
    with session(db, slot_name, publication_name, tmp_path, streaming=True) as reader:
        with psycopg.connect(db, autocommit=True) as s, psycopg.connect(db, autocommit=True) as n:
            run(n, "INSERT INTO accounts VALUES (-1, 'old', 0)")
            run(
                s,
                "BEGIN",
                "INSERT INTO bulk VALUES (0, 'start')",
                "SAVEPOINT s",
                "INSERT INTO accounts SELECT g, repeat('x', 100), 0 FROM generate_series(1, 3000) g",
                "ROLLBACK TO SAVEPOINT s",
            )
            run(
                n,
                "BEGIN",
                "ALTER TABLE accounts ADD COLUMN extra int",
                "INSERT INTO accounts VALUES (-2, 'n', 0, 2)",
                "COMMIT",
            )
            run(s, "INSERT INTO bulk SELECT g, repeat('y', 100) FROM generate_series(1, 3000) g", "COMMIT")
            run(n, "INSERT INTO accounts VALUES (-3, 'n2', 0, 3)")
            mark(n, "end")
        events = reader.events_until("end")

    assert [e.after for e in changes(events, "accounts")] == [
        {"id": -1, "name": "old", "balance": 0},
        {"id": -2, "name": "n", "balance": 0, "extra": 2},
        {"id": -3, "name": "n2", "balance": 0, "extra": 3},
    ]
    assert len(changes(events, "bulk")) == 3001


def test_small_transactions_committing_during_a_streamed_one_come_out_at_once_and_in_commit_order(
    db: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    stop = threading.Event()
    committed: list[int] = []

    def trickle() -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            i = 0
            while not stop.is_set():
                i += 1
                conn.execute("INSERT INTO accounts VALUES (%s, 'small', 0)", (-i,))
                committed.append(-i)

    with session(db, slot_name, publication_name, tmp_path, streaming=True) as reader:
        worker = threading.Thread(target=trickle)
        worker.start()
        try:
            with psycopg.connect(db, autocommit=True) as conn:
                run(conn, "BEGIN")
                for chunk in range(10):
                    conn.execute(
                        "INSERT INTO bulk SELECT g, repeat('z', 100) FROM generate_series(%s::int, %s::int) g",
                        (chunk * 500 + 1, chunk * 500 + 500),
                    )
                run(conn, "COMMIT")
        finally:
            stop.set()
            worker.join()
        with psycopg.connect(db, autocommit=True) as conn:
            mark(conn, "end")
        events = reader.events_until("end")

    assert reader.kinds.get("S", 0) > 3
    groups = transactions(events)
    assert [changes(g)[0].key()["id"] for g in groups if changes(g, "accounts")] == committed
    commit_lsns = [g[0].commit_lsn for g in groups if isinstance(g[0], TxBegin)]
    assert commit_lsns == sorted(commit_lsns)
    (big,) = [g for g in groups if changes(g, "bulk")]
    assert [e.key()["id"] for e in changes(big)] == list(range(1, 5001))


def test_a_streamed_transaction_that_rolls_back_emits_nothing_and_leaves_no_file(
    db: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    with session(db, slot_name, publication_name, tmp_path, streaming=True) as reader:
        with psycopg.connect(db, autocommit=True) as conn:
            run(
                conn, "BEGIN", "INSERT INTO bulk SELECT g, repeat('r', 100) FROM generate_series(1, 5000) g", "ROLLBACK"
            )
            run(conn, "INSERT INTO bulk VALUES (1, 'after')")
            version = conn.info.server_version
            mark(conn, "end")
        events = reader.events_until("end")

    if version < 180000:
        assert reader.kinds.get("S", 0) >= 1 and reader.kinds.get("A", 0) == 1
    else:  # PostgreSQL 18 may see the abort before streaming and then sends nothing of the transaction
        assert (reader.kinds.get("S", 0) >= 1) == (reader.kinds.get("A", 0) == 1)
    assert [e.after for e in changes(events)] == [{"id": 1, "filler": "after"}]
    assert list((tmp_path / f"spool-{slot_name}").glob("*.spool")) == []


def test_protocol_and_streaming_follow_the_server_version(
    db: str, slot_name: str, publication_name: str, tmp_path: Path
) -> None:
    with session(db, slot_name, publication_name, tmp_path, streaming=True) as reader:
        with psycopg.connect(db, autocommit=True) as conn:
            version = conn.info.server_version
            run(conn, "INSERT INTO bulk VALUES (1, 'x')")
            mark(conn, "end")
        events = reader.events_until("end")

    assert version >= 150000  # the dev services run PostgreSQL 15: protocol 3, streaming on
    assert [e.op for e in changes(events)] == [Op.CREATE]
    assert isinstance(events[0], TxBegin) and isinstance(events[-1], TxCommit)
    assert isinstance(changes(events)[0], ChangeEvent)
