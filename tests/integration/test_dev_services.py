"""The local services that `cdc dev up` and the fixtures start: idempotent, and really usable."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from cdc import dev

pytestmark = pytest.mark.integration


def test_up_twice_gives_the_same_endpoints_and_status_reports_running(
    services: dev.Endpoints, services_mode: str, dev_state_dir: Path
) -> None:
    if services_mode != "local":
        pytest.skip("services come from Docker in this session, not from cdc.dev")
    state = dev_state_dir
    registry = services.schema_registry_url is not None
    again = dev.up(state, registry=registry)
    assert again == services
    st = dev.status(state)
    assert st["postgres"]["running"] and st["kafka"]["running"]
    assert st["postgres_dsn"] == services.postgres_dsn
    assert st["kafka_bootstrap"] == services.kafka_bootstrap
    assert st["kafka_ssl_bootstrap"] == services.kafka_ssl_bootstrap
    assert st["kafka_ssl_ca_location"] == services.kafka_ssl_ca_location
    assert st["schema_registry_url"] == services.schema_registry_url
    assert st["schema_registry"]["running"] is registry
    json.dumps(st)  # JSON-able as promised


def test_postgres_has_logical_decoding(pg_dsn: str, slot_name: str, publication_name: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SHOW max_replication_slots").fetchone() == ("64",)
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE t").format(sql.Identifier(publication_name)))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot_name,))
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        row = conn.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '1', 'publication_names', %s)",
            (slot_name, publication_name),
        ).fetchone()
        assert row is not None and row[0] >= 3  # BEGIN, RELATION, INSERT, COMMIT
    # the fixture drops the slot and the database afterwards


def test_a_topic_can_be_created_produced_to_and_read_back(
    services: dev.Endpoints, kafka_admin: AdminClient, topic_prefix: str, consume_all: Any
) -> None:
    topic = f"{topic_prefix}.smoke"
    futures = kafka_admin.create_topics(
        [NewTopic(topic, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})]
    )
    futures[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    for i in range(10):
        producer.produce(topic, key=f"k{i % 3}".encode(), value=f"v{i}".encode())
    producer.produce(topic, key=b"k0", value=None)  # a tombstone
    assert producer.flush(30) == 0
    msgs = consume_all(topic, timeout=30)
    assert len(msgs) == 11
    assert sorted(m.value() for m in msgs if m.value() is not None) == sorted(f"v{i}".encode() for i in range(10))
    assert [m.key() for m in msgs if m.value() is None] == [b"k0"]
    assert consume_all([f"{topic_prefix}.does_not_exist"], timeout=10) == []


def test_schema_registry_round_trip(services: dev.Endpoints, test_id: str) -> None:
    if services.schema_registry_url is None:
        pytest.skip("no schema registry in this session")
    schema = {
        "type": "record",
        "name": "Row",
        "namespace": "cdc.test",
        "fields": [{"name": "id", "type": "int"}, {"name": "v", "type": ["null", "string"], "default": None}],
    }
    subject = f"{test_id}-value"
    base = services.schema_registry_url
    registered = _http_json("POST", f"{base}/subjects/{subject}/versions", {"schema": json.dumps(schema)})
    assert isinstance(registered["id"], int)
    latest = _http_json("GET", f"{base}/subjects/{subject}/versions/latest")
    assert latest["subject"] == subject and latest["version"] == 1 and latest["id"] == registered["id"]
    assert json.loads(latest["schema"]) == schema
    by_id = _http_json("GET", f"{base}/schemas/ids/{registered['id']}")
    assert json.loads(by_id["schema"]) == schema
    # Registering the same schema again returns the same id.
    assert _http_json("POST", f"{base}/subjects/{subject}/versions", {"schema": json.dumps(schema)}) == registered


def _http_json(method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())
