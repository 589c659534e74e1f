"""Exactly once for snapshots: the daemon SIGKILLed at random moments of an initial snapshot and of the
DBLog jobs that resume it, and of a snapshot requested by signal while streaming. A read_committed
consumer then finds every row of the snapshot exactly once (one ``op: r`` record per key), and a replay
of the topic equals the table.

Before, a snapshot chunk and its progress record were written apart (the rows in the pipeline's Kafka
transaction, the progress only once Postgres confirmed it): every restart read the resumed jobs again
from their first chunk, and exactly once delivered 2,569 snapshot records for ~250 rows.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.snapshot.state import KafkaStore
from tests.support.connector import Connector, write_config
from tests.support.db import scalar
from tests.support.snapshots import freeze_when

pytestmark = pytest.mark.integration

KILLS = 20
# DBLog rows a window: small, so that the snapshot jobs run for seconds and the kills land inside them
# (a job of 20,000 rows in 200-row windows was over in two seconds, before most kills; by 2026-12 the daemon
# copied 20-row windows at about 10,000 rows/s, and 2 of 19 runs, at best, were killed inside the job: with
# 5-row windows, 15 and 16 of 19)
CHUNK = int(os.environ.get("CDC_TEST_EOS_SNAPSHOT_CHUNK", "5"))
ROWS = int(os.environ.get("CDC_TEST_EOS_SNAPSHOT_ROWS", "20000"))  # make exactly-once-full: 200,000


def _config(tmp_path: Path, services: Any, dsn: str, slot: str, publication: str, prefix: str, **snapshot: Any) -> Path:
    return write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot, "publication": publication},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap, "partitions": 3},
        topic_prefix=prefix,
        delivery={"mode": "exactly_once", "offsets_topic": f"{prefix}.__offsets", "commit_interval_ms": 100},
        snapshot={"progress_log_s": 1.0, **snapshot},
        status_interval_s=1.0,
    )


def _fill(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, version int NOT NULL, pad text)")
        conn.execute("INSERT INTO items SELECT i, 1, repeat('p', i %% 50) FROM generate_series(1, %s) i", (rows,))
        conn.execute("ANALYZE items")


def _snapshot_finished(state: dict[str, Any]) -> bool:
    """Whether the stored snapshot state has nothing left to copy: the initial snapshot done (or resumed as
    jobs) and every job done."""
    initial = state.get("initial", {}).get("status")
    jobs = [v for k, v in state.items() if k.startswith("job/")]
    return initial in ("done", "resumed", None) and all(j["status"] == "done" for j in jobs)


def _kill_at_random_moments(
    cfg: Path, tmp_path: Path, rng: random.Random, kills: int, dsn: str, slot: str, store: KafkaStore
) -> None:
    """A quarter of the kills anywhere in the first 3 s (start-up included), the rest within half a second of
    the run's snapshot job starting (of streaming, once no job is left)."""
    for i in range(kills):
        left = not _snapshot_finished(store.load())  # read before the run starts: it cannot finish it yet
        c = Connector(cfg, tmp_path / f"run{i}.log").start()
        if rng.random() < 0.25:
            time.sleep(rng.uniform(0.3, 3.0))
        else:
            c.wait_streaming(dsn, slot)
            # A run with no job left logs neither event. With one left, wait for it however long a loaded
            # machine takes to start it: with a fixed 2 s, runs were killed before their job started and the
            # check that kills landed inside a job failed (1 of 19) beside a Spark benchmark.
            deadline = time.monotonic() + (30 if left else 2)
            while time.monotonic() < deadline and not any(
                e.get("event") in ("snapshot_job_running", "snapshot_job_done") for e in c.log_events()
            ):
                time.sleep(0.05)
            # Within 0.5 s, not 1 s: each run then leaves more of the job to the next (see CHUNK).
            time.sleep(rng.uniform(0.05, 0.5))
        assert c.proc is not None
        if c.proc.poll() is not None:
            raise AssertionError(f"run {i} exited with {c.proc.returncode} before its kill:\n{c.output()[-4000:]}")
        c.stop(signal.SIGKILL)


def _finish(cfg: Path, tmp_path: Path, dsn: str, slot: str, store: KafkaStore) -> Connector:
    """A last run to the end: every snapshot job recorded done, the stream caught up, stopped cleanly."""
    final = Connector(cfg, tmp_path / "final.log").start()
    final.wait_streaming(dsn, slot)
    deadline = time.monotonic() + 180
    while True:
        state = store.load()
        if _snapshot_finished(state):
            break
        assert final.proc is not None and final.proc.poll() is None, final.output()[-4000:]
        assert time.monotonic() < deadline, (
            f"the snapshot did not finish: {str(state)[-3000:]}\n{final.output()[-4000:]}"
        )
        time.sleep(0.5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        end = scalar(conn.execute("SELECT pg_current_wal_lsn()::text"))
        deadline = time.monotonic() + 90
        while not scalar(
            conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s", (end, slot)
            )
        ):
            assert time.monotonic() < deadline, f"the slot did not confirm {end}"
            time.sleep(0.2)
    assert final.stop() == 0, final.output()[-4000:]
    return final


def _killed_inside_a_job(cfg: Path, tmp_path: Path) -> int:
    """How many of the killed runs had a snapshot job running and not done."""
    runs = [{e.get("event") for e in Connector(cfg, tmp_path / f"run{i}.log").log_events()} for i in range(KILLS - 1)]
    inside = sum("snapshot_job_running" in run and "snapshot_job_done" not in run for run in runs)
    print(f"runs killed inside a snapshot job: {inside} of {len(runs)}")
    return inside


def _check_once(consume_all: Any, topic: str, dsn: str, expected_rows: int, what: str) -> float:
    """Every row read by the snapshot once under read_committed, and the replay equal to the table;
    returns the snapshot records a row."""
    messages = consume_all([topic], timeout=120.0, isolation="read_committed")
    reads: Counter[bytes] = Counter()
    state: dict[bytes, Any] = {}
    for m in messages:
        key, value = m.key(), m.value()
        if value is None:
            state.pop(key, None)
            continue
        envelope = json.loads(value)
        if envelope["op"] == "r":
            reads[key] += 1
        state[key] = envelope["after"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, version, pad FROM items").fetchall()}
    per_row = sum(reads.values()) / expected_rows
    print(f"{what}: {sum(reads.values())} snapshot records for {expected_rows} rows ({per_row:.4f} a row)")
    twice = {k: n for k, n in reads.items() if n > 1}
    assert not twice, f"{len(twice)} rows read more than once, e.g. {next(iter(twice.items()))}"
    assert len(reads) == expected_rows, f"{expected_rows - len(reads)} rows of the snapshot missing"
    replayed = {json.loads(k)["id"]: (v["version"], v["pad"]) for k, v in state.items()}
    assert replayed == rows, "the replayed topic differs from the table"
    return per_row


def test_an_initial_snapshot_and_its_resumed_jobs_killed_20_times_deliver_each_row_once(
    tmp_path: Path,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
) -> None:
    _fill(pg_dsn, ROWS)
    cfg = _config(
        tmp_path,
        services,
        pg_dsn,
        slot_name,
        publication_name,
        topic_prefix,
        workers=2,
        chunk_rows=1_000,
        incremental_chunk_rows=CHUNK,
    )
    store = KafkaStore(services.kafka_bootstrap, f"{topic_prefix}.__cdc_snapshot", slot_name)
    rng = random.Random(19)

    # The first kill inside the initial copy, with some chunks committed and some not.
    first = Connector(cfg, tmp_path / "first.log").start()
    assert first.proc is not None
    proc = first.proc

    def progress() -> dict[str, Any]:
        if proc.poll() is not None:
            raise AssertionError(f"the first daemon exited early:\n{first.output()[-4000:]}")
        return store.load()

    seen = freeze_when(
        proc.pid,
        progress,
        lambda s: sum(k.startswith("chunk/") for k in s) >= 3,
        120,
        "some chunks of the initial snapshot",
    )
    first.stop(signal.SIGKILL)
    assert seen["initial"]["status"] == "copying", seen["initial"]
    assert sum(k.startswith("chunk/") for k in seen) < seen["plan/public.items"]["chunk_count"]

    # Then kills at random moments of the resumed snapshot (DBLog jobs over the chunks not copied).
    _kill_at_random_moments(cfg, tmp_path, rng, KILLS - 1, pg_dsn, slot_name, store)
    _finish(cfg, tmp_path, pg_dsn, slot_name, store)

    assert _check_once(consume_all, f"{topic_prefix}.public.items", pg_dsn, ROWS, "initial + resumed") == 1.0
    assert _killed_inside_a_job(cfg, tmp_path) >= 2, "fewer than two runs were killed inside the resumed snapshot"


def test_a_snapshot_requested_by_signal_killed_20_times_delivers_each_row_once(
    tmp_path: Path,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
) -> None:
    _fill(pg_dsn, ROWS)
    cfg = _config(
        tmp_path,
        services,
        pg_dsn,
        slot_name,
        publication_name,
        topic_prefix,
        mode="no_data",
        signal_table="public.cdc_signal",
        signal_poll_s=0.3,
        incremental_chunk_rows=CHUNK,
    )
    store = KafkaStore(services.kafka_bootstrap, f"{topic_prefix}.__cdc_snapshot", slot_name)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.cdc_signal (id text PRIMARY KEY, type text NOT NULL, data text)")
    first = Connector(cfg, tmp_path / "first.log").start()
    first.wait_streaming(pg_dsn, slot_name)
    asked = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "snapshot", "--config", str(cfg), "public.items"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert asked.returncode == 0, asked.stdout + asked.stderr
    deadline = time.monotonic() + 60
    while not any(k.startswith("job/") for k in store.load()):
        assert time.monotonic() < deadline, first.output()[-4000:]
        time.sleep(0.2)
    time.sleep(random.Random(5).uniform(0.2, 1.5))  # the job has started, or is about to
    first.stop(signal.SIGKILL)

    _kill_at_random_moments(cfg, tmp_path, random.Random(23), KILLS - 1, pg_dsn, slot_name, store)
    _finish(cfg, tmp_path, pg_dsn, slot_name, store)
    assert _check_once(consume_all, f"{topic_prefix}.public.items", pg_dsn, ROWS, "requested by signal") == 1.0
    assert _killed_inside_a_job(cfg, tmp_path) >= 2, "fewer than two runs were killed inside the snapshot job"


def _workers_of(pid: int) -> list[int]:
    """The snapshot worker processes of the daemon ``pid`` (multiprocessing's spawned children)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = []
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmdline:
            found.append(int(child))
    return found


def test_snapshot_workers_killed_mid_copy_leave_no_duplicate_and_no_open_transaction(
    tmp_path: Path,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
) -> None:
    """Two of three workers SIGKILLed while the daemon copies: their chunks go to the last worker once
    their transactional ids are fenced (an open transaction would hold read_committed consumers up to
    transaction.timeout.ms, 15 minutes), and each row is in the topic once."""
    _fill(pg_dsn, ROWS // 2)
    cfg = _config(
        tmp_path,
        services,
        pg_dsn,
        slot_name,
        publication_name,
        topic_prefix,
        workers=3,
        chunk_rows=500,
        server_json=False,
    )
    store = KafkaStore(services.kafka_bootstrap, f"{topic_prefix}.__cdc_snapshot", slot_name)
    daemon = Connector(cfg, tmp_path / "daemon.log").start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    try:
        for at_least in (4, 12):

            def copied(s: dict[str, dict[str, Any]], n: int = at_least) -> bool:
                return sum(k.startswith("chunk/") for k in s) >= n

            freeze_when(pid, store.load, copied, 120, f"{at_least} chunks copied")
            workers = _workers_of(pid)
            assert len(workers) >= 2, workers
            os.kill(workers[0], signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
        daemon.wait_streaming(pg_dsn, slot_name)
    finally:
        code = daemon.stop()
    assert code == 0, daemon.output()[-4000:]
    died = [e for e in daemon.log_events() if e.get("event") == "snapshot_worker_died"]
    assert len(died) == 2, died
    assert store.load()["initial"]["status"] == "done"
    assert _check_once(consume_all, f"{topic_prefix}.public.items", pg_dsn, ROWS // 2, "workers killed") == 1.0
