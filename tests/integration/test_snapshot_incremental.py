"""Snapshots while streaming (DBLog watermarks): on a signal, and for a table added to the configuration."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.signals import send_snapshot_signal
from cdc.snapshot.state import KafkaStore
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


def jobs(pipeline: SnapshotPipeline) -> list[Any]:
    """The jobs as the progress topic records them."""
    assert pipeline.snapshots is not None
    return pipeline.snapshots.state.jobs()


def live_jobs(pipeline: SnapshotPipeline) -> list[Any]:
    """The jobs as the reader runs them (ahead of what is recorded)."""
    assert pipeline.snapshots is not None
    return pipeline.snapshots.reader.jobs()


def settle(pipeline: SnapshotPipeline, running: Running, dsn: str, slot: str, workload: Workload) -> None:
    """Stop the workload, then wait until every change and every snapshot chunk is in Kafka and confirmed."""
    workload.stop()
    end = current_lsn(dsn)
    assert pipeline.snapshots is not None
    reader = pipeline.snapshots.reader
    wait_until(lambda: not reader.busy, 90, "the snapshot jobs to finish and be recorded", running.check)
    wait_until(lambda: slot_confirmed_past(dsn, slot, end), 60, "the stream to catch up", running.check)


def test_a_snapshot_requested_by_a_signal_while_streaming_replays_to_exactly_the_table(
    services: Any, pg_dsn: str, slot_name: str, publication_name: str, topic_prefix: str, consume_all: Any
) -> None:
    fill(pg_dsn, 20_000, keyless_rows=500)
    config = make_config(
        services,
        pg_dsn,
        slot_name,
        publication_name,
        topic_prefix,
        ["public.t", {"name": "public.events", "key": ["code"]}],
    )
    settings = SnapshotConfig(mode="no_data", incremental_chunk_rows=1_000, signal_poll_s=0.3, progress_bar=False)
    pipeline = SnapshotPipeline(config, settings)
    workload = Workload(pg_dsn, 20_000, seed=11)
    try:
        with Running(pipeline) as running:
            wait_until(lambda: pipeline.stats.streaming, 60, "streaming", running.check)
            workload.start()
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                unknown = send_snapshot_signal(conn, settings.signal_table, ["public.nope"])
                keyless = send_snapshot_signal(conn, settings.signal_table, ["public.events"])
                wanted = send_snapshot_signal(conn, settings.signal_table, ["public.t"])
            wait_until(lambda: any(j.table == "public.t" for j in live_jobs(pipeline)), 30, "the signal", running.check)
            wait_until(lambda: all(j.finished for j in live_jobs(pipeline)), 90, "the snapshot", running.check)
            ops_during = workload.ops
            settle(pipeline, running, pg_dsn, slot_name, workload)
    finally:
        workload.stop()
    assert ops_during > 50, "the workload should have run while the chunks were read"
    (job,) = jobs(pipeline)
    assert job.status == "done" and job.reason == "signal" and job.rows > 10_000
    assert pipeline.snapshots is not None and pipeline.snapshots.reader.chunks >= 15
    assert_topic_equals_table(consume_all, f"{topic_prefix}.public.t", pg_dsn, "SELECT id, v, n, flag, note FROM t")

    state = KafkaStore(services.kafka_bootstrap, f"{topic_prefix}.__cdc_snapshot", slot_name).load()
    assert state[f"signal/{wanted}"]["status"] == "accepted"
    assert state[f"signal/{unknown}"]["status"] == "rejected"
    assert "public.nope is not captured" in state[f"signal/{unknown}"]["reason"]
    assert state[f"signal/{keyless}"]["status"] == "rejected"
    assert "no primary key" in state[f"signal/{keyless}"]["reason"]
    # No watermark ever reached a topic.
    assert consume_all([f"{topic_prefix}.message"], timeout=10.0) == []


def test_a_table_added_to_the_configuration_is_snapshotted_while_streaming(
    services: Any, pg_dsn: str, slot_name: str, publication_name: str, topic_prefix: str, consume_all: Any
) -> None:
    fill(pg_dsn, 15_000)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO a SELECT i, 'a' FROM generate_series(1, 100) i")
    settings = SnapshotConfig(incremental_chunk_rows=2_000, progress_bar=False)
    first = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.a"])
    with Running(SnapshotPipeline(first, settings)) as running:
        wait_until(lambda: running.pipeline.stats.streaming, 60, "streaming", running.check)

    second = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.a", "public.t"])
    pipeline = SnapshotPipeline(second, settings)
    workload = Workload(pg_dsn, 15_000, seed=5).start()
    try:
        with Running(pipeline) as running:
            wait_until(lambda: pipeline.stats.streaming, 60, "streaming", running.check)
            assert pipeline.plan is not None and pipeline.plan.new_tables == ("public.t",)
            wait_until(lambda: all(j.finished for j in live_jobs(pipeline)), 90, "the snapshot", running.check)
            settle(pipeline, running, pg_dsn, slot_name, workload)
    finally:
        workload.stop()
    (job,) = jobs(pipeline)
    assert job.table == "public.t" and job.reason == "new_table" and job.status == "done"
    assert_topic_equals_table(consume_all, f"{topic_prefix}.public.t", pg_dsn, "SELECT id, v, n, flag, note FROM t")
    assert_topic_equals_table(consume_all, f"{topic_prefix}.public.a", pg_dsn, "SELECT id, v FROM a")
