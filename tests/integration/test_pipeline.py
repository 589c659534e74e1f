"""The walking skeleton end to end: a Postgres commit becomes a Kafka record, through the real daemon."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.sink.position import RecordPosition, record_position
from tests.support.connector import Connector, write_config
from tests.support.db import scalar

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text, balance numeric(10,2));
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int NOT NULL, note text);
"""


def config_for(
    tmp_path: Path, services: Any, pg_dsn: str, slot: str, publication: str, prefix: str, **extra: Any
) -> Path:
    kafka = {"bootstrap_servers": services.kafka_bootstrap}
    kafka.update(extra.pop("kafka", {}))
    return write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg_dsn, "slot": slot, "publication": publication},
        tables=extra.pop("tables", ["public.customers", {"name": "public.orders", "key": ["id"]}]),
        kafka=kafka,
        topic_prefix=prefix,
        status_interval_s=1.0,
        **extra,
    )


def replay(messages: list[Any]) -> dict[bytes, Any]:
    """Latest value per key, tombstones deleting: what a consumer rebuilding from offset 0 holds."""
    state: dict[bytes, Any] = {}
    for m in messages:
        if m.value() is None:
            state.pop(m.key(), None)
        else:
            state[m.key()] = json.loads(m.value())
    return state


def wait_for(consume_all: Any, topics: list[str], predicate: Any, timeout: float = 60.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        msgs: list[Any] = consume_all(topics, timeout=10.0)
        if predicate(msgs) or time.monotonic() > deadline:
            return msgs
        time.sleep(0.3)


@pytest.fixture
def shop(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return pg_dsn


def test_insert_update_delete_become_envelopes_keyed_by_primary_key_with_a_tombstone_after_the_delete(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = config_for(tmp_path, services, shop, slot_name, publication_name, topic_prefix)
    conn_ = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        conn_.wait_streaming(shop, slot_name)
        with psycopg.connect(shop, autocommit=True) as conn:
            conn.execute("INSERT INTO customers VALUES (1, 'Ada', 'ada@example.org', 10.50)")
            conn.execute("UPDATE customers SET name = 'Ada L.' WHERE id = 1")
            conn.execute("DELETE FROM customers WHERE id = 1")
            conn.execute("INSERT INTO orders VALUES (7, 1, 'hello')")
        topic = f"{topic_prefix}.public.customers"
        msgs = wait_for(consume_all, [topic], lambda m: len(m) >= 4)
        # before the stop, which delivers only what the daemon has read by then
        orders = wait_for(consume_all, [f"{topic_prefix}.public.orders"], lambda m: len(m) >= 1)
    finally:
        code = conn_.stop()
    assert code == 0, conn_.output()

    assert [m.key() for m in msgs] == [b'{"id":1}'] * 4
    values = [json.loads(m.value()) if m.value() is not None else None for m in msgs]
    assert [v["op"] if v else None for v in values] == ["c", "u", "d", None]
    create, update, delete, tombstone = values
    assert create is not None and update is not None and delete is not None
    assert create["before"] is None
    assert create["after"]["name"] == "Ada" and create["after"]["email"] == "ada@example.org"
    assert update["after"]["name"] == "Ada L."
    assert update["before"] is None  # REPLICA IDENTITY DEFAULT and the key did not change
    assert delete["after"] is None
    # REPLICA IDENTITY DEFAULT: Postgres sent only the key. The other fields are null where the column may
    # be NULL, and the value Debezium gives a required field otherwise (name is NOT NULL text: ""), so the
    # record stays valid against its schema.
    assert delete["before"] == {"id": 1, "name": "", "email": None, "balance": None}
    assert tombstone is None
    src = create["source"]
    assert src["connector"] == "postgresql" and src["table"] == "customers" and src["schema"] == "public"
    assert src["name"] == topic_prefix and src["snapshot"] == "false"
    assert src["lsn"] > 0 and src["txId"] > 0
    assert create["source"]["lsn"] < update["source"]["lsn"] < delete["source"]["lsn"]
    # kafka.position_headers is off by default: the envelope alone says where each record sits
    assert all(not m.headers() for m in msgs)
    assert record_position(msgs[0].headers(), msgs[0].value()) == RecordPosition(
        src["lsn"], int(json.loads(src["sequence"])[0]), src["txId"]
    )

    assert [m.key() for m in orders] == [b'{"id":7}']
    assert json.loads(orders[0].value())["after"] == {"id": 7, "customer_id": 1, "note": "hello"}


def test_topics_are_created_compacted(tmp_path, services, shop, slot_name, publication_name, topic_prefix, kafka_admin):
    from confluent_kafka.admin import ConfigResource

    cfg = config_for(tmp_path, services, shop, slot_name, publication_name, topic_prefix)
    c = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        c.wait_streaming(shop, slot_name)
    finally:
        assert c.stop() == 0
    topic = f"{topic_prefix}.public.customers"
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = kafka_admin.describe_configs([res])[res].result()
    assert configs["cleanup.policy"].value == "compact"


def test_sigkill_between_changes_and_a_restart_lose_no_change(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = config_for(tmp_path, services, shop, slot_name, publication_name, topic_prefix)
    topic = f"{topic_prefix}.public.customers"

    def write(conn: psycopg.Connection[Any], ids: range) -> None:
        for i in ids:
            conn.execute("INSERT INTO customers VALUES (%s, %s, NULL, %s)", (i, f"c{i}", i))
            if i % 3 == 0:
                conn.execute("UPDATE customers SET name = name || '!' WHERE id = %s", (i,))
            if i % 5 == 0:
                conn.execute("DELETE FROM customers WHERE id = %s", (i - 1,))

    with psycopg.connect(shop, autocommit=True) as conn:
        for round_ in range(3):
            c = Connector(cfg, tmp_path / f"cdc{round_}.log").start()
            c.wait_streaming(shop, slot_name)
            write(conn, range(round_ * 100 + 1, round_ * 100 + 51))
            time.sleep(0.3)
            c.stop(signal.SIGKILL)
            # changes while the daemon is down
            write(conn, range(round_ * 100 + 51, round_ * 100 + 101))
        final = Connector(cfg, tmp_path / "final.log").start()
        try:
            final.wait_streaming(shop, slot_name)
            write(conn, range(301, 321))
            rows = {r[0]: r for r in conn.execute("SELECT id, name, email, balance FROM customers").fetchall()}
            expected = {json.dumps({"id": i}, separators=(",", ":")).encode(): r for i, r in rows.items()}
            msgs = wait_for(consume_all, [topic], lambda m: set(replay(m)) == set(expected), timeout=90)
        finally:
            assert final.stop() == 0
    state = replay(msgs)
    assert set(state) == set(expected)
    for key, row in expected.items():
        assert state[key]["after"]["name"] == row[1]


def test_sigterm_stops_cleanly_and_confirms_the_last_commit(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = config_for(tmp_path, services, shop, slot_name, publication_name, topic_prefix)
    c = Connector(cfg, tmp_path / "cdc.log").start()
    c.wait_streaming(shop, slot_name)
    with psycopg.connect(shop, autocommit=True) as conn:
        for i in range(200):
            conn.execute("INSERT INTO orders VALUES (%s, 1, 'x')", (i,))
        after_last = scalar(conn.execute("SELECT pg_current_wal_lsn()"))
        wait_for(consume_all, [f"{topic_prefix}.public.orders"], lambda m: len(m) >= 200)
        assert c.stop(signal.SIGTERM, timeout=30) == 0
        confirmed = scalar(
            conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (after_last, slot_name),
            )
        )
    assert confirmed, c.output()
    assert any(e.get("event") == "stopped" for e in c.log_events())


def test_after_compaction_a_topic_holds_one_record_per_live_row(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix, consume_all
):
    fast_compaction = {
        "segment.ms": "200",
        "min.cleanable.dirty.ratio": "0.001",
        "delete.retention.ms": "100",
        "min.compaction.lag.ms": "0",
    }
    cfg = config_for(
        tmp_path, services, shop, slot_name, publication_name, topic_prefix, kafka={"topic_config": fast_compaction}
    )
    topic = f"{topic_prefix}.public.customers"
    c = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        c.wait_streaming(shop, slot_name)
        with psycopg.connect(shop, autocommit=True) as conn:
            for i in range(1, 21):
                conn.execute("INSERT INTO customers VALUES (%s, 'n', NULL, 0)", (i,))
            for _ in range(5):
                conn.execute("UPDATE customers SET balance = balance + 1")
            conn.execute("DELETE FROM customers WHERE id > 10")
            live = {json.dumps({"id": i}, separators=(",", ":")).encode() for i in range(1, 11)}

            # Compaction needs closed segments: keep appending (an update of one row) so segments roll.
            def compacted(msgs: list[Any]) -> bool:
                keys = [m.key() for m in msgs]
                return len(keys) == len(set(keys)) and set(keys) == live

            deadline = time.monotonic() + 120
            msgs: list[Any] = []
            while time.monotonic() < deadline:
                conn.execute("UPDATE customers SET balance = balance + 1 WHERE id = 1")
                time.sleep(0.5)
                msgs = consume_all([topic], timeout=10.0)
                if compacted(msgs[:-1]) or compacted(msgs):
                    break
    finally:
        assert c.stop() == 0
    keys = [m.key() for m in msgs]
    # The active segment may still hold the latest update of row 1; everything else is one record per live key.
    assert set(keys) == live
    assert len(keys) - keys.count(b'{"id":1}') == len(live) - 1
    assert all(m.value() is not None for m in msgs)
