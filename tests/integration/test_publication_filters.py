"""Snapshots copy exactly what the publication publishes (PostgreSQL 15+ row filters and column lists),
the initial one and one taken while streaming, so that they agree with the stream; under the documented
least-privilege role, with the publication created by the tables' owner."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import psycopg
import pytest

from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration


def afters(consume_all: Any, topic: str) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for m in consume_all([topic], timeout=30):
        if m.value() is not None:
            after = json.loads(m.value())["after"]
            if after is not None:
                out[after["id"]] = after
    return out


def wait_rows(
    consume_all: Any, topic: str, n: int, daemon: Connector, timeout: float = 60
) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = afters(consume_all, topic)
        if len(rows) >= n:
            return rows
        assert daemon.proc is not None and daemon.proc.poll() is None, daemon.output()[-4000:]
        assert time.monotonic() < deadline, f"{topic}: {len(rows)} rows, expected {n}:\n{daemon.output()[-4000:]}"
        time.sleep(0.3)


def test_initial_and_streaming_snapshots_copy_only_the_published_rows_and_columns(
    tmp_path, services, pg_dsn, least_role, slot_name, publication_name, topic_prefix, consume_all
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, status text, total numeric(8, 2), secret text)")
        conn.execute("INSERT INTO orders SELECT i, 's' || i, i, 'hidden' FROM generate_series(1, 20) i")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, kind text)")
        conn.execute("INSERT INTO items SELECT i, 'k' FROM generate_series(1, 30) i")
        conn.execute(f"CREATE PUBLICATION {publication_name} FOR TABLE orders (id, status, total) WHERE (id % 2 = 0)")
    role_dsn = least_role(["public.orders", "public.items"])
    sections: dict[str, Any] = {
        "source": {"dsn": role_dsn, "slot": slot_name, "publication": publication_name},
        "tables": ["public.orders"],
        "kafka": {"bootstrap_servers": services.kafka_bootstrap},
        "topic_prefix": topic_prefix,
    }
    config = write_config(tmp_path / "cdc.yaml", **sections)
    daemon = Connector(config, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        orders = wait_rows(consume_all, f"{topic_prefix}.public.orders", 10, daemon)
        assert sorted(orders) == list(range(2, 21, 2))  # the initial snapshot: even ids only, as the filter says
        assert all(set(row) == {"id", "status", "total"} for row in orders.values())  # no unpublished column
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (21, 'x', 1, 'h'), (22, 'y', 2, 'h')")
        orders = wait_rows(consume_all, f"{topic_prefix}.public.orders", 11, daemon)
        assert sorted(orders) == list(range(2, 23, 2)) and set(orders[22]) == {"id", "status", "total"}

        # A table added while streaming: its snapshot (DBLog, while streaming) follows its filter too.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER PUBLICATION {publication_name} ADD TABLE items WHERE (id > 25)")
        write_config(tmp_path / "cdc.yaml", **{**sections, "tables": ["public.orders", "public.items"]})
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        items = wait_rows(consume_all, f"{topic_prefix}.public.items", 5, daemon)
        time.sleep(1.0)
        assert sorted(afters(consume_all, f"{topic_prefix}.public.items")) == [26, 27, 28, 29, 30]
    finally:
        assert daemon.stop() == 0, daemon.output()[-4000:]
    assert items
