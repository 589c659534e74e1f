"""End-to-end throughput and latency: commit in Postgres -> acknowledged by Kafka.

One command: ``.venv/bin/python bench/e2e.py`` (``--rows 200000`` for a quick run).

1. Throughput. One workload of N row changes (6-column rows, 1,000-row
   transactions) is written once, after creating several slots at the same
   point, so every run reads exactly the same WAL. Per run:
   - decoder only: receive + decode into ChangeEvents, no Kafka (the reference);
   - end to end: the real daemon (``cdc run``, JSON) from start of streaming until
     the slot's confirmed LSN passes the workload's end, i.e. until Kafka
     acknowledged everything (confirmation follows acknowledgment).
   Medians of the runs and the ratio end-to-end / decoder-only are printed.
2. Latency at a steady 1,000 transactions/s: commit time (source.ts_ms) to the
   moment a consumer sees the record. That includes the consumer's own fetch
   latency, so it is an upper bound of commit-to-acknowledgment.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import yaml
from confluent_kafka import Consumer, TopicPartition

from cdc import dev
from cdc.catalog import describe_tables
from cdc.config import TableConfig
from cdc.decoder import pgoutput
from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.stream import XLOGDATA_HEADER_SIZE, ReplicationStream
from cdc.event import ChangeEvent, TxCommit
from cdc.lsn import Lsn

DB = "cdc_bench"
TABLE = "public.bench_rows"
_WAL_START = struct.Struct(">Q")


def setup_database(admin_dsn: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (DB,)
        ).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=DB)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_rows (id bigint PRIMARY KEY, name text, amount numeric(12,2), "
            "code varchar(16), created timestamptz, ref uuid)"
        )
        conn.execute("CREATE PUBLICATION bench_pub FOR TABLE bench_rows")
    return dsn


def create_slots(dsn: str, names: list[str]) -> None:
    for name in names:
        s = ReplicationStream(dsn)
        s.connect()
        try:
            s.create_slot(name)
        finally:
            s.close()


def write_rows(dsn: str, rows: int, start_id: int = 0) -> str:
    """Insert rows in 1,000-row transactions; return the WAL position after the last commit."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for base in range(start_id, start_id + rows, 1000):
            n = min(1000, start_id + rows - base)
            conn.execute(
                "INSERT INTO bench_rows SELECT g, 'name ' || g, g * 1.25, 'C' || (g %% 1000), now(), gen_random_uuid() "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (base, base + n - 1),
            )
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])


def decoder_only(dsn: str, slot: str, target: Lsn) -> tuple[float, int]:
    """Receive and decode into ChangeEvents until the commit at or past target; rows/s."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = describe_tables(conn, [TableConfig(name=TABLE)])
    decoder = ChangeDecoder(tables, {})
    stream = ReplicationStream(dsn)
    stream.connect()
    stream.start(slot, "bench_pub", Lsn(0), messages=False)
    rows = 0
    started = time.perf_counter()
    decode, handle = pgoutput.decode, decoder.handle
    try:
        while True:
            frame = stream.read(5.0)
            if frame is None:
                raise SystemExit("decoder-only run: the stream went quiet before the workload's end")
            event = handle(decode(frame[XLOGDATA_HEADER_SIZE:]), Lsn(_WAL_START.unpack_from(frame, 1)[0]))
            if event is None:
                continue
            if isinstance(event, TxCommit):
                stream.confirm(event.end_lsn)
                if event.end_lsn >= target:
                    break
            elif isinstance(event, ChangeEvent):
                rows += 1
    finally:
        elapsed = time.perf_counter() - started
        stream.close()
    return rows / elapsed, rows


def wait_confirmed(conn: psycopg.Connection[tuple[object, ...]], slot: str, target: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT confirmed_flush_lsn >= %s::pg_lsn, active FROM pg_replication_slots WHERE slot_name = %s",
            (target, slot),
        ).fetchone()
        if row and row[0]:
            return time.perf_counter()
        time.sleep(0.02)
    raise SystemExit(f"slot {slot} did not confirm {target} within {timeout}s")


def daemon(config: dict[str, object], workdir: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc.cli", "--log-format", "json", "run", "--config", str(path)],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, log


def end_to_end(dsn: str, bootstrap: str, slot: str, target: str, workdir: Path, fmt: str, registry: str | None) -> float:
    prefix = f"bench_{slot}"
    config: dict[str, object] = {
        "source": {"dsn": dsn, "slot": slot, "publication": "bench_pub"},
        "tables": [TABLE],
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3},
        "topic_prefix": prefix,
        "format": fmt,
        "http": {"enabled": False},
        "status_interval_s": 1.0,
    }
    if fmt == "avro":
        config["schema_registry"] = {"url": registry}
    proc, log = daemon(config, workdir, slot)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
                if row and row[0]:
                    break
                if proc.poll() is not None:
                    raise SystemExit(f"the daemon exited:\n{log.read_text()}")
                time.sleep(0.01)
            started = time.perf_counter()
            done = wait_confirmed(conn, slot, target, 900)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return done - started


def latency(dsn: str, bootstrap: str, workdir: Path, seconds: float, rate: int) -> list[float]:
    slot = "bench_latency"
    create_slots(dsn, [slot])
    prefix = "bench_latency"
    config = {
        "source": {"dsn": dsn, "slot": slot, "publication": "bench_pub"},
        "tables": [TABLE],
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3, "producer": {"linger.ms": 1}},
        "topic_prefix": prefix,
        "http": {"enabled": False},
        "status_interval_s": 1.0,
    }
    proc, _ = daemon(config, workdir, slot)
    topic = f"{prefix}.{TABLE}"
    samples: list[float] = []
    try:
        time.sleep(3)
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "bench-latency", "fetch.wait.max.ms": 5, "auto.offset.reset": "latest"}
        )
        while topic not in consumer.list_topics(timeout=10).topics:
            time.sleep(0.1)
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        assign = []
        for p in parts:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assign.append(TopicPartition(topic, p, high))
        consumer.assign(assign)
        stop = threading.Event()

        def write() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                i = 10_000_000_000
                interval = 1.0 / rate
                next_at = time.perf_counter()
                end = next_at + seconds
                while time.perf_counter() < end:
                    conn.execute(
                        "INSERT INTO bench_rows VALUES (%s, 'l', 1, 'c', now(), gen_random_uuid())", (i,)
                    )
                    i += 1
                    next_at += interval
                    pause = next_at - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
            stop.set()

        writer = threading.Thread(target=write)
        writer.start()
        quiet_since = None
        while True:
            msg = consumer.poll(0.05)
            now_ms = time.time_ns() / 1e6
            if msg is None or msg.error():
                if stop.is_set():
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 3:
                        break
                continue
            quiet_since = None
            value = msg.value()
            if value:
                samples.append(now_ms - json.loads(value)["source"]["ts_ms"])
        writer.join()
        consumer.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=15.0)
    parser.add_argument("--rate", type=int, default=1000, help="transactions per second for the latency run")
    parser.add_argument("--formats", default="json,avro", help="comma-separated: json, avro")
    args = parser.parse_args()

    formats = args.formats.split(",")
    endpoints = dev.up(dev.default_state_dir(), registry="avro" in formats)
    if "avro" in formats and endpoints.schema_registry_url is None:
        raise SystemExit("no schema registry could be started: run with --formats json")
    dsn = setup_database(endpoints.postgres_dsn)
    runs = list(range(args.runs))
    create_slots(dsn, [f"bench_dec_{i}" for i in runs] + [f"bench_{f}_{i}" for f in formats for i in runs])
    t0 = time.perf_counter()
    target = write_rows(dsn, args.rows)
    print(f"workload: {args.rows} rows in {args.rows // 1000} transactions written in {time.perf_counter() - t0:.1f}s")

    workdir = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    dec_rates: list[float] = []
    e2e_rates: dict[str, list[float]] = {f: [] for f in formats}
    for i in runs:
        rate, rows = decoder_only(dsn, f"bench_dec_{i}", Lsn.parse(target))
        assert rows == args.rows, f"decoded {rows} rows, expected {args.rows}"
        dec_rates.append(rate)
        line = f"run {i + 1}: decoder-only {rate:,.0f} rows/s"
        for fmt in formats:
            elapsed = end_to_end(
                dsn, endpoints.kafka_bootstrap, f"bench_{fmt}_{i}", target, workdir, fmt, endpoints.schema_registry_url
            )
            e2e_rates[fmt].append(args.rows / elapsed)
            line += f", end-to-end {fmt} {args.rows / elapsed:,.0f} rows/s"
        print(line)
    dec = statistics.median(dec_rates)
    print(f"median decoder-only: {dec:,.0f} rows/s")
    for fmt in formats:
        e2e = statistics.median(e2e_rates[fmt])
        print(f"median end-to-end {fmt} (acks=all, idempotent): {e2e:,.0f} rows/s; ratio to decoder-only {e2e / dec:.2f} (target >= 0.60)")

    samples = latency(dsn, endpoints.kafka_bootstrap, workdir, args.latency_seconds, args.rate)
    if samples:
        q = statistics.quantiles(samples, n=100)
        print(
            f"latency commit -> visible to a consumer at {args.rate} tx/s over {args.latency_seconds:.0f}s: "
            f"n={len(samples)} p50={q[49]:.1f}ms p99={q[98]:.1f}ms max={max(samples):.1f}ms (target p99 < 100 ms)"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
