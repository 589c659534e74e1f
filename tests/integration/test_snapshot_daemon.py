"""The snapshot through the real daemon as users run it (``cdc run`` in a subprocess)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.snapshot.state import KafkaStore
from tests.support.connector import Connector, write_config
from tests.support.snapshots import (
    Workload,
    assert_topic_equals_table,
    current_lsn,
    fill,
    freeze_when,
    slot_confirmed_past,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_the_daemon_killed_during_its_initial_snapshot_resumes_and_snapshots_again_on_request(
    tmp_path: Path,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
) -> None:
    fill(pg_dsn, 40_000)
    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.t"],
        kafka={"bootstrap_servers": services.kafka_bootstrap, "partitions": 3},
        topic_prefix=topic_prefix,
        status_interval_s=1.0,
        http={"enabled": False},
        # 80 chunks: the snapshot must still be copying when the daemon is frozen after its 4th (with
        # 20 of 2,000 rows, a fast machine finished all of them between the check and the kill)
        snapshot={"workers": 2, "chunk_rows": 500, "incremental_chunk_rows": 2_000, "signal_poll_s": 0.5},
    )
    store = KafkaStore(services.kafka_bootstrap, f"{topic_prefix}.__cdc_snapshot", slot_name)
    workload = Workload(pg_dsn, 40_000, seed=21).start()
    try:
        first = Connector(config, tmp_path / "first.log").start()
        assert first.proc is not None
        # frozen at the reading that shows four chunks: the state asserted on is the one it was killed in
        state = freeze_when(
            first.proc.pid,
            store.load,
            lambda s: sum(k.startswith("chunk/") for k in s) >= 4,
            120,
            "chunks of the first snapshot",
        )
        assert state["initial"]["status"] == "copying"
        first.stop(signal.SIGKILL)

        second = Connector(config, tmp_path / "second.log").start()
        second.wait_streaming(pg_dsn, slot_name)
        wait_until(
            lambda: store.load().get(f"job/resume-{_oid(pg_dsn)}", {}).get("status") == "done",
            120,
            "the interrupted chunks, read while streaming",
        )
        cli = subprocess.run(
            [sys.executable, "-m", "cdc.cli", "snapshot", "--config", str(config), "public.t"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        wait_until(
            lambda: any(
                v.get("reason") == "signal" and v.get("status") == "done"
                for k, v in store.load().items()
                if k.startswith("job/")
            ),
            120,
            "the requested snapshot",
        )
        workload.stop()
        end = current_lsn(pg_dsn)
        wait_until(lambda: slot_confirmed_past(pg_dsn, slot_name, end), 60, "the stream to catch up")
        assert second.stop() == 0, second.output()
    finally:
        workload.stop()
    assert_topic_equals_table(consume_all, f"{topic_prefix}.public.t", pg_dsn, "SELECT id, v, n, flag, note FROM t")


def _oid(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT 'public.t'::regclass::oid::int").fetchone()
    assert row is not None
    return int(row[0])
