"""An interrupted initial snapshot: SIGKILL halfway, a snapshot that can no longer be imported, a table dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cdc.snapshot.initial as initial_module
from cdc.catalog import StartupError
from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.errors import SnapshotError, SnapshotImportError
from cdc.snapshot.state import InitialStatus, KafkaStore
from tests.support.snapshots import (
    Running,
    SnapshotPipeline,
    Workload,
    assert_topic_equals_table,
    current_lsn,
    fill,
    freeze_when,
    make_config,
    slot_confirmed_past,
    wait_until,
    write_subprocess_config,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
QUERY = "SELECT id, v, n, flag, note FROM t"


def finish(pipeline: SnapshotPipeline, running: Running, dsn: str, slot: str, workload: Workload | None) -> None:
    if workload is not None:
        workload.stop()
    end = current_lsn(dsn)
    assert pipeline.snapshots is not None
    reader = pipeline.snapshots.reader
    wait_until(lambda: pipeline.stats.streaming, 60, "streaming", running.check)
    wait_until(lambda: not reader.busy, 120, "the snapshot jobs to finish and be recorded", running.check)
    wait_until(lambda: slot_confirmed_past(dsn, slot, end), 60, "the stream to catch up", running.check)


def snapshot_connections(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE "
            "'cdc-snapshot-%'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_an_initial_snapshot_killed_halfway_resumes_while_streaming_and_replays_to_exactly_the_table(
    tmp_path: Path,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
) -> None:
    fill(pg_dsn, 100_000)
    config = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.t"])
    settings = SnapshotConfig(workers=2, chunk_rows=2_000, incremental_chunk_rows=2_000, progress_bar=False)
    config_path = write_subprocess_config(tmp_path / "cdc.yaml", config)
    snapshot_path = tmp_path / "snapshot.json"
    snapshot_path.write_text(settings.model_dump_json())
    store = KafkaStore(services.kafka_bootstrap, f"{topic_prefix}.__cdc_snapshot", slot_name)
    workload = Workload(pg_dsn, 100_000, seed=3).start()
    log = open(tmp_path / "first.log", "wb")
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from tests.support.snapshots import main; sys.exit(main(sys.argv[1:]))",
            str(config_path),
            str(snapshot_path),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def progress() -> dict[str, Any]:
            if first.poll() is not None:
                raise AssertionError(f"the first daemon exited early:\n{(tmp_path / 'first.log').read_text()}")
            return store.load()

        # frozen at the reading that shows six chunks: the state asserted on is the one it was killed in
        state = freeze_when(
            first.pid,
            progress,
            lambda s: sum(k.startswith("chunk/") for k in s) >= 6,
            120,
            "some chunks of the first snapshot",
        )
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
    done_before = sum(1 for key in state if key.startswith("chunk/"))
    total = state["plan/public.t"]["chunk_count"]
    assert state["initial"]["status"] == InitialStatus.COPYING and done_before < total, (done_before, total)
    wait_until(lambda: snapshot_connections(pg_dsn) == 0, 15, "the killed daemon's workers to die with it")

    pipeline = SnapshotPipeline(config, settings)
    try:
        with Running(pipeline) as running:
            wait_until(lambda: pipeline.stats.streaming, 60, "streaming", running.check)
            assert pipeline.plan is not None and pipeline.plan.resume
            time.sleep(1.0)  # the workload goes on while the remaining chunks are read
            finish(pipeline, running, pg_dsn, slot_name, workload)
    finally:
        workload.stop()
    assert_topic_equals_table(consume_all, f"{topic_prefix}.public.t", pg_dsn, QUERY)
    state = store.load()
    assert state["initial"]["status"] == InitialStatus.RESUMED
    (job,) = [v for k, v in state.items() if k.startswith("job/")]
    assert job["reason"] == "resume_initial" and job["status"] == "done"
    assert len(job["ranges"]) <= total - done_before  # chunks already in Kafka were not read again


def test_an_exported_snapshot_that_can_no_longer_be_imported_is_a_clear_error_and_the_next_start_copies_while_streaming(
    monkeypatch: pytest.MonkeyPatch,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
) -> None:
    fill(pg_dsn, 5_000)
    config = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.t"])
    settings = SnapshotConfig(workers=1, incremental_chunk_rows=1_000, progress_bar=False)
    original = initial_module._Exporter.__init__

    def exporter_that_moves_on(self: Any, conninfo: str, slot: str | None, *rest: Any) -> None:
        original(self, conninfo, slot, *rest)
        assert self._stream is not None
        self._stream._command("IDENTIFY_SYSTEM")  # the exporter's next command ends the exported snapshot

    monkeypatch.setattr(initial_module._Exporter, "__init__", exporter_that_moves_on)
    with pytest.raises(SnapshotImportError, match="can no longer be imported") as failure:
        SnapshotPipeline(config, settings).run()
    assert "the next start streams from there" in str(failure.value)
    monkeypatch.setattr(initial_module._Exporter, "__init__", original)

    workload = Workload(pg_dsn, 5_000, seed=9).start()
    pipeline = SnapshotPipeline(config, settings)
    try:
        with Running(pipeline) as running:
            wait_until(lambda: pipeline.stats.streaming, 60, "streaming", running.check)
            assert pipeline.plan is not None and pipeline.plan.resume
            finish(pipeline, running, pg_dsn, slot_name, workload)
    finally:
        workload.stop()
    assert_topic_equals_table(consume_all, f"{topic_prefix}.public.t", pg_dsn, QUERY)


def test_a_table_dropped_during_the_initial_snapshot_is_reported_and_the_next_start_names_it(
    monkeypatch: pytest.MonkeyPatch,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
) -> None:
    fill(pg_dsn, 40_000)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO b SELECT i, 'b' FROM generate_series(1, 3000) i")
        conn.execute("ANALYZE b")
    config = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.t", "public.b"])
    settings = SnapshotConfig(workers=1, chunk_rows=1_000, progress_bar=False)
    store = KafkaStore(services.kafka_bootstrap, f"{topic_prefix}.__cdc_snapshot", slot_name)
    start_workers = initial_module.InitialSnapshot._start_workers
    dropped: list[str] = []

    def start_workers_then_drop_b(self: Any, *args: Any) -> Any:
        # Both tables are planned and the worker holds the snapshot, but no chunk is handed out yet: b goes
        # while the snapshot runs, every time (a thread watching the progress topic sometimes saw the
        # worker finish b's chunks first).
        workers = start_workers(self, *args)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert (store.load().get("initial") or {}).get("status") == InitialStatus.COPYING
            conn.execute("DROP TABLE b")
        dropped.append("public.b")
        return workers

    monkeypatch.setattr(initial_module.InitialSnapshot, "_start_workers", start_workers_then_drop_b)
    pipeline = SnapshotPipeline(config, settings)
    with pytest.raises(SnapshotError, match="public.b dropped while the initial snapshot ran"):
        pipeline.run()
    monkeypatch.setattr(initial_module.InitialSnapshot, "_start_workers", start_workers)
    assert dropped == ["public.b"]
    result = pipeline.snapshots.initial_result if pipeline.snapshots else None
    assert result is not None and result.dropped == ("public.b",) and result.complete
    initial = store.load()["initial"]
    assert initial["status"] == InitialStatus.DONE and initial["dropped"] == ["public.b"]

    with pytest.raises(StartupError, match="table public.b does not exist"):
        SnapshotPipeline(config, settings).run()
    fixed = make_config(services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.t"])
    workload = Workload(pg_dsn, 40_000, seed=4).start()
    pipeline = SnapshotPipeline(fixed, settings)
    try:
        with Running(pipeline) as running:
            wait_until(lambda: pipeline.stats.streaming, 60, "streaming without the dropped table", running.check)
            assert pipeline.plan is not None and not pipeline.plan.initial and not pipeline.plan.resume
            time.sleep(0.5)
            finish(pipeline, running, pg_dsn, slot_name, workload)
    finally:
        workload.stop()
    assert_topic_equals_table(consume_all, f"{topic_prefix}.public.t", pg_dsn, QUERY)
