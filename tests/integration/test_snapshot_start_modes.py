"""Snapshot modes that act differently from ``initial``: ``initial_only`` and ``always``."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from cdc.snapshot.config import SnapshotConfig
from tests.support.snapshots import (
    Running,
    SnapshotPipeline,
    assert_topic_equals_table,
    fill,
    make_config,
    wait_until,
)

pytestmark = pytest.mark.integration

QUERY = "SELECT id, v, n, flag, note FROM t"


def test_initial_only_copies_every_table_without_a_slot_and_stops(
    services: Any, pg_dsn: str, slot_name: str, publication_name: str, topic_prefix: str, consume_all: Any
) -> None:
    fill(pg_dsn, 5_000)
    config = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.t"])
    pipeline = SnapshotPipeline(config, SnapshotConfig(mode="initial_only", chunk_rows=1_000, progress_bar=False))
    pipeline.run()  # returns once the copy is in Kafka
    assert pipeline.plan is not None and not pipeline.plan.stream
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)
        ).fetchone() == (0,)
    assert_topic_equals_table(consume_all, f"{topic_prefix}.public.t", pg_dsn, QUERY)


def test_always_takes_a_new_snapshot_whose_truncate_markers_retire_rows_deleted_while_the_daemon_was_down(
    services: Any, pg_dsn: str, slot_name: str, publication_name: str, topic_prefix: str, consume_all: Any
) -> None:
    fill(pg_dsn, 3_000)
    config = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.t"])
    settings = SnapshotConfig(mode="always", chunk_rows=1_000, progress_bar=False)
    with Running(SnapshotPipeline(config, settings)) as running:
        wait_until(lambda: running.pipeline.stats.streaming, 60, "the first snapshot", running.check)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # While the daemon is down, and then its slot is dropped by the next start: these deletes reach Kafka
        # only through the new snapshot's truncate markers.
        conn.execute("DELETE FROM t WHERE id <= 100")
        conn.execute("UPDATE t SET v = 'changed' WHERE id BETWEEN 101 AND 200")
    with Running(SnapshotPipeline(config, settings)) as running:
        wait_until(lambda: running.pipeline.stats.streaming, 60, "the second snapshot", running.check)
        assert running.pipeline.plan is not None and running.pipeline.plan.drop_slot
    topic = f"{topic_prefix}.public.t"
    markers = [m for m in consume_all([topic], timeout=30.0) if dict(m.headers() or []).get("cdc.truncate") == b"1"]
    assert len(markers) == 3 and all(json.loads(m.value())["op"] == "t" for m in markers)  # one per partition
    assert_topic_equals_table(consume_all, topic, pg_dsn, QUERY)
