"""Delivery under crashes: the daemon SIGKILLed at random moments of a running workload.

At least once: nothing is lost. Exactly once: nothing is lost and a read_committed
consumer sees every change once.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.connector import Connector, write_config

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
                        conn.execute(
                            "UPDATE items SET version = version + 1 WHERE id = %s", (rng.randint(1, next_id),)
                        )
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


def replay(messages: list[Any]) -> dict[bytes, Any]:
    state: dict[bytes, Any] = {}
    for m in messages:
        if m.value() is None:
            state.pop(m.key(), None)
        else:
            state[m.key()] = json.loads(m.value())["after"]
    return state


def wait_confirmed(dsn: str, slot: str, target: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (target, slot),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise AssertionError(f"slot {slot} did not confirm {target} within {timeout}s")


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_sigkill_at_random_moments_of_a_workload(
    mode, tmp_path: Path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
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
        kafka={"bootstrap_servers": services.kafka_bootstrap, "partitions": 3},
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
            end = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
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

    identities = Counter((dict(m.headers())["cdc.lsn"], m.key(), m.value() is None) for m in messages)
    print(f"mode={mode} records={len(messages)} resent={sum(n - 1 for n in identities.values())}")
    if mode == "exactly_once":
        # Every change once: no (LSN, key, tombstone?) identity twice among committed records.
        identities = Counter(
            (dict(m.headers())["cdc.lsn"], m.key(), m.value() is None) for m in messages
        )
        duplicates = {k: n for k, n in identities.items() if n > 1}
        assert not duplicates, f"{len(duplicates)} changes seen more than once, e.g. {next(iter(duplicates))}"
        # And the daemon did skip already-committed transactions after some restart.
        skipped = [
            e for i in range(KILLS) for e in Connector(cfg, tmp_path / f"run{i}.log").log_events()
            if e.get("event") == "exactly_once_resume" and e.get("commit_lsn") != "0/0"
        ]
        assert skipped, "no restart resumed from a committed position"


def test_exactly_once_stops_naming_a_source_transaction_longer_than_the_kafka_transaction_timeout_and_the_fix_works(
    tmp_path: Path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, version int NOT NULL, pad text)")

    def cfg(producer: dict[str, Any]) -> Path:
        return write_config(
            tmp_path / "cdc.yaml",
            source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
            tables=["public.items"],
            kafka={"bootstrap_servers": services.kafka_bootstrap, "producer": producer},
            topic_prefix=topic_prefix,
            delivery={"mode": "exactly_once", "offsets_topic": f"{topic_prefix}.__offsets"},
            status_interval_s=1.0,
        )

    rows = 300_000  # several seconds of producing: far over a 2 s Kafka transaction
    short = Connector(cfg({"transaction.timeout.ms": 2000}), tmp_path / "short.log").start()
    try:
        short.wait_streaming(pg_dsn, slot_name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (0, 1, 'small')")
            conn.execute("INSERT INTO items SELECT i, 1, repeat('x', 100) FROM generate_series(1, %s) i", (rows,))
        code = short.wait_exit(120)
    finally:
        if short.proc is not None and short.proc.poll() is None:
            short.stop(signal.SIGKILL)
    assert code == 1, short.output()
    [fatal] = [e for e in short.log_events() if e.get("event") == "fatal"]
    assert fatal["kind"] == "SinkError", fatal
    assert "has been producing for" in fatal["error"] and "transaction.timeout.ms=2000 ms" in fatal["error"]
    assert "Fix: raise kafka.producer.transaction.timeout.ms" in fatal["error"]
    topic = f"{topic_prefix}.public.items"
    committed = consume_all([topic], timeout=20.0, isolation="read_committed")
    assert [m.key() for m in committed] == [b'{"id":0}']  # the small transaction, none of the large one

    fixed = Connector(cfg({}), tmp_path / "fixed.log").start()  # the broker's default, 15 minutes
    try:
        fixed.wait_streaming(pg_dsn, slot_name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            end = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        wait_confirmed(pg_dsn, slot_name, end, timeout=180)
    finally:
        assert fixed.stop() == 0, fixed.output()
    messages = consume_all([topic], timeout=60.0, isolation="read_committed")
    keys = Counter(m.key() for m in messages)
    assert len(keys) == rows + 1 and set(keys.values()) == {1}, "every change once"
