"""A table added to the publication while a transaction writes it keeps every later change.

Before PostgreSQL 16.9 (and 13.21, 14.18, 15.13, 17.5), decoding a transaction that wrote a table before
the publication gained it, and committed after, cached the table as unpublished: every later change of
the table was left out of the stream, with no error, while the slot moved past it. The daemon locks the
tables it adds (cdc.catalog.apply_publication), so no writer runs across the change. On a fixed server
this test passes either way; `make test-versions` runs it on 16.2, where it fails without the lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from cdc.catalog import publication_members
from cdc.snapshot.config import SnapshotConfig
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


def test_a_table_added_while_a_transaction_writes_it_keeps_all_its_later_changes(
    services: Any, pg_dsn: str, slot_name: str, publication_name: str, topic_prefix: str, consume_all: Any
) -> None:
    fill(pg_dsn, 1_000)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO a SELECT i, 'a' FROM generate_series(1, 10) i")
    settings = SnapshotConfig(incremental_chunk_rows=500, progress_bar=False)
    first = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.a"])
    with Running(SnapshotPipeline(first, settings)) as running:
        wait_until(lambda: running.pipeline.stats.streaming, 60, "streaming", running.check)

    # A writer has written t and stays open while the daemon adds t to the publication. It writes t again
    # and commits once the publication has t, or after 4 s if the daemon's lock keeps the change waiting.
    writer = psycopg.connect(pg_dsn)
    writer.execute("UPDATE t SET n = n + 1 WHERE id = 1")
    committed = threading.Event()

    def finish() -> None:
        deadline = time.monotonic() + 4.0
        with psycopg.connect(pg_dsn, autocommit=True) as probe:
            while time.monotonic() < deadline and "public.t" not in publication_members(probe, publication_name):
                time.sleep(0.05)
        writer.execute("UPDATE t SET n = n + 1 WHERE id = 2")
        writer.commit()
        committed.set()

    finisher = threading.Thread(target=finish, daemon=True)
    second = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.a", "public.t"])
    pipeline = SnapshotPipeline(second, settings)
    try:
        with Running(pipeline) as running:
            finisher.start()
            wait_until(lambda: pipeline.stats.streaming, 60, "streaming", running.check)
            assert committed.wait(10), "the writer did not commit"
            snapshots = pipeline.snapshots
            assert snapshots is not None
            wait_until(lambda: not snapshots.reader.busy, 60, "the snapshot of t", running.check)
            # The changes the bug left out: everything after the writer's transaction.
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO t SELECT i, 'new', i, true, NULL FROM generate_series(1001, 1100) i")
                conn.execute("UPDATE t SET v = 'after' WHERE id <= 50")
                conn.execute("DELETE FROM t WHERE id BETWEEN 900 AND 920")
            end = current_lsn(pg_dsn)
            wait_until(lambda: slot_confirmed_past(pg_dsn, slot_name, end), 60, "the stream to catch up", running.check)
    finally:
        writer.close()
    assert pipeline.snapshots is not None
    (job,) = pipeline.snapshots.state.jobs()
    assert job.table == "public.t" and job.status == "done"
    rows = assert_topic_equals_table(
        consume_all, f"{topic_prefix}.public.t", pg_dsn, "SELECT id, v, n, flag, note FROM t"
    )
    assert rows == 1_079
