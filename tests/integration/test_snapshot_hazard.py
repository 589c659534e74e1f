"""The Postgres hazard of DBLog (snapshots note §4), reproduced with a synchronous standby that never answers.

A transaction whose commit waits for a synchronous standby is already in the WAL
(logical decoding streams it) but still running for every snapshot. A chunk
read in that moment misses its change although the stream placed the change
before the low watermark; without a check the topic would end on the stale row.

The test runs its own Postgres (settings no other test should share):
``synchronous_standby_names = 'ghost'`` with ``synchronous_commit = local`` as the
default, so only the session that asks for ``remote_write`` waits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog
from psycopg import sql

from cdc.dev import postgres
from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.signals import send_snapshot_signal
from tests.support.connector import drop_slots
from tests.support.snapshots import (
    Running,
    SnapshotPipeline,
    assert_topic_equals_table,
    current_lsn,
    fill,
    make_config,
    slot_confirmed_past,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def syncrep_postgres(services_mode: str, dev_state_dir: Path) -> Iterator[str]:
    """Left running for quicker reruns, like the other test services (``CDC_TEST_STOP_SERVICES=1`` stops it)."""
    if services_mode != "local":
        pytest.skip("needs a Postgres of its own with a synchronous standby setting (local services only)")
    state = dev_state_dir.parent / "test-syncrep"
    settings = {**postgres.SETTINGS, "synchronous_standby_names": "'ghost'", "synchronous_commit": "local"}
    logger = structlog.get_logger("tests.syncrep")
    try:
        yield postgres.up(state, logger, settings)
    finally:
        if os.environ.get("CDC_TEST_STOP_SERVICES") == "1":
            postgres.down(state, logger)


@pytest.fixture
def syncrep_dsn(syncrep_postgres: str, test_id: str) -> Iterator[str]:
    dbname = f"db_{test_id}"
    with psycopg.connect(syncrep_postgres, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        yield psycopg.conninfo.make_conninfo(syncrep_postgres, dbname=dbname)
    finally:
        with psycopg.connect(syncrep_postgres, autocommit=True) as admin:
            drop_slots(admin, dbname)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def test_a_commit_waiting_for_a_synchronous_standby_makes_the_chunk_retry_until_it_is_visible(
    services: Any, syncrep_dsn: str, slot_name: str, publication_name: str, topic_prefix: str, consume_all: Any
) -> None:
    fill(syncrep_dsn, 200)
    config = make_config(services, syncrep_dsn, slot_name, publication_name, topic_prefix, ["public.t"])
    settings = SnapshotConfig(mode="no_data", signal_poll_s=0.2, progress_bar=False)
    pipeline = SnapshotPipeline(config, settings)
    topic = f"{topic_prefix}.public.t"
    waiting = psycopg.connect(syncrep_dsn, autocommit=True)
    waiting_pid = waiting.info.backend_pid
    committed = threading.Event()

    def commit_waiting_for_the_standby() -> None:
        waiting.execute("SET synchronous_commit = remote_write")
        waiting.execute("UPDATE t SET v = 'hazard' WHERE id = 5")  # returns once its wait is cancelled
        committed.set()

    try:
        with Running(pipeline) as running:
            wait_until(lambda: pipeline.stats.streaming, 60, "streaming", running.check)
            threading.Thread(target=commit_waiting_for_the_standby, daemon=True).start()
            wait_until(lambda: len(consume_all([topic], timeout=10.0)) >= 1, 30, "the waiting commit to be streamed")
            assert not committed.is_set()
            with psycopg.connect(syncrep_dsn, autocommit=True) as conn:
                assert conn.execute("SELECT v FROM t WHERE id = 5").fetchone() == ("v5",)  # still invisible
                send_snapshot_signal(conn, settings.signal_table, ["public.t"])
            assert pipeline.snapshots is not None
            coordinator = pipeline.snapshots.coordinator
            wait_until(lambda: coordinator.retries >= 2, 30, "the chunk to be retried", running.check)
            with psycopg.connect(syncrep_dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_cancel_backend(%s)", (waiting_pid,))
            wait_until(committed.is_set, 10, "the cancelled wait to return")
            reader = pipeline.snapshots.reader
            wait_until(lambda: any(j.finished for j in reader.jobs()), 30, "the snapshot", running.check)
            end = current_lsn(syncrep_dsn)
            wait_until(lambda: not reader.busy, 30, "the snapshot to be recorded", running.check)
            wait_until(lambda: slot_confirmed_past(syncrep_dsn, slot_name, end), 30, "the stream", running.check)
    finally:
        waiting.close()
    assert_topic_equals_table(consume_all, topic, syncrep_dsn, "SELECT id, v, n, flag, note FROM t")
