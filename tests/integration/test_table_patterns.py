"""Tables by pattern against a real database: expansion, partitioned tables, new tables on SIGHUP and by rescan."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration


def make_config(tmp_path: Path, services: Any, dsn: str, slot: str, publication: str, prefix: str, **over: Any) -> Path:
    sections: dict[str, Any] = {
        "source": {"dsn": dsn, "slot": slot, "publication": publication},
        "tables": [
            "public.customers",
            {"pattern": "public.order_*", "exclude_columns": ["note"]},
            {"regex": r"public\.events"},
        ],
        "kafka": {"bootstrap_servers": services.kafka_bootstrap},
        "topic_prefix": prefix,
        "status_interval_s": 1.0,
    }
    sections.update(over)
    return write_config(tmp_path / "cdc.yaml", **sections)


@pytest.fixture
def shop(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE order_a (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO order_a VALUES (1, 'secret')")
        conn.execute("CREATE VIEW order_view AS SELECT id FROM order_a")  # a view: never selected
        conn.execute("CREATE TABLE events (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)")
        conn.execute("CREATE TABLE events_2023 PARTITION OF events FOR VALUES FROM ('2023-01-01') TO ('2024-01-01')")
        conn.execute("CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
        conn.execute("INSERT INTO events VALUES (1, '2023-05-01'), (2, '2024-05-01')")
    return pg_dsn


def values_until(consume_all: Any, topic: str, want: int, timeout: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    values: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        values = [json.loads(m.value()) for m in consume_all([topic], timeout=10.0) if m.value() is not None]
        if len(values) >= want:
            return values
        time.sleep(0.3)
    raise AssertionError(f"{topic}: {len(values)} of {want} records after {timeout}s: {values}")


def wait_event(c: Connector, name: str, timeout: float = 30, **fields: Any) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in c.log_events():
            if e.get("event") == name and all(e.get(k) == v for k, v in fields.items()):
                return e
        time.sleep(0.2)
    raise AssertionError(f"no {name} event with {fields}:\n{c.output()}")


def test_patterns_expand_and_a_new_matching_table_is_snapshotted_and_streamed_after_sighup(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = make_config(tmp_path, services, shop, slot_name, publication_name, topic_prefix)
    shown = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "pattern 'public.order_*' -> public.order_a\n" in shown.stdout  # not the view
    assert "regex 'public\\\\.events' -> public.events\n" in shown.stdout  # the partitioned table, once

    c = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        c.wait_streaming(shop, slot_name)
        wait_event(c, "table_pattern_expanded", selector="pattern 'public.order_*'", tables=["public.order_a"])
        with psycopg.connect(shop, autocommit=True) as conn:
            published = conn.execute(
                "SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1", (publication_name,)
            ).fetchall()
            assert [r[0] for r in published] == ["customers", "events", "order_a"]  # listed, never FOR ALL TABLES
            # A partition's change arrives as its partitioned table's (publish_via_partition_root).
            conn.execute("INSERT INTO events VALUES (3, '2024-06-01')")
        events = values_until(consume_all, f"{topic_prefix}.public.events", 3)
        assert sorted((v["op"], v["after"]["id"]) for v in events) == [("c", 3), ("r", 1), ("r", 2)]
        order_a = values_until(consume_all, f"{topic_prefix}.public.order_a", 1)
        assert [v["after"] for v in order_a] == [{"id": 1}]  # the pattern's exclude_columns applies

        with psycopg.connect(shop, autocommit=True) as conn:
            conn.execute("CREATE TABLE order_b (id int PRIMARY KEY, note text, total int)")
            conn.execute("INSERT INTO order_b VALUES (1, 'x', 10), (2, 'y', 20)")
        assert c.proc is not None
        c.proc.send_signal(signal.SIGHUP)  # the file is unchanged: the pattern is expanded again
        added = wait_event(c, "reload_tables", reason="reload")
        assert added["added"] == ["public.order_b"] and added["snapshot"] == ["public.order_b"], c.output()
        topic_b = f"{topic_prefix}.public.order_b"
        snapshot = values_until(consume_all, topic_b, 2)
        assert sorted((v["op"], v["after"]["id"], v["after"]["total"]) for v in snapshot) == [
            ("r", 1, 10),
            ("r", 2, 20),
        ]
        with psycopg.connect(shop, autocommit=True) as conn:
            conn.execute("INSERT INTO order_b VALUES (3, 'z', 30)")
            conn.execute("UPDATE order_b SET total = 11 WHERE id = 1")
        later = values_until(consume_all, topic_b, 4)
        assert [(v["op"], v["after"]) for v in later if v["op"] != "r"] == [
            ("c", {"id": 3, "total": 30}),
            ("u", {"id": 1, "total": 11}),
        ]
    finally:
        assert c.stop() == 0


def test_a_new_matching_table_is_picked_up_by_the_periodic_rescan(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = make_config(
        tmp_path,
        services,
        shop,
        slot_name,
        publication_name,
        topic_prefix,
        tables=[{"pattern": "public.order_*"}, {"pattern": "public.later_*", "allow_empty": True}],
        table_rescan_interval_s=0.5,
    )
    c = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        c.wait_streaming(shop, slot_name)
        wait_event(c, "table_pattern_empty", selector="pattern 'public.later_*'")
        with psycopg.connect(shop, autocommit=True) as conn:
            conn.execute("CREATE TABLE later_x (id int PRIMARY KEY)")
            conn.execute("INSERT INTO later_x VALUES (7)")
        added = wait_event(c, "reload_tables", reason="rescan")
        assert added["added"] == ["public.later_x"], c.output()
        # The table is snapshotted while streaming (DBLog windows). A row inserted before the window's low
        # watermark is read by the chunk too, so an insert before the job ends may also come as a read after
        # its create; inserting after the job ends makes the expected records exact.
        wait_event(c, "snapshot_job_done", table="public.later_x")
        with psycopg.connect(shop, autocommit=True) as conn:
            conn.execute("INSERT INTO later_x VALUES (8)")
        values = values_until(consume_all, f"{topic_prefix}.public.later_x", 2)
        assert sorted((v["op"], v["after"]["id"]) for v in values) == [("c", 8), ("r", 7)]
    finally:
        assert c.stop() == 0


def test_a_pattern_matching_nothing_stops_the_start_naming_it_and_creates_nothing(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix, kafka_admin
):
    cfg = make_config(
        tmp_path,
        services,
        shop,
        slot_name,
        publication_name,
        topic_prefix,
        tables=["public.customers", {"pattern": "public.invoice_*"}],
    )
    c = Connector(cfg, tmp_path / "cdc.log").start()
    assert c.wait_exit(60) == 1
    fatal = [e for e in c.log_events() if e.get("event") == "fatal"]
    assert fatal and "pattern 'public.invoice_*' matches no table" in fatal[0]["error"], c.output()
    assert "allow_empty: true" in fatal[0]["error"]
    with psycopg.connect(shop, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)).fetchone() is None
        assert conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication_name,)).fetchone() is None
    assert not [t for t in kafka_admin.list_topics(timeout=10).topics if t.startswith(topic_prefix + ".")]
    shown = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 1 and "pattern 'public.invoice_*' matches no table" in shown.stderr
