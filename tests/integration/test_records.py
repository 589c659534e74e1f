"""What lands on the topics through the real daemon: key changes, truncates, column policies, limits."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import NewTopic

from tests.support.connector import Connector, write_config
from tests.support.db import scalar
from tests.support.http import get, http_port, metric
from tests.support.partitions import java_partition
from tests.support.registry import Consumer

pytestmark = pytest.mark.integration


def config(tmp_path: Path, services: Any, dsn: str, slot: str, pub: str, prefix: str, **extra: Any) -> Path:
    kafka = {"bootstrap_servers": services.kafka_bootstrap, **extra.pop("kafka", {})}
    return write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot, "publication": pub},
        tables=extra.pop("tables", ["public.people"]),
        kafka=kafka,
        topic_prefix=prefix,
        status_interval_s=1.0,
        **extra,
    )


def read_until(consume_all: Any, topic: str, n: int, timeout: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout
    msgs: list[Any] = []
    while time.monotonic() < deadline:
        msgs = consume_all([topic], timeout=10.0)
        if len(msgs) >= n:
            return msgs
        time.sleep(0.3)
    raise AssertionError(f"{topic}: {len(msgs)} records, expected {n}")


@pytest.fixture
def people(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE people (id int PRIMARY KEY, name text, email text, ssn text, notes text)")
    return pg_dsn


def test_a_primary_key_change_is_a_delete_its_tombstone_and_a_create(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all
):
    c = Connector(config(tmp_path, services, people, slot_name, publication_name, topic_prefix), tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            conn.execute("INSERT INTO people VALUES (1, 'a', 'a@x', '1', 'n')")
            conn.execute("UPDATE people SET id = 2 WHERE id = 1")
        msgs = read_until(consume_all, f"{topic_prefix}.public.people", 4)
    finally:
        assert c.stop() == 0
    assert [m.key() for m in msgs] == [b'{"id":1}', b'{"id":1}', b'{"id":1}', b'{"id":2}']
    ops = [json.loads(m.value())["op"] if m.value() else None for m in msgs]
    assert ops == ["c", "d", None, "c"]
    assert dict(msgs[1].headers())["__debezium.newkey"] == b'{"id":2}'
    assert dict(msgs[3].headers())["__debezium.oldkey"] == b'{"id":1}'


def test_a_truncate_leaves_one_marker_per_partition_with_a_key(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = config(tmp_path, services, people, slot_name, publication_name, topic_prefix, kafka={"partitions": 3})
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            for i in range(6):
                conn.execute("INSERT INTO people (id, name) VALUES (%s, 'n')", (i,))
            conn.execute("TRUNCATE people")
        msgs = read_until(consume_all, f"{topic_prefix}.public.people", 9)
    finally:
        assert c.stop() == 0
    markers = [m for m in msgs if dict(m.headers() or []).get("cdc.truncate") == b"1"]
    assert sorted(m.partition() for m in markers) == [0, 1, 2]
    for m in markers:
        assert m.key() == b'{"id":null}'  # the key fields, all null: the same key on every partition
        assert json.loads(m.value())["op"] == "t"
        # the marker comes after every row of its partition
        assert all(r.offset() < m.offset() for r in msgs if r.partition() == m.partition() and r is not m)


def test_column_lists_and_masks_shape_what_is_published(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = config(
        tmp_path,
        services,
        people,
        slot_name,
        publication_name,
        topic_prefix,
        tables=[
            {
                "name": "public.people",
                "exclude_columns": ["notes"],
                "mask": {"ssn": "fixed", "email": "hash"},
                "partitions": 2,
            }
        ],
        masking={"fixed_value": "###"},
    )
    c = Connector(cfg, tmp_path / "l", env={"CDC_MASKING__SALT": "pepper"}).start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            conn.execute("INSERT INTO people VALUES (1, 'Ada', 'ada@x.org', '123-45-6789', 'private')")
        msgs = read_until(consume_all, f"{topic_prefix}.public.people", 1)
    finally:
        assert c.stop() == 0
    after = json.loads(msgs[0].value())["after"]
    assert after == {
        "id": 1,
        "name": "Ada",
        "email": hashlib.sha256(b"pepper" + b"ada@x.org").hexdigest(),
        "ssn": "###",
    }
    assert "pepper" not in c.output()


def test_per_table_partitions_are_used_when_creating_the_topic(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, kafka_admin
):
    cfg = config(
        tmp_path,
        services,
        people,
        slot_name,
        publication_name,
        topic_prefix,
        tables=[{"name": "public.people", "partitions": 4}],
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
    finally:
        assert c.stop() == 0
    meta = kafka_admin.list_topics(timeout=10).topics[f"{topic_prefix}.public.people"]
    assert len(meta.partitions) == 4


def test_an_existing_topic_with_the_wrong_cleanup_policy_stops_start_up(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, kafka_admin
):
    topic = f"{topic_prefix}.public.people"
    kafka_admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "delete"})])[topic].result()
    c = Connector(config(tmp_path, services, people, slot_name, publication_name, topic_prefix), tmp_path / "l").start()
    assert c.wait_exit(60) == 1
    assert f"topic {topic} has cleanup.policy=delete" in c.output()
    assert "cleanup.policy=compact" in c.output()


def test_an_oversized_record_stops_the_pipeline_naming_table_and_key_and_confirms_nothing_past_it(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = config(
        tmp_path, services, people, slot_name, publication_name, topic_prefix, limits={"max_record_bytes": 4096}
    )
    c = Connector(cfg, tmp_path / "l").start()
    c.wait_streaming(people, slot_name)
    with psycopg.connect(people, autocommit=True) as conn:
        conn.execute("INSERT INTO people (id, name) VALUES (1, 'small')")
        read_until(consume_all, f"{topic_prefix}.public.people", 1)
        before = scalar(
            conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot_name,))
        )
        conn.execute("INSERT INTO people (id, notes) VALUES (2, repeat('x', 10000))")
        assert c.wait_exit(60) == 1
        after = scalar(
            conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot_name,))
        )
    fatal = [e for e in c.log_events() if e.get("event") == "fatal"]
    assert len(fatal) == 1 and fatal[0]["kind"] == "RecordTooLarge"
    error = fatal[0]["error"]
    assert 'public.people key {"id":2}' in error and "limits.max_record_bytes=4096" in error
    assert after == before


def test_an_oversized_record_goes_to_the_dead_letter_topic_when_configured(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all
):
    dlq = f"{topic_prefix}.dlq"
    cfg = config(
        tmp_path,
        services,
        people,
        slot_name,
        publication_name,
        topic_prefix,
        limits={"max_record_bytes": 4096, "dead_letter_topic": dlq},
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            conn.execute("INSERT INTO people (id, notes) VALUES (2, repeat('x', 10000))")
            conn.execute("INSERT INTO people (id, name) VALUES (3, 'after')")
        letters = read_until(consume_all, dlq, 1)
        rows = read_until(consume_all, f"{topic_prefix}.public.people", 1)
    finally:
        assert c.stop() == 0
    assert letters[0].key() == b'{"id":2}'
    reason = json.loads(letters[0].value())
    assert reason["reason"] == "record_too_large" and reason["size"] > 10000
    assert [m.key() for m in rows] == [b'{"id":3}']
    assert any(e.get("event") == "record_dead_lettered" for e in c.log_events())


def test_transaction_metadata_and_heartbeats_follow_debezium_shapes(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all, kafka_admin
):
    cfg = config(
        tmp_path,
        services,
        people,
        slot_name,
        publication_name,
        topic_prefix,
        transaction_metadata=True,
        heartbeat={"interval_ms": 200},
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("INSERT INTO people (id) VALUES (1), (2), (3)")
                conn.execute("DELETE FROM people WHERE id = 2")
        tx = read_until(consume_all, f"{topic_prefix}.transaction", 2)
        time.sleep(1)
    finally:
        assert c.stop() == 0
    heartbeats = f"__debezium-heartbeat.{topic_prefix}"
    try:
        beats = read_until(consume_all, heartbeats, 2)
    finally:
        kafka_admin.delete_topics([heartbeats])
    begin, end = (json.loads(m.value()) for m in tx[:2])
    assert begin["status"] == "BEGIN" and end["status"] == "END" and begin["id"] == end["id"]
    assert tx[0].key() == tx[1].key() == json.dumps({"id": begin["id"]}, separators=(",", ":")).encode()
    assert end["event_count"] == 4
    assert end["data_collections"] == [{"data_collection": "public.people", "event_count": 4}]
    assert beats[0].key() == json.dumps({"serverName": topic_prefix}, separators=(",", ":")).encode()
    assert json.loads(beats[-1].value())["ts_ms"] > 0


def test_the_slot_advances_while_captured_tables_are_idle_and_others_are_busy(
    tmp_path, services, people, slot_name, publication_name, topic_prefix
):
    with psycopg.connect(people, autocommit=True) as conn:
        conn.execute("CREATE TABLE noise (id serial PRIMARY KEY, body text)")
    c = Connector(config(tmp_path, services, people, slot_name, publication_name, topic_prefix), tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            start = scalar(
                conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot_name,))
            )
            for _ in range(200):
                conn.execute("INSERT INTO noise (body) VALUES (repeat('n', 500))")
            target = scalar(conn.execute("SELECT pg_current_wal_lsn()"))
            deadline = time.monotonic() + 30
            advanced = False
            while time.monotonic() < deadline and not advanced:
                advanced = scalar(
                    conn.execute(
                        "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s",
                        (target, slot_name),
                    )
                )
                time.sleep(0.5)
    finally:
        assert c.stop() == 0
    assert advanced, f"the slot stayed near {start} while the database wrote past {target}"


def test_logical_messages_transactional_or_not_reach_the_message_topic(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all
):
    c = Connector(config(tmp_path, services, people, slot_name, publication_name, topic_prefix), tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("INSERT INTO people (id) VALUES (1)")
                conn.execute("SELECT pg_logical_emit_message(true, 'app.tx', 'inside')")
            conn.execute("SELECT pg_logical_emit_message(false, 'app.now', 'outside')")
            conn.execute("INSERT INTO people (id) VALUES (2)")
        msgs = read_until(consume_all, f"{topic_prefix}.message", 2)
        read_until(consume_all, f"{topic_prefix}.public.people", 2)
    finally:
        assert c.stop() == 0
    import base64

    contents = {
        json.loads(m.key())["prefix"]: base64.b64decode(json.loads(m.value())["message"]["content"]) for m in msgs
    }
    assert contents == {"app.tx": b"inside", "app.now": b"outside"}
    assert all(json.loads(m.value())["op"] == "m" for m in msgs)


@pytest.mark.parametrize("lists", [{"exclude": [r"other\..*"]}, {"include": [r"app\..*"]}])
def test_logical_messages_are_published_only_for_the_prefixes_configured_and_never_the_own_heartbeat(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all, lists
):
    cfg = config(
        tmp_path,
        services,
        people,
        slot_name,
        publication_name,
        topic_prefix,
        messages=lists,
        heartbeat={"interval_ms": 200, "action_query": "SELECT pg_logical_emit_message(false, 'hb', now()::text)"},
        http={"port": 0, "host": "127.0.0.1"},
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            conn.execute("SELECT pg_logical_emit_message(true, 'other.outbox', 'another daemon''s')")
            conn.execute("SELECT pg_logical_emit_message(false, 'app.now', 'outside')")
            conn.execute("SELECT pg_logical_emit_message(true, 'app.tx', 'inside')")
            conn.execute("INSERT INTO people (id) VALUES (1)")
        read_until(consume_all, f"{topic_prefix}.public.people", 1)
        time.sleep(1.0)  # heartbeats came and went meanwhile
        msgs = consume_all([f"{topic_prefix}.message"], timeout=30)
        scraped = get(http_port(c), "/metrics")[1]
    finally:
        assert c.stop() == 0
    assert sorted(json.loads(m.key())["prefix"] for m in msgs) == ["app.now", "app.tx"]
    left_out = metric(scraped, "cdc_messages_left_out_total", prefix="hb")
    assert left_out is not None and left_out >= 1
    if "exclude" in lists:
        assert metric(scraped, "cdc_messages_left_out_total", prefix="other.outbox") == 1


@pytest.mark.parametrize("fmt", ["json", "json_schemas", "avro"])
def test_with_transaction_metadata_every_change_event_carries_debeziums_transaction_block(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all, fmt
):
    with psycopg.connect(people, autocommit=True) as conn:
        conn.execute("CREATE TABLE pets (id int PRIMARY KEY, name text)")
    extra: dict[str, Any] = (
        {"format": "avro", "schema_registry": {"url": services.schema_registry_url}} if fmt == "avro" else {}
    )
    if fmt == "json_schemas":
        extra["json"] = {"schemas_enable": True}
    cfg = config(
        tmp_path,
        services,
        people,
        slot_name,
        publication_name,
        topic_prefix,
        tables=["public.people", "public.pets"],
        transaction_metadata=True,
        **extra,
    )
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("INSERT INTO people (id) VALUES (1), (2)")
                conn.execute("INSERT INTO pets VALUES (1, 'rex')")
                conn.execute("UPDATE people SET id = id WHERE id = 2")
        people_msgs = read_until(consume_all, f"{topic_prefix}.public.people", 3)
        pets_msgs = read_until(consume_all, f"{topic_prefix}.public.pets", 1)
        tx = read_until(consume_all, f"{topic_prefix}.transaction", 2)
    finally:
        assert c.stop() == 0
    decode: Callable[[bytes], Any]
    if fmt == "avro":
        consumer = Consumer(services.schema_registry_url)
        decode = consumer.decode
    else:

        def decode_json(data: bytes) -> Any:
            value = json.loads(data)
            return value["payload"] if fmt == "json_schemas" else value

        decode = decode_json

    begin = decode(tx[0].value())
    blocks = [decode(m.value())["transaction"] for m in people_msgs] + [decode(pets_msgs[0].value())["transaction"]]
    assert blocks == [
        {"id": begin["id"], "total_order": 1, "data_collection_order": 1},
        {"id": begin["id"], "total_order": 2, "data_collection_order": 2},
        {"id": begin["id"], "total_order": 4, "data_collection_order": 3},
        {"id": begin["id"], "total_order": 3, "data_collection_order": 1},
    ]


def test_without_transaction_metadata_the_transaction_block_is_null(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all
):
    c = Connector(config(tmp_path, services, people, slot_name, publication_name, topic_prefix), tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            conn.execute("INSERT INTO people (id) VALUES (1)")
        [msg] = read_until(consume_all, f"{topic_prefix}.public.people", 1)
    finally:
        assert c.stop() == 0
    assert json.loads(msg.value())["transaction"] is None


@pytest.mark.parametrize("position_headers", [False, True], ids=["no-headers", "position-headers"])
def test_every_record_lands_on_the_partition_a_java_producer_picks_for_its_key(
    tmp_path, services, people, slot_name, publication_name, topic_prefix, consume_all, position_headers
):
    """Key affinity is a contract with JVM clients (Kafka Streams joins, Connect sinks): the snapshot's rows,
    streamed creates, updates, deletes and their tombstones all on ``toPositive(murmur2(key)) % partitions``,
    whichever way the record was produced (positional calls without headers, keywords with them)."""
    with psycopg.connect(people, autocommit=True) as conn:
        for i in range(150):
            conn.execute("INSERT INTO people (id, name) VALUES (%s, 'before')", (i,))
    kafka = {"partitions": 5, "position_headers": position_headers}
    cfg = config(tmp_path, services, people, slot_name, publication_name, topic_prefix, kafka=kafka)
    c = Connector(cfg, tmp_path / "l").start()
    try:
        c.wait_streaming(people, slot_name)
        with psycopg.connect(people, autocommit=True) as conn:
            for i in range(150, 300):
                conn.execute("INSERT INTO people (id, name) VALUES (%s, 'after')", (i,))
            conn.execute("UPDATE people SET name = 'changed' WHERE id % 10 = 0")
            conn.execute("DELETE FROM people WHERE id % 25 = 1")
        # 150 snapshot reads + 150 creates + 30 updates + 12 deletes, each with its tombstone
        msgs = read_until(consume_all, f"{topic_prefix}.public.people", 150 + 150 + 30 + 12 * 2)
    finally:
        assert c.stop() == 0
    ops = Counter(json.loads(m.value())["op"] if m.value() else None for m in msgs)
    assert ops == {"r": 150, "c": 150, "u": 30, "d": 12, None: 12}
    assert {bool(m.headers()) for m in msgs if m.value()} == {position_headers}
    misplaced = [
        (m.key(), m.partition(), java_partition(m.key(), 5))
        for m in msgs
        if m.partition() != java_partition(m.key(), 5)
    ]
    assert misplaced == []
    assert len({m.partition() for m in msgs}) == 5  # the keys spread: the check above is not one partition's
