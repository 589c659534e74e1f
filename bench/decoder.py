"""Decoder throughput against the server: rows/s received and decoded into ChangeEvents, beside pg_recvlogical.

One command: ``.venv/bin/python bench/decoder.py --rows 1000000 --runs 3``

Slots are created first (two per run, at the same point), then one workload of
``--rows`` inserts of a 6-column row (bigint, text, numeric(12,2), varchar(16),
timestamptz, uuid) in ``--tx-size``-row transactions is written, so every read
is a catch-up over exactly the same WAL. Per run:

- ``cdc``: ``ReplicationStream`` + ``ChangeDecoder.feed`` (the daemon's read and
  decode path, typed values and all), until the commit at or past the
  workload's end; no Kafka;
- ``pg_recvlogical -f /dev/null`` (PostgreSQL's own C client, the reference)
  reading the same changes from its own slot with the same pgoutput options,
  until the same end position.

Both are timed from connection to the end. The runs alternate which goes
first. Medians and the ratio cdc / pg_recvlogical are printed (target >= 1.0).
``--profile`` runs the cdc read once more under cProfile and prints the top
functions. The PostgreSQL server is the development one (``cdc dev up``,
started if needed), or ``--dsn``; the benchmark uses its own database,
``cdc_bench_decoder``, dropped and recreated at the start.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import time

import psycopg
import structlog

from cdc import dev
from cdc.catalog import describe_tables
from cdc.config import TableConfig
from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.rows import RowRenderer
from cdc.dev import postgres
from cdc.event import ChangeEvent, TxCommit
from cdc.lsn import Lsn
from cdc.process import tune_gc
from cdc.replication import ReplicationStream, protocol_for

DB = "cdc_bench_decoder"
TABLE = "public.bench_rows"
PUBLICATION = "bench_decoder_pub"
PG_RECVLOGICAL = postgres.bin_dir() / "pg_recvlogical"


def setup_database(admin_dsn: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        # Slot names are cluster-wide: also drop the benchmarks' slots left in other databases (an
        # interrupted run of an earlier version), which would collide and hold WAL back.
        leftovers = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s OR slot_name LIKE 'bench\\_%%'", (DB,)
        ).fetchall()
        for (slot,) in leftovers:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=DB)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_rows (id bigint PRIMARY KEY, name text, amount numeric(12,2), "
            "code varchar(16), created timestamptz, ref uuid)"
        )
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE bench_rows")
    return dsn


def create_slots(dsn: str, names: list[str]) -> None:
    for name in names:
        stream = ReplicationStream(dsn)
        stream.connect()
        try:
            stream.create_slot(name)
        finally:
            stream.close()


def write_rows(dsn: str, rows: int, tx_size: int) -> Lsn:
    """The workload, in ``tx_size``-row transactions; the WAL position after its last commit."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for base in range(0, rows, tx_size):
            n = min(tx_size, rows - base)
            conn.execute(
                "INSERT INTO bench_rows SELECT g, 'name ' || g, g * 1.25, 'C' || (g %% 1000), now(), "
                "gen_random_uuid() FROM generate_series(%s::bigint, %s::bigint) g",
                (base, base + n - 1),
            )
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(str(row[0]))


def read_with_cdc(dsn: str, slot: str, target: Lsn, renderer: RowRenderer | None = None) -> tuple[float, int]:
    """Seconds and rows: receive and decode into ChangeEvents until the commit at or past ``target``.

    With the daemon's garbage-collector settings (``cdc.process.tune_gc``), as ``cdc run`` has them.
    ``renderer``: the rows rendered in a sink format (``cdc.render``), as ``cdc run`` decodes them."""
    tune_gc()
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = describe_tables(conn, [TableConfig(name=TABLE)])
    decoder = ChangeDecoder(tables, {}, renderer=renderer)
    started = time.perf_counter()
    stream = ReplicationStream(dsn)
    stream.connect()
    proto, options = protocol_for(stream.server_version, streaming=False)
    stream.start(slot, PUBLICATION, Lsn(0), proto_version=proto, options=options, messages=False)
    rows = 0
    feed, read = decoder.feed, stream.read
    try:
        while True:
            frame = read(5.0)
            if frame is None:
                raise SystemExit(f"{slot}: the stream went quiet before the workload's end")
            for event in feed(frame[1], frame[0]):
                if type(event) is ChangeEvent:
                    rows += 1
                elif type(event) is TxCommit:
                    stream.confirm(event.end_lsn)
                    if event.end_lsn >= target:
                        return time.perf_counter() - started, rows
    finally:
        stream.close()


def read_with_pg_recvlogical(dsn: str, slot: str, target: Lsn, proto: int) -> float:
    """Seconds for pg_recvlogical to read the slot up to ``target`` into /dev/null."""
    cmd = [
        str(PG_RECVLOGICAL),
        "--dbname",
        dsn,
        "--slot",
        slot,
        "--start",
        "--no-loop",
        "--endpos",
        str(target),
        "-f",
        "/dev/null",
        "-o",
        f"proto_version={proto}",
        "-o",
        f"publication_names={PUBLICATION}",
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"pg_recvlogical failed ({proc.returncode}): {proc.stderr.strip()}")
    return elapsed


def server_version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tx-size", type=int, default=1000, help="rows per transaction")
    parser.add_argument("--dsn", help="superuser DSN of a server with wal_level=logical (default: the dev server)")
    parser.add_argument("--profile", action="store_true", help="one more cdc read under cProfile")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up

    if not os.access(PG_RECVLOGICAL, os.X_OK):
        raise SystemExit(f"{PG_RECVLOGICAL} not found: install postgresql-15 (or set CDC_PG=18, or CDC_PG_BIN)")
    admin = args.dsn or postgres.up(dev.default_state_dir(), structlog.get_logger("bench"))
    dsn = setup_database(admin)
    proto, _ = protocol_for(server_version(dsn), streaming=False)
    runs = range(args.runs)
    extra = ["bench_profile"] if args.profile else []
    create_slots(dsn, [f"bench_cdc_{i}" for i in runs] + [f"bench_recv_{i}" for i in runs] + extra)
    t0 = time.perf_counter()
    target = write_rows(dsn, args.rows, args.tx_size)
    print(
        f"workload: {args.rows:,} rows in {-(-args.rows // args.tx_size):,} transactions of {args.tx_size}, "
        f"written in {time.perf_counter() - t0:.1f}s; pgoutput protocol {proto}; {os.cpu_count()} CPUs"
    )

    cdc_rates: list[float] = []
    recv_rates: list[float] = []
    for i in runs:
        order = ["cdc", "recv"] if i % 2 == 0 else ["recv", "cdc"]
        for who in order:
            if who == "cdc":
                seconds, rows = read_with_cdc(dsn, f"bench_cdc_{i}", target)
                if rows != args.rows:
                    raise SystemExit(f"decoded {rows} rows, expected {args.rows}")
                cdc_rates.append(args.rows / seconds)
            else:
                recv_rates.append(args.rows / read_with_pg_recvlogical(dsn, f"bench_recv_{i}", target, proto))
        print(f"run {i + 1}: cdc {cdc_rates[-1]:,.0f} rows/s, pg_recvlogical {recv_rates[-1]:,.0f} rows/s")
    cdc, recv = statistics.median(cdc_rates), statistics.median(recv_rates)
    print(f"median cdc (receive + decode into ChangeEvents): {cdc:,.0f} rows/s")
    print(f"median pg_recvlogical -f /dev/null:               {recv:,.0f} rows/s")
    print(f"ratio cdc / pg_recvlogical: {cdc / recv:.2f} (target >= 1.0)")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        read_with_cdc(dsn, "bench_profile", target)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)

    with psycopg.connect(admin, autocommit=True) as conn:
        # Slot names are cluster-wide: also drop the benchmarks' slots left in other databases (an
        # interrupted run of an earlier version), which would collide and hold WAL back.
        leftovers = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s OR slot_name LIKE 'bench\\_%%'", (DB,)
        ).fetchall()
        for (slot,) in leftovers:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
