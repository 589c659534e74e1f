"""Kafka stopped for a minute in the middle of a workload: nothing lost, memory flat, no restart.

The broker stopped is one of the test's own (started from the same jars as the session's), so the
tests running beside it on the other worker keep theirs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psycopg
import pytest
import structlog

from cdc.dev import kafka as dev_kafka
from tests.support.connector import Connector, write_config
from tests.support.db import scalar
from tests.support.services import reader_of

pytestmark = pytest.mark.integration

OUTAGE_S = 60


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# A minute of outage, a broker restart and the catch-up: more than the suite's 300 s on a slow machine is
# possible, and a named wait below says more than a pytest timeout.
@pytest.mark.timeout(600)
def test_a_broker_outage_of_a_minute_loses_nothing_and_memory_stays_flat(
    tmp_path, tmp_path_factory, services, services_mode, pg_dsn, slot_name, publication_name, topic_prefix
):
    if services_mode != "local":
        pytest.skip("stops and restarts a local broker process; testcontainers brokers are not restarted here")
    log = structlog.get_logger("test")
    broker_dir = tmp_path_factory.mktemp("own-kafka")
    bootstrap = dev_kafka.up(broker_dir, log)
    try:
        _outage(tmp_path, broker_dir, bootstrap, pg_dsn, slot_name, publication_name, topic_prefix)
    finally:
        dev_kafka.down(broker_dir, log)


def _outage(
    tmp_path: Path,
    broker_dir: Path,
    bootstrap: str,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
) -> None:
    consume_all = reader_of(bootstrap)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, body text NOT NULL)")
    cfg = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.events"],
        kafka={"bootstrap_servers": bootstrap},
        topic_prefix=topic_prefix,
        limits={"max_inflight_bytes": 4 * 1024 * 1024},
        status_interval_s=1.0,
    )
    daemon = Connector(cfg, tmp_path / "cdc.log").start()
    daemon.wait_streaming(pg_dsn, slot_name)
    assert daemon.proc is not None
    pid = daemon.proc.pid

    stop = threading.Event()
    written = [0]

    def workload() -> None:
        body = "x" * 2000
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while not stop.is_set():
                with conn.transaction():
                    for _ in range(50):
                        written[0] += 1
                        conn.execute("INSERT INTO events VALUES (%s, %s)", (written[0], body))
                time.sleep(0.01)

    writer = threading.Thread(target=workload, daemon=True)
    writer.start()
    log = structlog.get_logger("test")
    try:
        time.sleep(3)
        dev_kafka.down(broker_dir, log)
        outage_start = time.monotonic()
        time.sleep(5)  # let the in-flight budget fill up
        baseline = rss_kib(pid)
        samples = []
        while time.monotonic() - outage_start < OUTAGE_S:
            samples.append(rss_kib(pid))
            assert daemon.proc.poll() is None, f"the daemon exited during the outage:\n{daemon.output()}"
            time.sleep(1)
        rows_during_outage = written[0]
        dev_kafka.up(broker_dir, log)
        time.sleep(5)
    finally:
        stop.set()
        writer.join(30)
        if dev_kafka.running(broker_dir, log) is None:
            dev_kafka.up(broker_dir, log)

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        end = scalar(conn.execute("SELECT pg_current_wal_lsn()::text"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ok = scalar(
                conn.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (end, slot_name),
                )
            )
            if ok:
                break
            assert daemon.proc.poll() is None, f"the daemon exited catching up:\n{daemon.output()}"
            time.sleep(0.5)
        else:
            raise AssertionError(
                f"the slot did not confirm {end} within 120 s of the broker's return:\n{daemon.output()}"
            )
        count = scalar(conn.execute("SELECT count(*) FROM events"))
    assert daemon.stop() == 0, daemon.output()

    messages = consume_all([f"{topic_prefix}.public.events"], timeout=120.0)
    keys = {m.key() for m in messages}
    expected = {json.dumps({"id": i}, separators=(",", ":")).encode() for i in range(1, count + 1)}
    assert keys == expected
    assert rows_during_outage > 0
    growth_mib = (max(samples) - baseline) / 1024
    print(
        f"rss baseline={baseline / 1024:.1f}MiB max={max(samples) / 1024:.1f}MiB growth={growth_mib:.1f}MiB "
        f"rows={count}"
    )
    # The workload kept writing ~1 MB/s for a minute: holding it would add tens of MiB.
    assert growth_mib < 16, f"memory grew by {growth_mib:.1f} MiB during the outage"
    events = [e.get("event") for e in daemon.log_events()]
    assert "backpressure_on" in events
