"""The initial snapshot end to end: slot with an exported snapshot, parallel chunked copy into Kafka, then streaming."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.state import InitialStatus, KafkaStore
from tests.support.snapshots import (
    Running,
    SnapshotPipeline,
    Workload,
    assert_topic_equals_table,
    current_lsn,
    fill,
    make_config,
    slot_confirmed_past,
    wait_until,
)

pytestmark = pytest.mark.integration

TABLES = ["public.t", {"name": "public.events", "key": ["code"]}]


def test_an_initial_snapshot_under_a_concurrent_workload_replays_to_exactly_the_tables(
    services: Any, pg_dsn: str, slot_name: str, publication_name: str, topic_prefix: str, consume_all: Any
) -> None:
    fill(pg_dsn, 30_000, keyless_rows=3_000)
    config = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, TABLES)
    pipeline = SnapshotPipeline(config, SnapshotConfig(workers=2, chunk_rows=2_500, progress_bar=False))
    workload = Workload(pg_dsn, 30_000, keyless=True).start()
    try:
        with Running(pipeline) as running:
            wait_until(lambda: pipeline.stats.streaming, 120, "the initial snapshot and streaming", running.check)
            ops_during_snapshot = workload.ops
            wait_until(lambda: workload.ops > ops_during_snapshot + 300, 60, "more of the workload while streaming")
            workload.stop()
            end = current_lsn(pg_dsn)
            wait_until(lambda: slot_confirmed_past(pg_dsn, slot_name, end), 60, "the stream to catch up", running.check)
    finally:
        workload.stop()
    assert ops_during_snapshot > 50, "the workload should have run while the snapshot was read"

    result = pipeline.snapshots.initial_result if pipeline.snapshots else None
    assert result is not None and result.complete
    reads = [
        m.key()
        for m in consume_all([f"{topic_prefix}.public.t"], timeout=60.0)
        if m.value() is not None and json.loads(m.value())["op"] == "r"
    ]
    assert len(reads) == len(set(reads)) >= 29_000  # every row of the snapshot once, none twice
    rows = assert_topic_equals_table(
        consume_all, f"{topic_prefix}.public.t", pg_dsn, "SELECT id, v, n, flag, note FROM t"
    )
    assert rows > 25_000
    assert_topic_equals_table(
        consume_all, f"{topic_prefix}.public.events", pg_dsn, "SELECT code, n FROM events", key=("code",)
    )
    state = KafkaStore(services.kafka_bootstrap, f"{topic_prefix}.__cdc_snapshot", slot_name).load()
    assert state["initial"]["status"] == InitialStatus.DONE
    assert state["plan/public.t"]["chunking"] == "key" and state["plan/public.t"]["chunk_count"] > 5
    assert state["plan/public.events"]["chunking"] == "ctid"  # no primary key: heap page ranges


def test_a_snapshot_read_carries_the_same_values_as_a_streamed_change_of_the_same_row(
    services: Any, pg_dsn: str, slot_name: str, publication_name: str, topic_prefix: str, consume_all: Any
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        conn.execute(
            """
            CREATE TABLE typed (
                id int PRIMARY KEY, touch int NOT NULL DEFAULT 0,
                amount numeric(12,3), ratio float8, big bigint, day date, at timestamp, at_tz timestamptz,
                span interval, clock time, clock_tz timetz, flag bool, blob bytea, doc jsonb, ident uuid,
                tags text[], grid int[], feeling mood, addr inet, bits varbit, label varchar(20), note text
            )
            """
        )
        conn.execute(
            """
            INSERT INTO typed VALUES
             (1, 0, 12345.678, 'NaN', 9223372036854775807, '2024-02-29', '2024-05-01 12:34:56.789',
              '2024-05-01 12:34:56.789+02', '1 year 2 mons 3 days 04:05:06.7', '23:59:59.999999', '12:00+05:30',
              true, E'\\\\x00ff5c0a', '{"a": [1, "x\\ty"]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
              ARRAY['a b', 'c"d', NULL, E'back\\\\slash'], '{{1,2},{3,4}}', 'happy', '10.0.0.1/24', B'1011',
              'tab	inside', E'line\\nbreak \\\\ and \\r return'),
             (2, 0, NULL, '-Infinity', -1, 'infinity', '-infinity', 'infinity', '-00:00:01', '00:00', '00:00:00-01',
              false, '', 'null', NULL, '{}', '{}', NULL, NULL, B'', '', '')
            """
        )
    config = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.typed"])
    pipeline = SnapshotPipeline(config, SnapshotConfig(workers=1, progress_bar=False))
    topic = f"{topic_prefix}.public.typed"
    with Running(pipeline) as running:
        wait_until(lambda: pipeline.stats.streaming, 120, "streaming", running.check)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("UPDATE typed SET touch = 1")
        wait_until(lambda: len(consume_all([topic], timeout=10.0)) >= 4, 60, "the streamed updates", running.check)
    by_key: dict[bytes, dict[str, list[Any]]] = {}
    for m in consume_all([topic], timeout=10.0):
        value = json.loads(m.value())
        by_key.setdefault(m.key(), {}).setdefault(value["op"], []).append(value)
    assert len(by_key) == 2
    for ops in by_key.values():
        (read,), (update,) = ops["r"], ops["u"]
        assert read["source"]["snapshot"] == "true" and update["source"]["snapshot"] == "false"
        assert read["after"] == {**update["after"], "touch": 0}
        assert read["source"]["lsn"] <= update["source"]["lsn"]
