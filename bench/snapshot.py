"""Initial snapshot throughput: rows/s into Kafka (JSON) beside a bare COPY of the same table, 1 vs N workers.

One command: ``.venv/bin/python bench/snapshot.py`` (5,000,000 rows; ``--rows 500000`` for a quick run).

In one run, on the local services (``cdc dev up``):

0. The ``bench_`` topics earlier benchmarks left on the broker are deleted.
1. A table of N 6-column rows (bigint key, text, numeric(12,2), varchar, timestamptz,
   uuid; the shape of ``bench/e2e.py``) is written once and analyzed.
2. ``COPY (SELECT ...) TO STDOUT`` of the whole table, read by psycopg without parsing:
   the reference (what the server and libpq can hand over).
3. Per-row costs of the snapshot's own steps on a sample (one process): parse the COPY
   line through the stream's converters, build the ChangeEvent and serialize it, produce.
4. The initial snapshot (``cdc.snapshot.initial.InitialSnapshot``: a new slot with an
   exported snapshot, planning, worker processes, COPY, JSON, produce, wait for every
   acknowledgment) with each worker count, with the row codec writing the rows from the
   COPY text and the four position headers on every record (``--workers``;
   ``kafka.position_headers: true``, the default until #21); for comparison, with the server
   building the rows' JSON (``snapshot.server_json: true``, the default until 2026-11-27),
   the row codec with no position headers (``--headerless-workers``: **the daemon's
   default** since #21, the figure to quote), and (opt-in) the ordinary path where Python
   parses and serializes every row; a fresh slot and topic each, the topic deleted after its run
   (unless ``--keep``), the daemon's default configuration first. Rows/s is rows over the whole run,
   start-up (slot, planning, worker start) included.
5. The Kafka ceiling: the same number of this table's records, made beforehand (a sample,
   cycled), produced by 1 and N processes with the snapshot's own producer
   (``BulkProducer``, the pipeline's producer settings, the four position headers as a
   worker sends them) and no database work at all: the most any snapshot written in
   Python with confluent-kafka can reach on this machine and broker. Also without
   the headers, to show what they cost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient

from cdc import dev
from cdc import log as logsetup
from cdc.catalog import describe_tables
from cdc.config import TableConfig
from cdc.decoder.types import parser_for
from cdc.event import ChangeEvent, Op, TableSchema, TxBegin
from cdc.lsn import Lsn
from cdc.render import codec
from cdc.sink.bulk import BulkProducer
from cdc.sink.delivery import AtLeastOnce
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.kafka import TopicSpec, admin_client, ensure_topics, producer_config
from cdc.sink.records import position_headers
from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.copytext import row_parser, unescape
from cdc.snapshot.initial import InitialSnapshot
from cdc.snapshot.output import JsonKafkaOutput
from cdc.snapshot.plan import describe_table
from cdc.snapshot.progress import ProgressTracker
from cdc.snapshot.state import MemoryStore, SnapshotState
from cpu import Services, spent, tree_cpu  # bench/cpu.py
from e2e import drop_topics  # bench/e2e.py
from options import add_producer_option, producer_settings  # bench/options.py

DB = "cdc_bench_snapshot"
TABLE = "public.bench_rows"
COLUMNS = "id, name, amount, code, created, ref"
SNAPSHOT_PROCESSES = "snapshot (this process + workers)"  # exited workers are in this process's reaped-children time


def setup(admin_dsn: str, rows: int) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (DB,)).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=DB)
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_rows (id bigint PRIMARY KEY, name text, amount numeric(12,2), "
            "code varchar(16), created timestamptz, ref uuid)"
        )
        step = 1_000_000
        for start in range(0, rows, step):
            conn.execute(
                """
                INSERT INTO bench_rows
                SELECT i, 'customer ' || i, (i %% 100000) / 100.0, 'C' || (i %% 997),
                       timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second', gen_random_uuid()
                  FROM generate_series(%s::bigint, %s::bigint) i
                """,
                (start + 1, min(rows, start + step)),
            )
        conn.execute("VACUUM ANALYZE bench_rows")
        size = conn.execute("SELECT pg_size_pretty(pg_table_size('bench_rows'))").fetchone()
    print(f"table: {rows:,} rows, {size[0] if size else '?'} on disk, written in {time.monotonic() - started:.1f}s")
    return dsn


def bare_copy(dsn: str) -> tuple[float, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        n = 0
        nbytes = 0
        with conn.cursor().copy(f"COPY (SELECT {COLUMNS} FROM bench_rows) TO STDOUT") as copy:
            while data := copy.read():
                n += 1
                nbytes += len(data)
        elapsed = time.perf_counter() - started
    return n / elapsed, nbytes


def sample_lines(dsn: str, sample: int) -> tuple[TableSchema, list[bytes]]:
    """The table's schema and the COPY text lines of its first ``sample`` rows (no newline)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        info = describe_tables(conn, [TableConfig(name=TABLE)])[TABLE]
        schema = describe_table(conn, info).schema
        lines = []
        with conn.cursor().copy(f"COPY (SELECT {COLUMNS} FROM bench_rows LIMIT {sample}) TO STDOUT") as copy:
            while data := copy.read():
                lines.append(bytes(data[:-1]))
    return schema, lines


def sample_records(dsn: str, prefix: str, sample: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of the first ``sample`` rows as the snapshot writes them (snapshot reads, JSON)."""
    schema, lines = sample_lines(dsn, sample)
    parse = row_parser(schema.columns, where=TABLE)
    serializer = JsonSerializer(JsonSettings(topic_prefix=prefix, database=DB), lambda _t: 3)
    point = Lsn(1)
    out = []
    for i, line in enumerate(lines):
        (record,) = serializer.records(ChangeEvent(Op.READ, schema, None, parse(line), point, point, None, i, 0, True))
        assert record.value is not None
        out.append((record.key, record.value))
    return out


def _ceiling_producer(
    config: dict[str, Any],
    topic: str,
    records: list[tuple[bytes, bytes]],
    count: int,
    headers: bool,
    go: Any,
    done: Any,
) -> None:
    """One process of the ceiling: produce ``count`` of the prepared records as a snapshot worker does."""
    bulk = BulkProducer(config)
    produce, wait = bulk.produce, bulk.wait
    position: dict[str, str | bytes | None] = dict(position_headers(Lsn(1), Lsn(1), 1, 0))
    go.wait()
    for ordinal in range(count):
        key, value = records[ordinal % len(records)]
        while True:
            try:
                if headers:
                    h = position.copy()
                    h["cdc.ordinal"] = b"%d" % ordinal
                    produce(topic, value, key, headers=h)
                else:
                    produce(topic, value, key)
                break
            except BufferError:
                wait()
    while bulk.drain(60):
        pass
    done.put(os.times())


def kafka_ceiling(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], rows: int, processes: int, headers: bool
) -> tuple[float, float, float]:
    """Rows/s from the first produce to the last acknowledgment, the producers' CPU seconds per row
    (user + system of the processes, librdkafka's threads included), and the broker's."""
    ensure_topics(admin_client(bootstrap, {}), [TopicSpec(topic, 3, 1)])
    ctx = multiprocessing.get_context("spawn")  # as the snapshot's workers: nothing of this process's clients
    go, done = ctx.Event(), ctx.Queue()
    config = producer_config(bootstrap, PRODUCER, 1_000_000)  # the snapshot runs' settings (--producer)
    share = [rows // processes + (1 if i < rows % processes else 0) for i in range(processes)]
    procs = [ctx.Process(target=_ceiling_producer, args=(config, topic, records, n, headers, go, done)) for n in share]
    for p in procs:
        p.start()
    time.sleep(2.0)  # producers connected and idempotence ids acquired before the clock starts
    services = Services()
    broker0 = services.read()["broker"]
    started = time.perf_counter()
    go.set()
    times = [done.get(timeout=600) for _ in procs]
    elapsed = time.perf_counter() - started
    broker = services.read()["broker"] - broker0
    for p in procs:
        p.join()
    cpu = sum(t.user + t.system for t in times)
    return rows / elapsed, cpu / rows, broker / rows


def per_row_costs(dsn: str, bootstrap: str, prefix: str, sample: int) -> dict[str, float]:
    """Microseconds per row of each step, on ``sample`` rows in one process: each pass adds a step, nothing
    is kept (as in a worker), and a step's cost is the difference to the pass before."""
    schema, lines = sample_lines(dsn, sample)
    parse = row_parser(schema.columns, where=TABLE)
    serializer = JsonSerializer(JsonSettings(topic_prefix=prefix, database=DB), lambda _t: 3)
    ensure_topics(admin_client(bootstrap, {}), [TopicSpec(f"{prefix}.public.bench_rows", 3, 1)])
    delivery = AtLeastOnce(producer_config(bootstrap, PRODUCER, 1_000_000), max_record_bytes=1_000_000)
    delivery.begin(TxBegin(0, Lsn(1), 0))
    point = Lsn(1)

    def run(steps: int) -> float:
        started = time.perf_counter()
        for i, line in enumerate(lines):
            row = parse(line)
            if steps >= 2:
                event = ChangeEvent(Op.READ, schema, None, row, point, point, None, i, 0, True)
                if steps >= 3:
                    for record in serializer.records(event):
                        if steps >= 4:
                            delivery.send(record, TABLE)
                    if steps >= 4 and i % 1024 == 0:
                        delivery.tick()
        if steps >= 4:
            while delivery.drain(60):
                pass
        return (time.perf_counter() - started) / len(lines) * 1e6

    passes = [run(steps) for steps in (1, 2, 3, 4)]
    return {
        "parse (COPY text -> typed row)": passes[0],
        "ChangeEvent": passes[1] - passes[0],
        "serialize (JSON envelope)": passes[2] - passes[1],
        "produce + acknowledge": passes[3] - passes[2],
    }


PATHS = {
    "codec": ("row codec, four position headers (kafka.position_headers: true)", None, True, False),
    "server": ("server-built JSON, four position headers", True, True, False),
    "headerless": ("row codec, no position headers (the daemon's default)", None, True, True),
    "ordinary": ("ordinary path (Python JSON)", False, False, False),
}  # name: (label, snapshot.server_json, decoder.render_rows, without headers)


def codec_cost(dsn: str, prefix: str, sample: int) -> float:
    """Microseconds per row of the row codec (``cdc.render.codec.copy_parser``, the default path's per-row
    work before the splice and ``produce``): COPY line -> after and key JSON."""
    schema, lines = sample_lines(dsn, sample)
    serializer = JsonSerializer(JsonSettings(topic_prefix=prefix, database=DB), lambda _t: 3)
    rendering = serializer.row_rendering(schema)
    assert rendering is not None
    render = codec.copy_parser(rendering, [parser_for(c.type) for c in schema.columns], unescape)
    started = time.perf_counter()
    for line in lines:
        render(line)
    return (time.perf_counter() - started) / len(lines) * 1e6


def snapshot_run(
    dsn: str, bootstrap: str, prefix: str, slot: str, workers: int, chunk_rows: int, path: str
) -> dict[str, Any]:
    _, server_json, render_rows, headerless = PATHS[path]
    topic = f"{prefix}.public.bench_rows"
    partitions = ensure_topics(admin_client(bootstrap, {}), [TopicSpec(topic, 3, 1)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = describe_tables(conn, [TableConfig(name=TABLE)])
    output = JsonKafkaOutput(
        JsonSettings(topic_prefix=prefix, database=DB),
        partitions,
        producer_config(bootstrap, PRODUCER, 1_000_000),
        1_000_000,
        render_rows=render_rows,
        position_headers=not headerless,
    )
    settings = SnapshotConfig(
        workers=workers, chunk_rows=chunk_rows, progress_log_s=30, progress_bar=False, server_json=server_json
    )
    progress = ProgressTracker("initial", log_interval_s=30)
    snapshot = InitialSnapshot(
        conninfo=dsn,
        slot=slot,
        tables=tables,
        output=output,
        state=SnapshotState(MemoryStore()),
        settings=settings,
        progress=progress,
        log_level="warning",
    )
    services = Services()
    before = {SNAPSHOT_PROCESSES: tree_cpu(os.getpid())} | services.read()
    started = time.monotonic()
    result = snapshot.run()
    elapsed = time.monotonic() - started
    cpu = spent(before, {SNAPSHOT_PROCESSES: tree_cpu(os.getpid())} | services.read())
    copy_s = progress.read().elapsed_s  # the tracker starts with the engine; the copy phase is what follows planning
    assert result.server_json_rows == (result.rows if server_json else 0), "the path asked for was not taken"
    assert result.rendered_rows == (result.rows if render_rows and not server_json else 0), "the codec did not run"
    return {
        "rows": result.rows,
        "elapsed_s": elapsed,
        "rows_per_s": result.rows / elapsed,
        "tracker_s": copy_s,
        "cpu": cpu,
    }


PRODUCER: dict[str, object] = {}  # --producer: librdkafka settings of the snapshot's producers and the ceiling's


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument(
        "--workers", default=f"1,{min(4, os.cpu_count() or 2)}", help="worker counts to run, e.g. 1,2,4"
    )
    parser.add_argument("--chunk-rows", type=int, default=50_000)
    parser.add_argument(
        "--server-workers",
        default=str(min(4, os.cpu_count() or 2)),
        help="worker counts with server-built JSON (the default path before 2026-11-27); empty: skip",
    )
    parser.add_argument(
        "--headerless-workers",
        default=str(min(4, os.cpu_count() or 2)),
        help="worker counts of the row codec without position headers (the daemon's default); empty: skip",
    )
    parser.add_argument(
        "--ordinary-workers",
        default="",
        help="worker counts for the ordinary path (Python builds the JSON), e.g. 2; empty: skip it",
    )
    parser.add_argument("--copy-runs", type=int, default=3, help="bare COPY runs (median)")
    parser.add_argument("--runs", type=int, default=3, help="snapshot runs per configuration (median)")
    parser.add_argument("--sample", type=int, default=100_000, help="rows for the per-row cost breakdown")
    parser.add_argument(
        "--keep", action="store_true", help="keep the database and topics afterwards (until the next benchmark's start)"
    )
    parser.add_argument(
        "--no-ceiling",
        dest="ceiling",
        action="store_false",
        help="skip the Kafka ceiling (prepared records produced with no database work)",
    )
    add_producer_option(parser, "the snapshot's producers and the ceiling's")
    args = parser.parse_args()
    PRODUCER.update(producer_settings(parser, args.producer))
    logsetup.configure("console", "warning")
    endpoints = dev.up(dev.default_state_dir(), registry=False)
    print(
        f"services: {endpoints.postgres_dsn}  kafka {endpoints.kafka_bootstrap}  ({os.cpu_count()} CPUs); "
        f"row codec: {codec.IMPLEMENTATION}; producer settings {PRODUCER or 'the defaults'}; "
        f"load average {os.getloadavg()}"
    )
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    drop_topics(admin, "bench_")  # what earlier benchmarks left (e2e.py and debezium.py keep theirs until the next)
    dsn = setup(endpoints.postgres_dsn, args.rows)
    prefix = f"bench_snapshot_{int(time.time())}"
    try:
        copies = [bare_copy(dsn) for _ in range(args.copy_runs)]
        copy_rate = statistics.median(rate for rate, _ in copies)
        print(
            f"bare COPY (SELECT ...) TO STDOUT: {copy_rate:,.0f} rows/s "
            f"(median of {len(copies)}, {copies[0][1] / 1e6:,.0f} MB of text)"
        )
        costs = per_row_costs(dsn, endpoints.kafka_bootstrap, f"{prefix}_costs", min(args.sample, args.rows))
        print(
            "per-row cost, one process: "
            + ", ".join(f"{k} {v:.2f} µs" for k, v in costs.items())
            + f"; total {sum(costs.values()):.2f} µs = {1e6 / sum(costs.values()):,.0f} rows/s"
        )
        print(
            f"per-row cost of the row codec ({codec.IMPLEMENTATION}), COPY line -> after and key JSON: "
            f"{codec_cost(dsn, f'{prefix}_costs', min(args.sample, args.rows)):.2f} µs"
        )
        # The daemon's default first: the figure to quote is measured from the machine state the bare COPY
        # was (each later configuration follows gigabytes written by the ones before it: page cache, broker).
        configs = [("headerless", int(w)) for w in args.headerless_workers.split(",") if w]
        configs += [("codec", int(w)) for w in args.workers.split(",") if w]
        configs += [("server", int(w)) for w in args.server_workers.split(",") if w]
        configs += [("ordinary", int(w)) for w in args.ordinary_workers.split(",") if w]
        for name, workers in configs:
            path = PATHS[name][0]
            rates, cpus = [], []
            for run in range(args.runs):
                tag = f"{name[0]}{workers}r{run}"
                r = snapshot_run(
                    dsn,
                    endpoints.kafka_bootstrap,
                    f"{prefix}_{tag}",
                    f"bench_{tag}_{int(time.time())}",
                    workers,
                    args.chunk_rows,
                    name,
                )
                rates.append(r["rows_per_s"])
                cpus.append(r["cpu"])
                if not args.keep:
                    drop_topics(admin, f"{prefix}_{tag}.")
                print(
                    f"  snapshot, {path}, {workers} worker(s), run {run + 1}: {r['rows']:,} rows in "
                    f"{r['elapsed_s']:.1f}s = {r['rows_per_s']:,.0f} rows/s"
                )
            rate = statistics.median(rates)
            print(
                f"snapshot, {path}, {workers} worker(s): median {rate:,.0f} rows/s of {len(rates)} runs = "
                f"{rate / copy_rate * 100:.1f}% of bare COPY (ratio {rate / copy_rate:.3f})"
            )
            parts = {name: statistics.median(c[name] for c in cpus) / args.rows for name in cpus[0]}
            total = sum(parts.values())
            print(
                f"  CPU per row: {', '.join(f'{k} {v * 1e6:.2f} µs' for k, v in parts.items())}; total "
                f"{total * 1e6:.2f} µs ({total * rate:.2f} of {os.cpu_count()} cores busy); at this CPU per row "
                f"{os.cpu_count()} cores allow at most {(os.cpu_count() or 1) / total:,.0f} rows/s = "
                f"{(os.cpu_count() or 1) / total / copy_rate * 100:.1f}% of bare COPY"
            )
        if args.ceiling:
            records = sample_records(dsn, f"{prefix}_ceiling", min(args.sample, args.rows))
            for headers in (True, False):
                for processes in sorted({int(w) for w in args.workers.split(",") if w}):
                    rates, cpus, brokers = [], [], []
                    for run in range(args.runs):
                        topic = f"{prefix}_ceiling_{'h' if headers else 'n'}{processes}r{run}"
                        rate, cpu, broker = kafka_ceiling(
                            endpoints.kafka_bootstrap, topic, records, args.rows, processes, headers
                        )
                        rates.append(rate)
                        cpus.append(cpu)
                        brokers.append(broker)
                        if not args.keep:
                            drop_topics(admin, topic)
                    rate = statistics.median(rates)
                    print(
                        f"Kafka ceiling, prepared records, no database, {processes} producer process(es), "
                        f"{'four position headers' if headers else 'no headers'}: median {rate:,.0f} rows/s "
                        f"({', '.join(f'{r:,.0f}' for r in rates)}) = {rate / copy_rate * 100:.1f}% of bare COPY; "
                        f"CPU per row: producers {statistics.median(cpus) * 1e6:.2f} µs, "
                        f"broker {statistics.median(brokers) * 1e6:.2f} µs"
                    )
    finally:
        if not args.keep:
            drop_topics(admin, prefix)
            with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
                for (slot,) in conn.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (DB,)
                ).fetchall():
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
