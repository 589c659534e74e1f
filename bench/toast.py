"""Unchanged TOASTed values: the daemon's rate on updates that leave large values alone, per way of filling them.

One command: ``.venv/bin/python bench/toast.py`` (``--rows 10000 --runs 1`` for a quick look).

The workload: two tables of ``--rows`` rows, each row a small counter and two values stored out of line
(a ~4 KB incompressible text and a ~4 KB jsonb document); ``toast_default`` has REPLICA IDENTITY DEFAULT,
``toast_full`` REPLICA IDENTITY FULL. The slots are made first, then every row of each table is updated
once (``n = n + 1``, the large values left alone) in ``--tx-rows``-row transactions, so every run reads
the same WAL. Per run, from the start of streaming until the slot's confirmed LSN passes the workload's end
(Kafka acknowledged everything):

- ``full``: the daemon on ``toast_full`` (the values come from the old row in WAL);
- ``fill``: the daemon's default on ``toast_default`` (the values read again by key);
- ``placeholder``: ``toast.mode: placeholder`` on ``toast_default`` (Debezium's bytes; no value at all, so
  its records are smaller: the floor, not a mode to compare for completeness).

Printed: rows/s (median of the runs) and CPU per row of the daemon, the Postgres server and the broker, and
the ratio fill / full, the issue's target being at least 0.5.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cdc import dev
from cdc.sink.kafka import admin_client
from cpu import Services, process_cpu, spent  # bench/cpu.py
from decoder import create_slots  # bench/decoder.py
from e2e import daemon, drop_topics, per_row, wait_confirmed, wait_released, wait_streaming  # bench/e2e.py

DB = "bench_toast"
MODES = ("full", "fill", "placeholder")


def setup(admin_dsn: str, rows: int) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'bench\\_toast\\_%%'"
        ):
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=DB)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table, identity in (("toast_default", "DEFAULT"), ("toast_full", "FULL")):
            conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, n int NOT NULL, body text, doc jsonb)")
            conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY {identity}")
            # md5 chains: incompressible text, so both values are stored out of line
            conn.execute(
                f"INSERT INTO {table} SELECT g, 0, "
                "(SELECT string_agg(md5(g::text || ':' || i), '') FROM generate_series(1, 128) i), "
                "jsonb_build_object('id', g, 'blob', (SELECT string_agg(md5(i || ':' || g), '') FROM "
                "generate_series(1, 128) i)) "
                "FROM generate_series(1, %s) g",
                (rows,),
            )
            conn.execute(f"CREATE PUBLICATION pub_{table} FOR TABLE {table}")
        conn.execute("CHECKPOINT")
    return dsn


def update_all(dsn: str, rows: int, tx_rows: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("toast_default", "toast_full"):
            for low in range(1, rows + 1, tx_rows):
                conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id >= %s AND id < %s", (low, low + tx_rows))
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])


def run_once(
    dsn: str, bootstrap: str, mode: str, slot: str, target: str, workdir: Path, meter: Services
) -> tuple[float, dict[str, float]]:
    table = "toast_full" if mode == "full" else "toast_default"
    config: dict[str, object] = {
        "source": {"dsn": dsn, "slot": slot, "publication": f"pub_{table}"},
        "tables": [f"public.{table}"],
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3},
        "topic_prefix": f"bench_toast_{slot}",
        "http": {"enabled": False},
        "status_interval_s": 1.0,
        "snapshot": {"mode": "no_data"},
        "toast": {"mode": "placeholder" if mode == "placeholder" else "fill"},
    }
    proc, log = daemon(config, workdir, slot)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_streaming(conn, slot, proc, log)
            started = time.perf_counter()
            before = {"daemon": process_cpu(proc.pid)} | meter.read()
            done = wait_confirmed(conn, slot, target, 900)
            after = {"daemon": process_cpu(proc.pid)} | meter.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    wait_released(dsn, slot)
    return done - started, spent(before, after)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000, help="rows per table, each updated once")
    parser.add_argument("--tx-rows", type=int, default=100, help="rows per update transaction")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    endpoints = dev.up(dev.default_state_dir(), registry=False)
    admin = admin_client(endpoints.kafka_bootstrap, {})
    drop_topics(admin, "bench_toast_")
    t0 = time.perf_counter()
    dsn = setup(endpoints.postgres_dsn, args.rows)
    print(
        f"tables: 2 x {args.rows} rows (~4 KB text + ~4 KB jsonb each, out of line) in {time.perf_counter() - t0:.1f}s"
    )
    runs = range(args.runs)
    create_slots(dsn, [f"bench_toast_{m}_{i}" for i in runs for m in MODES])
    t0 = time.perf_counter()
    target = update_all(dsn, args.rows, args.tx_rows)
    print(
        f"workload: {args.rows} updates per table in {args.tx_rows}-row transactions, {time.perf_counter() - t0:.1f}s"
    )

    workdir = Path(tempfile.mkdtemp(prefix="cdc-bench-toast-"))
    meter = Services()
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    cpus: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for i in runs:
        for mode in MODES:  # alternated, so that each run's modes share one machine state
            seconds, cpu = run_once(
                dsn, endpoints.kafka_bootstrap, mode, f"bench_toast_{mode}_{i}", target, workdir, meter
            )
            rates[mode].append(args.rows / seconds)
            cpus[mode].append(cpu)
            print(f"  run {i + 1} {mode:<11} {args.rows / seconds:>9,.0f} rows/s  {per_row(cpu, args.rows)}")
    print("medians:")
    for mode in MODES:
        middle = sorted(cpus[mode], key=lambda c: c["daemon"])[len(cpus[mode]) // 2]
        print(f"  {mode:<11} {statistics.median(rates[mode]):>9,.0f} rows/s  CPU/row {per_row(middle, args.rows)}")
    ratio = statistics.median(rates["fill"]) / statistics.median(rates["full"])
    pairs = ", ".join(f"{f / g:.2f}" for f, g in zip(rates["fill"], rates["full"], strict=True))
    print(f"fill / full: {ratio:.2f} (per run: {pairs}; target >= 0.5)")
    print(f"placeholder / full: {statistics.median(rates['placeholder']) / statistics.median(rates['full']):.2f}")
    drop_topics(admin, "bench_toast_")
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'bench\\_toast\\_%%'"
        ):
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
