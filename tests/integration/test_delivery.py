"""Delivery under crashes: the daemon SIGKILLed at random moments of a running workload.

At least once: nothing is lost. Exactly once: nothing is lost and a read_committed
consumer sees every change once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.sink.position import record_position
from tests.support.connector import Connector, wait_confirmed, write_config
from tests.support.db import scalar

pytestmark = pytest.mark.integration

KILLS = 20


class Workload(threading.Thread):
    """Small transactions: inserts, version bumps, deletes and a primary-key change now and then."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        next_id = 1
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    with conn.transaction():
                        for _ in range(rng.randint(1, 5)):
                            conn.execute("INSERT INTO items VALUES (%s, 1, 'x')", (next_id,))
                            next_id += 1
                        conn.execute("UPDATE items SET version = version + 1 WHERE id = %s", (rng.randint(1, next_id),))
                        if rng.random() < 0.2:
                            conn.execute("DELETE FROM items WHERE id = %s", (rng.randint(1, next_id),))
                        if rng.random() < 0.05:
                            conn.execute(
                                "UPDATE items SET id = %s WHERE id = %s", (next_id + 1_000_000, rng.randint(1, next_id))
                            )
                    self.transactions += 1
                    time.sleep(0.005)
        except BaseException as e:  # reported by the test, never swallowed
            self.error = e


def identity(messages: list[Any]) -> list[tuple[int | None, bytes, bool]]:
    """(LSN, key, tombstone?) of each record: its position from the cdc.lsn header or, without position
    headers (the default), its envelope's source; a tombstone has none of its own and takes the LSN of
    the record before it in its partition (its delete event)."""
    last: dict[tuple[str, int], int | None] = {}
    out = []
    for m in messages:
        lsn = record_position(m.headers(), m.value()).lsn
        if lsn is None and m.value() is None:
            lsn = last.get((m.topic(), m.partition()))
        last[(m.topic(), m.partition())] = lsn
        out.append((lsn, m.key(), m.value() is None))
    return out


def replay(messages: list[Any]) -> dict[bytes, Any]:
    state: dict[bytes, Any] = {}
    for m in messages:
        if m.value() is None:
            state.pop(m.key(), None)
        else:
            state[m.key()] = json.loads(m.value())["after"]
    return state


# The default (no position headers) in both modes; headers on only where the daemon resumes from its
# offsets topic (exactly once): at least once, replay never reads a record's headers.
@pytest.mark.parametrize(
    ("mode", "headers"),
    [("at_least_once", False), ("exactly_once", False), ("exactly_once", True)],
    ids=["at_least_once-no_position_headers", "exactly_once-no_position_headers", "exactly_once-position_headers"],
)
def test_sigkill_at_random_moments_of_a_workload(
    mode, headers, tmp_path: Path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, version int NOT NULL, pad text)")
    delivery: dict[str, Any] = {"mode": mode, "commit_interval_ms": 50}
    if mode == "exactly_once":
        delivery["offsets_topic"] = f"{topic_prefix}.__offsets"
    cfg = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap, "partitions": 3, "position_headers": headers},
        topic_prefix=topic_prefix,
        delivery=delivery,
        status_interval_s=1.0,
    )
    rng = random.Random(11)
    first = Connector(cfg, tmp_path / "first.log").start()
    first.wait_streaming(pg_dsn, slot_name)
    first.stop(signal.SIGKILL)
    workload = Workload(pg_dsn)
    workload.start()
    try:
        for i in range(KILLS):
            c = Connector(cfg, tmp_path / f"run{i}.log").start()
            c.wait_streaming(pg_dsn, slot_name)
            time.sleep(rng.uniform(0.05, 0.8))
            c.stop(signal.SIGKILL)
    finally:
        workload.stop.set()
        workload.join(30)
    assert workload.error is None, workload.error
    assert workload.transactions > 100

    final = Connector(cfg, tmp_path / "final.log").start()
    try:
        final.wait_streaming(pg_dsn, slot_name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            end = scalar(conn.execute("SELECT pg_current_wal_lsn()::text"))
            wait_confirmed(pg_dsn, slot_name, end)
            rows = {r[0]: r[1] for r in conn.execute("SELECT id, version FROM items").fetchall()}
    finally:
        assert final.stop() == 0, final.output()

    topic = f"{topic_prefix}.public.items"
    messages = consume_all([topic], timeout=60.0, isolation="read_committed")
    state = replay(messages)
    expected = {json.dumps({"id": i}, separators=(",", ":")).encode(): v for i, v in rows.items()}
    assert set(state) == set(expected), "the replayed topic lacks or keeps rows the table does not"
    assert {k: v["version"] for k, v in state.items()} == expected

    assert all(any(n == "cdc.lsn" for n, _ in m.headers() or []) is headers for m in messages)
    identities = Counter(identity(messages))
    print(
        f"mode={mode} position_headers={headers} records={len(messages)} "
        f"resent={sum(n - 1 for n in identities.values())}"
    )
    if mode == "exactly_once":
        # Every change once: no (LSN, key, tombstone?) identity twice among committed records.
        duplicates = {k: n for k, n in identities.items() if n > 1}
        assert not duplicates, f"{len(duplicates)} changes seen more than once, e.g. {next(iter(duplicates))}"
        # And the daemon did skip already-committed transactions after some restart.
        skipped = [
            e
            for i in range(KILLS)
            for e in Connector(cfg, tmp_path / f"run{i}.log").log_events()
            if e.get("event") == "exactly_once_resume" and e.get("commit_lsn") != "0/0"
        ]
        assert skipped, "no restart resumed from a committed position"


BIG_ROWS = int(os.environ.get("CDC_TEST_BIG_TRANSACTION_ROWS", "100000"))
BIG_TIMEOUT_MS = int(os.environ.get("CDC_TEST_BIG_TRANSACTION_TIMEOUT_MS", "6000"))
BIG_SPLIT_RECORDS = int(os.environ.get("CDC_TEST_BIG_TRANSACTION_SPLIT_RECORDS", "8192"))
# seconds after streaming starts (Postgres decodes the transaction again first) within which a kill lands
BIG_KILL_WITHIN_S = float(os.environ.get("CDC_TEST_BIG_TRANSACTION_KILL_WITHIN_S", "3.0"))
# 1: receive it streamed in progress (decoder.streaming, spooled until its commit)
BIG_STREAMING = os.environ.get("CDC_TEST_BIG_TRANSACTION_STREAMING", "0") == "1"


def kill_after_parts(c: Connector, parts: int, at_most_s: float) -> None:
    """Return once the daemon logged ``parts`` committed parts of a split transaction, or after ``at_most_s``."""
    deadline = time.monotonic() + at_most_s
    while time.monotonic() < deadline:
        if sum(e.get("event") == "kafka_transaction_split" for e in c.log_events()) >= parts:
            return
        time.sleep(0.01)


def test_exactly_once_splits_a_source_transaction_over_the_kafka_timeout_and_resumes_inside_it_after_kills(
    tmp_path: Path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    """One source transaction far larger than a Kafka transaction may be (records and time): it goes to
    Kafka in parts, each with the position inside it, and 20 SIGKILLs at random moments while it is
    delivered leave every change exactly once under read_committed. `make exactly-once-full` runs it with
    5,000,000 rows and a 60 s transaction timeout."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, version int NOT NULL, pad text)")
    # streamed: the server streams a transaction once it holds logical_decoding_work_mem of changes
    dsn = (
        psycopg.conninfo.make_conninfo(pg_dsn, options="-c logical_decoding_work_mem=64kB") if BIG_STREAMING else pg_dsn
    )
    cfg = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.items"],
        kafka={
            "bootstrap_servers": services.kafka_bootstrap,
            "partitions": 3,
            "producer": {"transaction.timeout.ms": BIG_TIMEOUT_MS},
        },
        topic_prefix=topic_prefix,
        delivery={
            "mode": "exactly_once",
            "offsets_topic": f"{topic_prefix}.__offsets",
            "split_records": BIG_SPLIT_RECORDS,
        },
        decoder={"streaming": BIG_STREAMING},
        status_interval_s=1.0,
    )
    first = Connector(cfg, tmp_path / "first.log").start()
    first.wait_streaming(pg_dsn, slot_name)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (0, 1, 'small')")
        conn.execute("INSERT INTO items SELECT i, 1, repeat('x', 100) FROM generate_series(1, %s) i", (BIG_ROWS,))
        conn.execute("UPDATE items SET version = 2 WHERE id = 0")
        end = scalar(conn.execute("SELECT pg_current_wal_lsn()::text"))
    rng = random.Random(29)
    first.stop(signal.SIGKILL)
    splits = 0
    for i in range(KILLS - 1):
        c = Connector(cfg, tmp_path / f"run{i}.log").start()
        c.wait_streaming(pg_dsn, slot_name)
        # Killed after 1-3 committed parts of its own, or at a random moment, whichever comes first: on a
        # fast machine the daemon delivers all of the transaction within the random moment's range, and a
        # kill after the end never tests resuming inside it.
        kill_after_parts(c, rng.randint(1, 3), rng.uniform(0.2, BIG_KILL_WITHIN_S))
        c.stop(signal.SIGKILL)
        splits += sum(e.get("event") == "kafka_transaction_split" for e in c.log_events())
    final = Connector(cfg, tmp_path / "final.log").start()
    try:
        final.wait_streaming(pg_dsn, slot_name)
        wait_confirmed(pg_dsn, slot_name, end, timeout=max(600, BIG_ROWS / 2000))
    finally:
        assert final.stop() == 0, final.output()[-4000:]
    splits += sum(e.get("event") == "kafka_transaction_split" for e in final.log_events())
    resumed_inside = [
        e
        for i in range(KILLS - 1)
        for e in Connector(cfg, tmp_path / f"run{i}.log").log_events()
        if e.get("event") == "exactly_once_resume_inside"
    ] + [e for e in final.log_events() if e.get("event") == "exactly_once_resume_inside"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", (slot_name,)
        ).fetchone()
    streamed = int(row[0]) if row and row[0] is not None else 0
    print(f"splits={splits} resumed_inside={len(resumed_inside)} transactions streamed by the server={streamed}")
    assert streamed > 0 or not BIG_STREAMING, "the server streamed nothing: the streaming path was not tested"
    assert splits >= 2 and resumed_inside, "the transaction was neither split nor resumed from inside"

    messages = consume_all([f"{topic_prefix}.public.items"], timeout=180.0, isolation="read_committed")
    identities = Counter((lsn, key) for lsn, key, _ in identity(messages))
    twice = {k: n for k, n in identities.items() if n > 1}
    per_change = len(messages) / (BIG_ROWS + 2)
    print(f"{len(messages)} records for {BIG_ROWS + 2} changes ({per_change:.4f} a change)")
    assert not twice, f"{len(twice)} changes seen more than once, e.g. {next(iter(twice.items()))}"
    assert len(messages) == BIG_ROWS + 2, "changes missing"
    state = replay(messages)
    assert len(state) == BIG_ROWS + 1 and state[b'{"id":0}']["version"] == 2


def test_exactly_once_refuses_to_resume_inside_a_split_transaction_after_a_configuration_change(
    tmp_path: Path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    """Resuming inside a split source transaction drops the records already in Kafka by count; a
    configuration that makes the transaction produce other records (here: transaction metadata, a BEGIN
    record first) would drop the wrong ones. The digest of the last record in Kafka catches it: the
    daemon stops and says to start with the old configuration once, which then finishes it, each change
    once."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, version int NOT NULL, pad text)")

    def cfg(**extra: Any) -> Path:
        return write_config(
            tmp_path / "cdc.yaml",
            source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
            tables=["public.items"],
            kafka={"bootstrap_servers": services.kafka_bootstrap},
            topic_prefix=topic_prefix,
            delivery={"mode": "exactly_once", "offsets_topic": f"{topic_prefix}.__offsets", "split_records": 1024},
            status_interval_s=1.0,
            **extra,
        )

    rows = 100_000
    first = Connector(cfg(), tmp_path / "first.log").start()
    first.wait_streaming(pg_dsn, slot_name)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT i, 1, 'x' FROM generate_series(1, %s) i", (rows,))
        end = scalar(conn.execute("SELECT pg_current_wal_lsn()::text"))
    deadline = time.monotonic() + 60
    while not any(e.get("event") == "kafka_transaction_split" for e in first.log_events()):
        assert time.monotonic() < deadline and first.proc is not None and first.proc.poll() is None, first.output()
        time.sleep(0.05)
    first.stop(signal.SIGKILL)

    changed = Connector(cfg(transaction_metadata=True), tmp_path / "changed.log").start()
    code = changed.wait_exit(90)
    assert code == 1, changed.output()[-4000:]
    [fatal] = [e for e in changed.log_events() if e.get("event") == "fatal"]
    assert "the configuration changed what this transaction produces" in fatal["error"], fatal
    assert "Fix: start once more with the configuration it ran with" in fatal["error"]

    again = Connector(cfg(), tmp_path / "again.log").start()
    try:
        again.wait_streaming(pg_dsn, slot_name)
        wait_confirmed(pg_dsn, slot_name, end, timeout=120)
    finally:
        assert again.stop() == 0, again.output()[-4000:]
    messages = consume_all([f"{topic_prefix}.public.items"], timeout=60.0, isolation="read_committed")
    keys = Counter(m.key() for m in messages)
    assert len(keys) == rows and set(keys.values()) == {1}, "every change once"
