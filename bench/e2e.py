"""End-to-end throughput and latency: commit in Postgres -> acknowledged by Kafka.

One command: ``.venv/bin/python bench/e2e.py`` (``--rows 200000`` for a quick run).

1. Throughput. One workload of N row changes (6-column rows, 1,000-row
   transactions) is written once, after creating several slots at the same
   point, so every run reads exactly the same WAL. Per run:
   - decoder only: receive + decode into ChangeEvents with typed values, no Kafka
     (the reference); and the same with rows rendered straight to JSON text, which
     is how ``cdc run`` decodes (``decoder.render_rows``), printed beside it;
   - end to end: the real daemon (``cdc run``, each format of ``--formats``) from
     start of streaming until the slot's confirmed LSN passes the workload's end,
     i.e. until Kafka acknowledged everything (confirmation follows acknowledgment).
     ``json-typed``/``avro-typed`` run the daemon with ``render_rows: false``.
   Medians of the runs and the ratios end-to-end / decoder-only are printed.
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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from decoder import DB, PUBLICATION, TABLE, create_slots, read_with_cdc, setup_database, write_rows  # bench/decoder.py

from cdc import dev
from cdc.lsn import Lsn
from cdc.sink.serialize import JsonSerializer, JsonSettings


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
    prefix = f"bench_{RUN}_{slot}"
    config: dict[str, object] = {
        "source": {"dsn": dsn, "slot": slot, "publication": PUBLICATION},
        "tables": [TABLE],
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3},
        "topic_prefix": prefix,
        "format": fmt.removesuffix("-typed"),
        "http": {"enabled": False},
        "status_interval_s": 1.0,
        "snapshot": {"mode": "no_data"},  # the slots were made before the workload: stream it, read nothing
    }
    if fmt.startswith("avro"):
        config["schema_registry"] = {"url": registry}
    if fmt.endswith("-typed"):
        config["decoder"] = {"render_rows": False}  # every row through typed values: the path before rendering
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
    prefix = f"bench_{RUN}_latency"
    config = {
        "source": {"dsn": dsn, "slot": slot, "publication": PUBLICATION},
        "tables": [TABLE],
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3, "producer": {"linger.ms": 1}},
        "topic_prefix": prefix,
        "http": {"enabled": False},
        "status_interval_s": 1.0,
        "snapshot": {"mode": "no_data"},  # only the latency workload: not the rows written before
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


# Topic prefixes are unique per invocation: a progress topic left by an earlier run (its table had
# another OID in the database recreated since) would make the daemon snapshot the table again while
# it is being measured.
RUN = time.strftime("%Y%m%d%H%M%S")


def drop_bench_topics(bootstrap: str) -> None:
    """Delete the topics earlier invocations left (a 1M-row run leaves ~1 GB per format)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    old = [t for t in admin.list_topics(timeout=10).topics if t.startswith("bench_") and not t.startswith(f"bench_{RUN}")]
    if old:
        for future in admin.delete_topics(old, operation_timeout=30).values():
            future.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=15.0)
    parser.add_argument("--rate", type=int, default=1000, help="transactions per second for the latency run")
    parser.add_argument(
        "--formats",
        default="json,avro",
        help="comma-separated: json, avro, and json-typed / avro-typed (decoder.render_rows false)",
    )
    args = parser.parse_args()

    formats = args.formats.split(",")
    avro = any(f.startswith("avro") for f in formats)
    endpoints = dev.up(dev.default_state_dir(), registry=avro)
    if avro and endpoints.schema_registry_url is None:
        raise SystemExit("no schema registry could be started: run with --formats json")
    dsn = setup_database(endpoints.postgres_dsn)
    drop_bench_topics(endpoints.kafka_bootstrap)
    runs = list(range(args.runs))
    create_slots(
        dsn,
        [f"bench_dec_{i}" for i in runs]
        + [f"bench_rdec_{i}" for i in runs]
        + [f"bench_{f.replace('-', '_')}_{i}" for f in formats for i in runs],
    )
    # What `cdc run` decodes for the JSON format: rows rendered straight to JSON text (decoder.render_rows).
    json_rendering = JsonSerializer(JsonSettings(topic_prefix="bench", database=DB), lambda topic: 3).row_rendering
    t0 = time.perf_counter()
    target = str(write_rows(dsn, args.rows, 1000))
    print(f"workload: {args.rows} rows in {args.rows // 1000} transactions written in {time.perf_counter() - t0:.1f}s")

    workdir = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    dec_rates: list[float] = []
    rdec_rates: list[float] = []
    e2e_rates: dict[str, list[float]] = {f: [] for f in formats}
    for i in runs:
        seconds, rows = read_with_cdc(dsn, f"bench_dec_{i}", Lsn.parse(target))
        assert rows == args.rows, f"decoded {rows} rows, expected {args.rows}"
        rate = rows / seconds
        dec_rates.append(rate)
        seconds, rows = read_with_cdc(dsn, f"bench_rdec_{i}", Lsn.parse(target), json_rendering)
        assert rows == args.rows, f"decoded {rows} rows, expected {args.rows}"
        rdec_rates.append(rows / seconds)
        line = f"run {i + 1}: decoder-only {rate:,.0f} rows/s (rendering JSON {rows / seconds:,.0f})"
        for fmt in formats:
            elapsed = end_to_end(
                dsn, endpoints.kafka_bootstrap, f"bench_{fmt.replace('-', '_')}_{i}", target, workdir, fmt, endpoints.schema_registry_url
            )
            e2e_rates[fmt].append(args.rows / elapsed)
            line += f", end-to-end {fmt} {args.rows / elapsed:,.0f} rows/s"
        print(line)
    dec = statistics.median(dec_rates)
    rdec = statistics.median(rdec_rates)
    print(f"median decoder-only: {dec:,.0f} rows/s (typed events); rendering JSON rows: {rdec:,.0f} rows/s")
    for fmt in formats:
        e2e = statistics.median(e2e_rates[fmt])
        print(
            f"median end-to-end {fmt} (acks=all, idempotent): {e2e:,.0f} rows/s; ratio to decoder-only {e2e / dec:.2f} "
            f"(target >= 0.60); to the rendering decoder {e2e / rdec:.2f}"
        )

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
