"""Failover slots (PostgreSQL 17+): the slot the daemon creates, or finds, is one a standby with
sync_replication_slots keeps through a promotion; asking for one where the server cannot keep it is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.connector import Connector, nothing_created, run_once, write_config

pytestmark = pytest.mark.integration


def slot_failover(dsn: str, slot: str) -> bool | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else bool(row[0])


def config(tmp_path: Path, dsn: str, slot: str, publication: str, prefix: str, bootstrap: str, **source: Any) -> Path:
    return write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot, "publication": publication, **source},
        tables=["public.items"],
        kafka={"bootstrap_servers": bootstrap},
        topic_prefix=prefix,
    )


def values(consume_all: Any, topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.value())["after"] for m in consume_all(topic, timeout=30) if m.value() is not None]


@pytest.fixture
def items(pg18_dsn: str) -> str:
    with psycopg.connect(pg18_dsn, autocommit=True) as conn:
        assert conn.info.server_version >= 180000
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items VALUES (1, 'before the slot')")
    return pg18_dsn


def test_the_slot_the_daemon_creates_on_18_is_a_failover_slot(
    tmp_path, services, items, slot_name, publication_name, topic_prefix, consume_all
):
    path = config(tmp_path, items, slot_name, publication_name, topic_prefix, services.kafka_bootstrap)
    daemon = Connector(path, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(items, slot_name)
        assert slot_failover(items, slot_name) is True
        created = [e for e in daemon.log_events() if e.get("event") == "slot_created"]
        assert [e["failover"] for e in created] == [True]
        with psycopg.connect(items, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (2, 'streamed')")
        topic = f"{topic_prefix}.public.items"
        for _ in range(50):
            rows = values(consume_all, topic)
            if len(rows) == 2:
                break
        assert rows == [{"id": 1, "name": "before the slot"}, {"id": 2, "name": "streamed"}]
    finally:
        assert daemon.stop() == 0


def test_an_ordinary_slot_stays_one_when_asked_and_becomes_a_failover_slot_at_the_next_start(
    tmp_path, services, items, slot_name, publication_name, topic_prefix, consume_all
):
    off = config(
        tmp_path, items, slot_name, publication_name, topic_prefix, services.kafka_bootstrap, slot_failover=False
    )
    daemon = Connector(off, tmp_path / "cdc.log").start()
    daemon.wait_streaming(items, slot_name)
    assert slot_failover(items, slot_name) is False
    assert daemon.stop() == 0
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (2, 'while stopped')")

    default = config(tmp_path, items, slot_name, publication_name, topic_prefix, services.kafka_bootstrap)
    daemon = Connector(default, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(items, slot_name)
        assert slot_failover(items, slot_name) is True
        assert [e["slot"] for e in daemon.log_events() if e.get("event") == "slot_failover_enabled"] == [slot_name]
        topic = f"{topic_prefix}.public.items"
        for _ in range(50):
            rows = values(consume_all, topic)
            if len(rows) == 2:
                break
        assert rows == [{"id": 1, "name": "before the slot"}, {"id": 2, "name": "while stopped"}]
    finally:
        assert daemon.stop() == 0


def test_slot_failover_on_postgres_15_is_refused_before_anything_is_created(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, kafka_admin
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.info.server_version < 170000
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    path = config(
        tmp_path, pg_dsn, slot_name, publication_name, topic_prefix, services.kafka_bootstrap, slot_failover=True
    )
    code, out = run_once(tmp_path, path)
    assert code == 1
    assert "source.slot_failover is true, but the server is PostgreSQL 15" in out
    assert "need PostgreSQL 17 or newer" in out
    nothing_created(pg_dsn, slot_name, publication_name, kafka_admin, topic_prefix)
