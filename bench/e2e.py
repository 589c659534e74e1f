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
   - ``pg_recvlogical -f /dev/null`` (PostgreSQL's own C client, as in ``decoder.py``) over the
     same WAL: what reading the slot costs with no decoding at all;
   - ``--position-headers on,off``: each format with the ``cdc.*`` position headers on and off
     (``kafka.position_headers``), in the same runs, so their ratio is of one machine state.
   Medians of the runs and the ratios end-to-end / decoder-only are printed, and each daemon's peak
   RSS (``VmHWM``).
2. Where the CPU goes (``bench/cpu.py``, from ``/proc``): per row, the reader's, the
   Postgres server's and the broker's CPU during each run, and a ceiling: a sample of the
   daemon's own JSON records (headers included), read back from its topic, produced again
   through the daemon's delivery (``AtLeastOnce``: per-record acknowledgment tracking) with
   no database work. decoder-only CPU + its server CPU + that producer's and broker's CPU is
   the least any design that decodes in Python and produces through confluent-kafka spends
   per row; on this machine's cores it bounds the end-to-end rate (serialization not even
   counted).
   Per format it also prints all the CPU of its run spread perfectly over the cores (an upper
   bound for any arrangement of the same per-row work over threads or processes) and one thread
   doing the daemon's main-thread work.
3. Memory through one large transaction (``--big-transaction``, 1,000,000 rows by default): the daemon
   (JSON, the default settings) streams one transaction of that many rows from a slot of its own, and its
   peak RSS (``VmHWM``) is printed against the 200 MB target.
4. Latency at a steady 1,000 transactions/s: commit time (source.ts_ms) to the
   moment a consumer sees the record. That includes the consumer's own fetch
   latency, so it is an upper bound of commit-to-acknowledgment. Same producer
   settings as the throughput runs: the defaults, or ``--producer KEY=VALUE``.
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
from typing import Any

import psycopg
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc import dev
from cdc.event import TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.render.codec import TableRenderer
from cdc.replication import protocol_for
from cdc.sink.delivery import AtLeastOnce
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.kafka import TopicSpec, admin_client, ensure_topics, producer_config
from cdc.sink.record import Record
from cpu import Services, main_thread_cpu, process_cpu, self_cpu, spent  # bench/cpu.py
from decoder import (  # bench/decoder.py  # bench/decoder.py
    DB,
    PUBLICATION,
    TABLE,
    create_slots,
    read_with_cdc,
    read_with_pg_recvlogical,
    server_version,
    setup_database,
    write_rows,
)
from options import add_producer_option, producer_settings  # bench/options.py


def per_row(cpu: dict[str, float], rows: int) -> str:
    """Process by process, then the total."""
    parts = [f"{name} {seconds / rows * 1e6:.1f}" for name, seconds in cpu.items()]
    return ", ".join(parts) + f"; total {sum(cpu.values()) / rows * 1e6:.1f} µs"


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


def wait_released(dsn: str, slot: str, timeout: float = 30.0) -> None:
    """Until the slot's walsender has exited, and a moment more for the postmaster to reap it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
            if row is None or not row[0]:
                break
            time.sleep(0.01)
    time.sleep(0.2)


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


def wait_streaming(
    conn: psycopg.Connection[tuple[object, ...]], slot: str, proc: subprocess.Popen[bytes], log: Path
) -> None:
    """Until the daemon's replication connection holds ``slot`` (SystemExit with its log if it exits)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row and row[0]:
            return
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited:\n{log.read_text()}")
        time.sleep(0.01)
    raise SystemExit(f"the daemon did not start streaming from {slot} within 120 s:\n{log.read_text()}")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set size so far (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def end_to_end(
    dsn: str,
    bootstrap: str,
    slot: str,
    target: str,
    workdir: Path,
    fmt: str,
    registry: str | None,
    meter: Services,
    headers: bool = False,
) -> tuple[float, dict[str, float], float, float]:
    """Seconds until the slot confirmed ``target``; CPU seconds of the daemon, server and broker; of the
    daemon's main thread; and the daemon's peak RSS in MB. ``headers``: ``kafka.position_headers``."""
    prefix = f"bench_{RUN}_{slot}"
    config: dict[str, object] = {
        "source": {"dsn": dsn, "slot": slot, "publication": PUBLICATION},
        "tables": [TABLE],
        "kafka": {
            "bootstrap_servers": bootstrap,
            "partitions": 3,
            "producer": dict(PRODUCER),
            "position_headers": headers,
        },
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
            wait_streaming(conn, slot, proc, log)
            started = time.perf_counter()
            before, main0 = {"daemon": process_cpu(proc.pid)} | meter.read(), main_thread_cpu(proc.pid)
            done = wait_confirmed(conn, slot, target, 900)
            after, main1 = {"daemon": process_cpu(proc.pid)} | meter.read(), main_thread_cpu(proc.pid)
            rss = peak_rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return done - started, spent(before, after), main1 - main0, rss


def big_transaction(dsn: str, bootstrap: str, workdir: Path, rows: int, meter: Services) -> tuple[float, float]:
    """One transaction of ``rows`` rows through the daemon (JSON, default settings): seconds from the
    slot's activation until it confirmed the commit, and the daemon's peak RSS in MB."""
    slot = "bench_big"
    create_slots(dsn, [slot])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bench_rows SELECT g, 'name ' || g, (g %% 1000000) * 1.25, 'C' || (g %% 1000), now(), "
            "gen_random_uuid() "
            "FROM generate_series(%s::bigint, %s::bigint) g",
            (20_000_000_000, 20_000_000_000 + rows - 1),
        )
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
    seconds, _, _, rss = end_to_end(dsn, bootstrap, slot, str(row[0]), workdir, "json", None, meter)
    return seconds, rss


def sample_records(bootstrap: str, topic: str, count: int) -> list[Record]:
    """The first ``count`` records of a topic the daemon wrote: key, value and headers as it sent them."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-sample-{RUN}", "enable.auto.commit": False}
    )
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    records: list[Record] = []
    deadline = time.monotonic() + 120
    while len(records) < count and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, 1.0):
            key, value = msg.key(), msg.value()
            if msg.error() is None and key is not None and value is not None:
                raw: Any = msg.headers() or []  # a list of (name, value) pairs on a consumed message
                headers = tuple((str(name), v if isinstance(v, bytes) else b"") for name, v in raw)
                records.append(Record(topic, key, value, headers))
    consumer.close()
    if len(records) < count:
        raise SystemExit(f"read only {len(records)} records of {topic}, wanted {count}")
    return records[:count]


def producer_ceiling(
    bootstrap: str, records: list[Record], rows: int, meter: Services
) -> tuple[float, dict[str, float], float]:
    """Rows/s and CPU seconds: ``rows`` records (``records`` cycled, 1,000 per transaction) through the
    daemon's own delivery (``AtLeastOnce``: produce with a per-record acknowledgment, the tracker),
    from the first produce until the tracker confirms the last transaction. No database work. Also the CPU
    seconds of this process's main thread (where ``send`` and the delivery reports run)."""
    topic = f"bench_{RUN}_ceiling"
    ensure_topics(admin_client(bootstrap, {}), [TopicSpec(topic, 3, 1)])
    # the daemons' producer settings (--producer), so the ceiling is of the same configuration
    delivery = AtLeastOnce(producer_config(bootstrap, PRODUCER, 1_000_000), max_record_bytes=1_000_000)
    batch = [Record(topic, r.key, r.value, r.headers) for r in records]
    # connected and holding a producer id before the clock starts
    delivery.begin(TxBegin(1, Lsn(1), 0))
    delivery.send(batch[0], TABLE)
    delivery.commit(TxCommit(1, Lsn(1), Lsn(1), 0, 1))
    while delivery.drain(10):
        pass
    before, main0 = {"producer": self_cpu()} | meter.read(), time.thread_time()
    started = time.perf_counter()
    send, tick = delivery.send, delivery.tick
    n = len(batch)
    lsn = 1
    for first in range(0, rows, 1000):
        lsn += 1
        delivery.begin(TxBegin(lsn, Lsn(lsn), 0))
        for i in range(first, min(rows, first + 1000)):
            send(batch[i % n], TABLE)
        delivery.commit(TxCommit(lsn, Lsn(lsn), Lsn(lsn), 0, 1000))
        tick()
    while delivery.acknowledged() < Lsn(lsn):
        delivery.drain(0.01)
    elapsed = time.perf_counter() - started
    after, main1 = {"producer": self_cpu()} | meter.read(), time.thread_time()
    return rows / elapsed, spent(before, after), main1 - main0


def latency(dsn: str, bootstrap: str, workdir: Path, seconds: float, rate: int) -> list[float]:
    slot = "bench_latency"
    create_slots(dsn, [slot])
    prefix = f"bench_{RUN}_latency"
    config = {
        "source": {"dsn": dsn, "slot": slot, "publication": PUBLICATION},
        "tables": [TABLE],
        # the throughput runs' producer settings (the defaults, or --producer): one configuration for both targets
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3, "producer": dict(PRODUCER)},
        "topic_prefix": prefix,
        "http": {"enabled": False},
        "status_interval_s": 1.0,
        "snapshot": {"mode": "no_data"},  # only the latency workload: not the rows written before
    }
    proc, _ = daemon(config, workdir, slot)
    try:
        time.sleep(3)
        return latency_samples(dsn, bootstrap, f"{prefix}.{TABLE}", seconds, rate)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def latency_samples(
    dsn: str, bootstrap: str, topic: str, seconds: float, rate: int, first_id: int = 10_000_000_000
) -> list[float]:
    """Milliseconds from commit (``source.ts_ms``) to a consumer seeing the record, for ``rate`` single-row
    transactions a second over ``seconds`` (ids from ``first_id``), with a connector already streaming into
    ``topic``; until the topic has been quiet for 3 s after the last write."""
    samples: list[float] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-latency",
            "fetch.wait.max.ms": 5,
            "auto.offset.reset": "latest",
        }
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
            i = first_id
            interval = 1.0 / rate
            next_at = time.perf_counter()
            end = next_at + seconds
            while time.perf_counter() < end:
                conn.execute("INSERT INTO bench_rows VALUES (%s, 'l', 1, 'c', now(), gen_random_uuid())", (i,))
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
    return samples


# Topic prefixes are unique per invocation: a progress topic left by an earlier run (its table had
# another OID in the database recreated since) would make the daemon snapshot the table again while
# it is being measured.
RUN = time.strftime("%Y%m%d%H%M%S")
PRODUCER: dict[str, object] = {}  # --producer: librdkafka settings for the end-to-end daemons


def slot_part(variant: str) -> str:
    """A variant (``json``, ``avro-typed+headers``) as it appears in slot names and topic prefixes."""
    return variant.replace("-", "_").replace("+headers", "_h")


def drop_topics(admin: AdminClient, prefix: str, spare: str | None = None) -> None:
    """Delete every topic whose name starts with ``prefix`` (and not with ``spare``): a run's gigabytes left on
    the broker weigh on the runs after it (page cache, the broker's files)."""
    topics = admin.list_topics(timeout=30).topics
    names = [t for t in topics if t.startswith(prefix) and not (spare and t.startswith(spare))]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result()


def drop_bench_topics(bootstrap: str) -> None:
    """Delete the topics earlier invocations left (a 1M-row run leaves ~1 GB per format)."""
    drop_topics(AdminClient({"bootstrap.servers": bootstrap}), "bench_", spare=f"bench_{RUN}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=15.0)
    parser.add_argument("--rate", type=int, default=1000, help="transactions per second for the latency run")
    parser.add_argument("--ceiling-runs", type=int, default=3, help="runs of the producer alone (0: skip)")
    parser.add_argument(
        "--formats",
        default="json,avro",
        help="comma-separated: json, avro, and json-typed / avro-typed (decoder.render_rows false)",
    )
    parser.add_argument(
        "--position-headers",
        default="off",
        help="comma-separated on/off: each format's daemon with kafka.position_headers on and/or off (default off)",
    )
    parser.add_argument(
        "--big-transaction", type=int, default=1_000_000, help="rows of the one-transaction RSS run (0: skip)"
    )
    add_producer_option(parser, "the end-to-end daemons")
    args = parser.parse_args()
    PRODUCER.update(producer_settings(parser, args.producer))

    switches = args.position_headers.split(",")
    if not switches or not set(switches) <= {"on", "off"}:
        parser.error(f"--position-headers {args.position_headers!r}: expected on, off or on,off")
    # each format with each header setting: "json" (headers off), "json+headers" (on)
    formats = [f + ("+headers" if h == "on" else "") for f in args.formats.split(",") for h in switches]
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
        + [f"bench_recv_{i}" for i in runs]
        + [f"bench_{slot_part(f)}_{i}" for f in formats for i in runs],
    )
    proto, _ = protocol_for(server_version(dsn), streaming=False)
    # What `cdc run` decodes for the JSON format: rows rendered straight to JSON text (decoder.render_rows).
    json_rendering = JsonSerializer(JsonSettings(topic_prefix="bench", database=DB), lambda topic: 3).row_rendering
    t0 = time.perf_counter()
    target = str(write_rows(dsn, args.rows, 1000))
    print(f"workload: {args.rows} rows in {args.rows // 1000} transactions written in {time.perf_counter() - t0:.1f}s")

    workdir = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    meter = Services()
    dec_rates: list[float] = []
    rdec_rates: list[float] = []
    recv_rates: list[float] = []
    e2e_rss: dict[str, list[float]] = {f: [] for f in formats}
    e2e_rates: dict[str, list[float]] = {f: [] for f in formats}
    dec_cpu: list[dict[str, float]] = []
    e2e_cpu: dict[str, list[dict[str, float]]] = {f: [] for f in formats}
    e2e_main: dict[str, list[float]] = {f: [] for f in formats}
    for i in runs:
        before = {"reader": self_cpu()} | meter.read()
        seconds, rows = read_with_cdc(dsn, f"bench_dec_{i}", Lsn.parse(target))
        reader = self_cpu()
        wait_released(dsn, f"bench_dec_{i}")  # the walsender's CPU is counted once the server reaped it
        after = {"reader": reader} | meter.read()
        assert rows == args.rows, f"decoded {rows} rows, expected {args.rows}"
        dec_cpu.append(spent(before, after))
        rate = rows / seconds
        dec_rates.append(rate)
        seconds, rows = read_with_cdc(dsn, f"bench_rdec_{i}", Lsn.parse(target), TableRenderer(json_rendering))
        assert rows == args.rows, f"decoded {rows} rows, expected {args.rows}"
        rdec_rates.append(rows / seconds)
        recv_rates.append(args.rows / read_with_pg_recvlogical(dsn, f"bench_recv_{i}", Lsn.parse(target), proto))
        line = (
            f"run {i + 1}: decoder-only {rate:,.0f} rows/s (rendering JSON {rows / seconds:,.0f}), "
            f"pg_recvlogical {recv_rates[-1]:,.0f}"
        )
        for fmt in formats if i % 2 == 0 else formats[::-1]:  # alternated: no variant always runs first
            elapsed, cpu, main, rss = end_to_end(
                dsn,
                endpoints.kafka_bootstrap,
                f"bench_{slot_part(fmt)}_{i}",
                target,
                workdir,
                fmt.removesuffix("+headers"),
                endpoints.schema_registry_url,
                meter,
                fmt.endswith("+headers"),
            )
            e2e_rates[fmt].append(args.rows / elapsed)
            e2e_cpu[fmt].append(cpu)
            e2e_main[fmt].append(main)
            e2e_rss[fmt].append(rss)
            line += f", end-to-end {fmt} {args.rows / elapsed:,.0f} rows/s"
        print(line)
    dec = statistics.median(dec_rates)
    rdec = statistics.median(rdec_rates)
    recv = statistics.median(recv_rates)
    print(f"median decoder-only: {dec:,.0f} rows/s (typed events); rendering JSON rows: {rdec:,.0f} rows/s")
    print(f"median pg_recvlogical -f /dev/null: {recv:,.0f} rows/s; decoder-only / pg_recvlogical {dec / recv:.2f}")
    for fmt in formats:
        e2e = statistics.median(e2e_rates[fmt])
        print(
            f"median end-to-end {fmt} (acks=all, idempotent): {e2e:,.0f} rows/s; ratio to decoder-only {e2e / dec:.2f} "
            f"(target >= 0.60); to the rendering decoder {e2e / rdec:.2f}; to pg_recvlogical {e2e / recv:.2f}; "
            f"peak RSS {statistics.median(e2e_rss[fmt]):.0f} MB (median)"
        )
    for fmt in formats:
        if fmt.endswith("+headers") and fmt.removesuffix("+headers") in e2e_rates:
            on, off = statistics.median(e2e_rates[fmt]), statistics.median(e2e_rates[fmt.removesuffix("+headers")])
            pairs = [b / a for a, b in zip(e2e_rates[fmt], e2e_rates[fmt.removesuffix("+headers")], strict=True)]
            print(
                f"position headers off / on, {fmt.removesuffix('+headers')}: medians {off / on:.3f}; "
                f"per run {', '.join(f'{r:.3f}' for r in pairs)}"
            )

    # Where the CPU went, per row (medians of the runs, component by component).
    def median_cpu(samples: list[dict[str, float]]) -> dict[str, float]:
        return {name: statistics.median(s[name] for s in samples) for name in samples[0]}

    cores = os.cpu_count() or 1
    dec_parts = median_cpu(dec_cpu)
    print(f"CPU per row, decoder-only: {per_row(dec_parts, args.rows)}")
    for fmt in formats:
        parts = median_cpu(e2e_cpu[fmt])
        busy = sum(parts.values()) / args.rows * statistics.median(e2e_rates[fmt])
        main = statistics.median(e2e_main[fmt]) / args.rows
        print(
            f"CPU per row, end-to-end {fmt}: {per_row(parts, args.rows)} ({busy:.2f} of {cores} cores busy); "
            f"the daemon's main thread {main * 1e6:.1f} µs"
        )
        # No rearrangement of this work over threads or processes (hand-over costs nothing, every core
        # always busy) goes faster than its CPU spread over all cores: an upper bound for any design
        # that does the same work per row, the daemon's current work included.
        total = sum(parts.values()) / args.rows
        print(
            f"  all of it spread perfectly over {cores} cores: at most {cores / total:,.0f} rows/s = "
            f"{cores / total / dec:.2f} of decoder-only (target >= 0.60); one thread doing the daemon's main-thread "
            f"work: at most {1 / main:,.0f} rows/s = {1 / main / dec:.2f}"
        )
    sampled = next((f for f in ("json+headers", "json") if f in formats), None)
    if sampled is not None and args.ceiling_runs:
        topic = f"bench_{RUN}_bench_{slot_part(sampled)}_0.{TABLE}"
        print(f"producer alone: the records of {sampled} (position headers {'on' if '+' in sampled else 'off'})")
        records = sample_records(endpoints.kafka_bootstrap, topic, min(args.rows, 100_000))
        results = [
            producer_ceiling(endpoints.kafka_bootstrap, records, args.rows, meter) for _ in range(args.ceiling_runs)
        ]
        ceiling = statistics.median(rate for rate, _, _ in results)
        prod_parts = median_cpu([cpu for _, cpu, _ in results])
        prod_main = statistics.median(main for _, _, main in results) / args.rows
        print(
            f"producer alone (the daemon's JSON records, its delivery, no database): median {ceiling:,.0f} rows/s "
            f"({', '.join(f'{rate:,.0f}' for rate, _, _ in results)}); CPU per row: {per_row(prod_parts, args.rows)}; "
            f"its main thread {prod_main * 1e6:.1f} µs"
        )
        floor = (dec_parts["reader"] + dec_parts["server"] + prod_parts["producer"] + prod_parts["broker"]) / args.rows
        bound = cores / floor
        print(
            f"least CPU per row of decoding plus producing (reader + server of decoder-only, producer + broker of "
            f"the producer alone): {floor * 1e6:.1f} µs -> at most {bound:,.0f} rows/s on {cores} cores with "
            f"perfect parallelism and no serialization = {bound / dec:.2f} of decoder-only (target >= 0.60)"
        )
        one_thread = dec_parts["reader"] / args.rows + prod_main
        print(
            f"one Python thread decoding and producing (the decoder-only reader's CPU + the producer's main thread): "
            f"{one_thread * 1e6:.1f} µs per row -> at most {1 / one_thread:,.0f} rows/s = "
            f"{1 / one_thread / dec:.2f} of decoder-only, serialization not counted"
        )

    if args.big_transaction:
        seconds, rss = big_transaction(dsn, endpoints.kafka_bootstrap, workdir, args.big_transaction, meter)
        print(
            f"one transaction of {args.big_transaction:,} rows (JSON, default settings): {seconds:.1f}s to confirmed, "
            f"{args.big_transaction / seconds:,.0f} rows/s; the daemon's peak RSS {rss:.0f} MB (target < 200 MB)"
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
