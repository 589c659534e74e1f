"""The outbox through the real daemon: both routes, rollback, per-aggregate order, malformed events, start-up errors."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest

from cdc.outbox import publish
from cdc.sink.registry import RegistryClient
from tests.support.connector import Connector, write_config
from tests.support.db import scalar

pytestmark = pytest.mark.integration

PREFIX = "app.events"  # the table-less route's message prefix
OUTBOX_DDL = """
CREATE TABLE outbox (
    id            uuid PRIMARY KEY,
    aggregatetype text NOT NULL,
    aggregateid   text,
    type          text NOT NULL,
    payload       {payload} NOT NULL,
    tenant        text
);
CREATE TABLE orders (id int PRIMARY KEY, total numeric(10,2));
CREATE TABLE counters (aggregate text PRIMARY KEY, n int NOT NULL);
"""


def make_config(tmp_path: Path, services: Any, dsn: str, slot: str, pub: str, prefix: str, **over: Any) -> Path:
    outbox = {
        "tables": [{"name": "public.outbox", "extra": [{"column": "tenant", "placement": "header"}]}],
        "message_prefix": PREFIX,
        "topic": "{topic_prefix}.outbox.{aggregate_type}",
        **over.pop("outbox", {}),
    }
    return write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot, "publication": pub},
        tables=["public.orders"],
        kafka={"bootstrap_servers": services.kafka_bootstrap, "partitions": 3},
        topic_prefix=prefix,
        status_interval_s=1.0,
        outbox=outbox,
        **over,
    )


def schema(dsn: str, payload: str = "jsonb") -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(OUTBOX_DDL.format(payload=payload))
    return dsn


def read_until(consume_all: Any, topics: list[str], n: int, timeout: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout
    msgs: list[Any] = []
    while time.monotonic() < deadline:
        msgs = consume_all(topics, timeout=10.0)
        if len(msgs) >= n:
            return msgs
        time.sleep(0.3)
    raise AssertionError(f"{topics}: {len(msgs)} records, expected {n}")


def wait_confirmed(dsn: str, slot: str, timeout: float = 60) -> None:
    """Until the slot confirmed everything written so far: every event before now is in Kafka."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        target = scalar(conn.execute("SELECT pg_current_wal_lsn()"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s", (target, slot)
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise AssertionError(f"slot {slot} did not confirm {target} within {timeout}s")


def metrics(c: Connector) -> str:
    port = next(e["port"] for e in c.log_events() if e.get("event") == "http_listening")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body: bytes = resp.read()
        return body.decode()


def _report_missing_counters(consume_all: Any, topic: str, c: Connector, dsn: str) -> None:
    """On a short read: which (aggregate, version) records are absent, what the database holds, and every
    warning or error the daemon logged, so that a failure here says where the events went."""
    seen: dict[str, set[int]] = {}
    for m in consume_all([topic], timeout=20.0):
        seen.setdefault(m.key().decode(), set()).add(json.loads(m.value())["n"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        final: dict[str, int] = dict(conn.execute("SELECT aggregate, n FROM counters").fetchall())
    missing = {a: sorted(set(range(1, n + 1)) - seen.get(a, set())) for a, n in final.items()}
    noisy = [e for e in c.log_events() if e.get("level") in ("warning", "error", "critical")]
    print("missing (aggregate: versions):", {a: v for a, v in missing.items() if v})
    print("daemon warnings and errors:", noisy[-40:])
    print("metrics:", "\n".join(line for line in metrics(c).splitlines() if "outbox" in line or "dead" in line))


def test_both_routes_atomic_with_the_transaction_in_commit_order_per_aggregate(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all, kafka_admin
):
    dsn = schema(pg_dsn)
    c = Connector(make_config(tmp_path, services, dsn, slot_name, publication_name, topic_prefix), tmp_path / "l")
    c.start()
    try:
        c.wait_streaming(dsn, slot_name)
        # Table route, with a business change, through the helper; the row is deleted in the same
        # transaction (the outbox stays empty) and the event still appears.
        with psycopg.connect(dsn) as conn:
            conn.execute("INSERT INTO orders VALUES (1, 9.90)")
            first = publish(
                conn, "order", "1", "OrderPlaced", {"order": 1, "total": "9.90"}, headers={"tenant": "acme"}
            )
            conn.execute("DELETE FROM outbox WHERE id = %s", (first,))
        # Table-less route.
        with psycopg.connect(dsn) as conn:
            conn.execute("INSERT INTO orders VALUES (2, 5.00)")
            second = publish(
                conn,
                "order",
                "2",
                "OrderPlaced",
                {"order": 2},
                via="message",
                prefix=PREFIX,
                headers={"tenant": "beta"},
            )
        # Rolled back on both routes: nothing may appear.
        with psycopg.connect(dsn) as conn:
            publish(conn, "order", "3", "OrderPlaced", {"order": 3})
            publish(conn, "order", "3", "OrderPlaced", {"order": 3}, via="message", prefix=PREFIX)
            conn.rollback()
        # Concurrent writers on shared aggregates: the counter row lock orders each aggregate's
        # transactions, so version n must arrive as the n-th record of its aggregate.
        aggregates = [f"c{i}" for i in range(6)]
        with psycopg.connect(dsn, autocommit=True) as conn:
            for a in aggregates:
                conn.execute("INSERT INTO counters VALUES (%s, 0)", (a,))
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    for i in range(30):
                        a = aggregates[(w + i) % len(aggregates)]
                        via: Literal["table", "message"] = "message" if i % 3 == 0 else "table"
                        with conn.transaction():
                            n = scalar(
                                conn.execute("UPDATE counters SET n = n + 1 WHERE aggregate = %s RETURNING n", (a,))
                            )
                            publish(conn, "counter", a, "Bumped", {"n": n, "writer": w}, via=via, prefix=PREFIX)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        wait_confirmed(dsn, slot_name)
        orders = consume_all([f"{topic_prefix}.outbox.order"], timeout=20.0)
        try:
            counters = read_until(consume_all, [f"{topic_prefix}.outbox.counter"], 120)
        except AssertionError:
            _report_missing_counters(consume_all, f"{topic_prefix}.outbox.counter", c, dsn)
            raise
        scraped = metrics(c)
    finally:
        assert c.stop() == 0

    assert sorted((m.key(), m.value()) for m in orders) == [
        (b"1", b'{"order": 1, "total": "9.90"}'),  # the jsonb text as the server sent it
        (b"2", b'{"order":2}'),
    ]
    by_key = {m.key(): dict(m.headers()) for m in orders}
    assert by_key[b"1"]["id"] == first.encode() and by_key[b"1"]["tenant"] == b"acme"
    assert by_key[b"2"]["id"] == second.encode() and by_key[b"2"]["tenant"] == b"beta"
    assert all(h["eventType"] == b"OrderPlaced" for h in by_key.values())
    assert len(orders) == 2  # the rolled-back events never appear

    assert len(counters) == 120
    partitions: dict[bytes, set[int]] = {}
    versions: dict[bytes, list[int]] = {}
    for m in counters:  # partition order = offset order
        partitions.setdefault(m.key(), set()).add(m.partition())
        versions.setdefault(m.key(), []).append(json.loads(m.value())["n"])
    assert all(len(p) == 1 for p in partitions.values()), partitions  # one aggregate, one partition
    for key, seen in versions.items():
        assert seen == list(range(1, len(seen) + 1)), (key, seen)  # commit order, nothing missing or doubled

    topics = kafka_admin.list_topics(timeout=10).topics
    assert f"{topic_prefix}.public.outbox" not in topics  # its own change topic only when asked
    assert f"{topic_prefix}.public.orders" in topics
    assert 'cdc_outbox_events_total{aggregate_type="counter",route="message"} 40.0' in scraped
    assert 'cdc_outbox_events_total{aggregate_type="counter",route="table"} 80.0' in scraped


def test_malformed_events_go_to_the_dead_letter_topic_and_the_stream_goes_on(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    dsn = schema(pg_dsn, payload="text")
    dlq = f"{topic_prefix}.dlq"
    cfg = make_config(
        tmp_path,
        services,
        dsn,
        slot_name,
        publication_name,
        topic_prefix,
        outbox={"on_error": "dead_letter", "aggregate_types": ["order"]},
        limits={"dead_letter_topic": dlq},
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(dsn, slot_name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            insert = (
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                "VALUES (gen_random_uuid(), %s, %s, 'T', %s)"
            )
            conn.execute(insert, ("order", None, "{}"))  # no aggregate id
            conn.execute(insert, ("order", "7", "{not json"))  # text payload that is not JSON
            conn.execute(insert, ("invoice", "8", "{}"))  # not an allowed aggregate type
            conn.execute(
                "SELECT pg_logical_emit_message(false, %s, %s::text)",
                (PREFIX, '{"aggregate_type":"order","aggregate_id":"9","type":"T","payload":{}}'),
            )  # not transactional
            conn.execute(
                "SELECT pg_logical_emit_message(true, %s, %s::text)", (PREFIX, '{"aggregate_type":"order"}')
            )  # no aggregate id in a message
            conn.execute(insert, ("order", "10", '{"ok": true}'))  # a good one after them
        dead = read_until(consume_all, [dlq], 5)
        good = read_until(consume_all, [f"{topic_prefix}.outbox.order"], 1)
        wait_confirmed(dsn, slot_name)
        scraped = metrics(c)
    finally:
        assert c.stop() == 0
    reasons = [json.loads(m.value())["reason"] for m in dead]
    assert reasons == [
        "missing_aggregate_id",
        "payload_not_json",
        "aggregate_type_not_allowed",
        "not_transactional",
        "missing_aggregate_id",
    ]
    bodies = [json.loads(m.value()) for m in dead]
    assert bodies[1]["row"]["payload"] == "{not json" and bodies[1]["from"] == "public.outbox"
    assert bodies[3]["message"]["prefix"] == PREFIX and "aggregate_id" in bodies[3]["message"]["content"]
    assert [m.key() for m in dead][1:3] == [b"7", b"8"]
    assert [(m.key(), m.value()) for m in good] == [(b"10", b'{"ok": true}')]
    logged = [e for e in c.log_events() if e.get("event") == "outbox_dead_lettered"]
    assert len(logged) == 5 and all(e["lsn"] and e["source"] for e in logged)
    assert "cdc_dead_letters_total 5.0" in scraped
    assert 'cdc_outbox_dead_letters_total{reason="missing_aggregate_id"} 2.0' in scraped


def test_by_default_a_poison_row_is_set_aside_under_the_prefix_and_capture_goes_on(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    """The issue's case: one malformed row in one application's outbox must not stop the database's capture,
    at once or at any restart. Defaults only: no on_error, no dead-letter topic, no topic template."""
    dsn = schema(pg_dsn)
    cfg = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.orders"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
        outbox={"tables": ["public.outbox"]},
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(dsn, slot_name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (1, 9.90)")
                conn.execute(
                    "INSERT INTO outbox VALUES (gen_random_uuid(), 'order', '', 'T', '{}')"
                )  # poison: empty id
                conn.execute("INSERT INTO outbox VALUES (gen_random_uuid(), 'order', '1', 'Placed', '{\"n\": 1}')")
            conn.execute("INSERT INTO orders VALUES (2, 1.00)")
        dead = read_until(consume_all, [f"{topic_prefix}.outbox.dead_letter"], 1)
        good = read_until(consume_all, [f"{topic_prefix}.outbox.event.order"], 1)
        orders = read_until(consume_all, [f"{topic_prefix}.public.orders"], 2)
        scraped = metrics(c)
    finally:
        assert c.stop() == 0
    assert len(dead) == 1 and dict(dead[0].headers())["cdc.dead_letter.reason"] == b"missing_aggregate_id"
    assert json.loads(dead[0].value())["from"] == "public.outbox"
    assert [(m.key(), json.loads(m.value())) for m in good] == [(b"1", {"n": 1})]
    assert sorted(json.loads(m.key())["id"] for m in orders) == [1, 2]
    [logged] = [e for e in c.log_events() if e.get("event") == "outbox_dead_lettered"]
    assert logged["source"] == "public.outbox" and logged["reason"] == "missing_aggregate_id" and "key" in logged
    assert 'cdc_outbox_dead_letters_total{reason="missing_aggregate_id"} 1.0' in scraped
    # Restarted: the poison row does not stop it again, and is not set aside twice.
    c = Connector(cfg, tmp_path / "l2").start()
    try:
        c.wait_streaming(dsn, slot_name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (3, 3.00)")
        read_until(consume_all, [f"{topic_prefix}.public.orders"], 3)
    finally:
        assert c.stop() == 0
    assert len(consume_all([f"{topic_prefix}.outbox.dead_letter"], timeout=10.0)) == 1


@pytest.mark.parametrize("route", ["table", "message"])
def test_a_malformed_event_with_on_error_fail_stops_the_pipeline_naming_it(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all, route
):
    dsn = schema(pg_dsn)
    cfg = make_config(tmp_path, services, dsn, slot_name, publication_name, topic_prefix, outbox={"on_error": "fail"})
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(dsn, slot_name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            before = scalar(conn.execute("SELECT pg_current_wal_lsn()"))
            if route == "table":
                conn.execute(
                    "INSERT INTO outbox VALUES (gen_random_uuid(), 'order', '', 'T', '{}')"
                )  # empty aggregate id
            else:
                conn.execute("SELECT pg_logical_emit_message(true, %s, 'not json')", (PREFIX,))
        code = c.wait_exit(60)
    finally:
        c.stop()
    assert code == 1
    fatal = [e for e in c.log_events() if e.get("event") == "fatal"]
    assert fatal and fatal[0]["kind"] == "OutboxError"
    error = fatal[0]["error"]
    if route == "table":
        assert "outbox public.outbox at LSN" in error and "missing_aggregate_id" in error
    else:
        assert f"outbox message {PREFIX}" in error and "message_not_json_object" in error
    assert "outbox.on_error: dead_letter (the default)" in error  # the fix
    with psycopg.connect(dsn, autocommit=True) as conn:
        confirmed = conn.execute(
            "SELECT confirmed_flush_lsn <= %s FROM pg_replication_slots WHERE slot_name = %s", (before, slot_name)
        ).fetchone()
    assert confirmed is not None and confirmed[0]  # the bad transaction was not confirmed: a restart meets it again
    assert consume_all([f"{topic_prefix}.outbox.order"], timeout=10.0) == []


def test_a_missing_outbox_table_or_column_is_a_clear_start_up_error(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE events (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, body jsonb)")
    cfg = make_config(
        tmp_path,
        services,
        pg_dsn,
        slot_name,
        publication_name,
        topic_prefix,
        outbox={"tables": ["public.nowhere", "public.events"]},
    )
    c = Connector(cfg, tmp_path / "l").start()
    assert c.wait_exit(60) == 1
    out = c.output()
    assert "table public.nowhere does not exist in database" in out and "remove it from 'outbox.tables'" in out

    cfg = make_config(
        tmp_path,
        services,
        pg_dsn,
        slot_name,
        publication_name,
        topic_prefix,
        outbox={"tables": [{"name": "public.events", "extra": [{"column": "tenant", "placement": "header"}]}]},
    )
    c = Connector(cfg, tmp_path / "l2").start()
    assert c.wait_exit(60) == 1
    out = c.output()
    assert "outbox table public.events has no column type (the type)" in out
    assert "outbox.tables[0].columns.payload" in out  # 'payload' is missing too: the fix names the key
    assert "has no column tenant (outbox.tables[0].extra[0])" in out
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)).fetchone() is None


def test_exactly_once_outbox_events_are_seen_once_by_read_committed_consumers(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    dsn = schema(pg_dsn)
    cfg = make_config(
        tmp_path,
        services,
        dsn,
        slot_name,
        publication_name,
        topic_prefix,
        delivery={"mode": "exactly_once", "commit_interval_ms": 50},
        outbox={"tables": [{"name": "public.outbox", "produce_change_topic": True}]},
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(dsn, slot_name)
        with psycopg.connect(dsn) as conn:
            for i in range(5):
                conn.execute("INSERT INTO orders VALUES (%s, 1)", (i,))
                publish(
                    conn,
                    "order",
                    str(i),
                    "OrderPlaced",
                    {"order": i},
                    via="table" if i % 2 else "message",
                    prefix=PREFIX,
                )
                conn.commit()
            publish(conn, "order", "99", "OrderPlaced", {"order": 99})
            conn.rollback()
        wait_confirmed(dsn, slot_name)
        assert c.stop() == 0
        # A restart resumes from the committed position: nothing is written twice.
        c = Connector(cfg, tmp_path / "l2").start()
        c.wait_streaming(dsn, slot_name)
        with psycopg.connect(dsn) as conn:
            publish(conn, "order", "5", "OrderPlaced", {"order": 5})
        wait_confirmed(dsn, slot_name)
        events = read_until(consume_all, [f"{topic_prefix}.outbox.order"], 6)
        changes = consume_all([f"{topic_prefix}.public.outbox"], timeout=10.0)
    finally:
        assert c.stop() == 0
    assert sorted(json.loads(m.value())["order"] for m in events) == [0, 1, 2, 3, 4, 5]
    assert [json.loads(m.value())["op"] for m in changes] == ["c", "c", "c"]  # produce_change_topic: true


def test_avro_outbox_events_decode_through_the_registry_with_the_payload_as_json_text(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    from tests.support.registry import Consumer

    if services.schema_registry_url is None:
        pytest.skip("no schema registry in this environment (cdc.dev could not fetch Apicurio, or docker mode)")
    dsn = schema(pg_dsn)
    cfg = make_config(
        tmp_path,
        services,
        dsn,
        slot_name,
        publication_name,
        topic_prefix,
        format="avro",
        schema_registry={"url": services.schema_registry_url},
        outbox={"tables": [{"name": "public.outbox", "extra": [{"column": "tenant", "placement": "envelope"}]}]},
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(dsn, slot_name)
        with psycopg.connect(dsn) as conn:
            first = publish(conn, "order", "1", "OrderPlaced", {"total": 1}, headers={"tenant": "acme"})
            second = publish(conn, "order", "2", "OrderPlaced", {"total": 2}, via="message", prefix=PREFIX)
        msgs = read_until(consume_all, [f"{topic_prefix}.outbox.order"], 2)
    finally:
        assert c.stop() == 0
    consumer = Consumer(services.schema_registry_url)
    decoded = sorted((m.key(), consumer.decode(m.value())) for m in msgs)
    registry = RegistryClient(services.schema_registry_url)
    assert f"{topic_prefix}.outbox.order-value" in registry.subjects()
    registry.delete_subject(f"{topic_prefix}.outbox.order-value", permanent=True)  # the registry outlives the test
    assert decoded == [
        (
            b"1",
            {
                "id": first,
                "type": "OrderPlaced",
                "aggregate_type": "order",
                "aggregate_id": "1",
                "payload": '{"total": 1}',
                "tenant": "acme",
            },
        ),
        (
            b"2",
            {
                "id": second,
                "type": "OrderPlaced",
                "aggregate_type": "order",
                "aggregate_id": "2",
                "payload": '{"total":2}',
            },
        ),
    ]
