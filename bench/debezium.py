"""The daemon beside Debezium's PostgreSQL connector, on the same machine, broker and WAL (#21).

One command: ``.venv/bin/python bench/debezium.py`` (``--rows 100000 --runs 1`` for a quick run).

Slots are created first (two per run, at the same point), then one workload of ``--rows`` inserts of
``decoder.py``'s 6-column row in 1,000-row transactions is written, so both readers catch up over exactly
the same WAL. Per run, one after the other (the order alternates from run to run):

- the daemon: ``cdc run``, JSON, its default settings (``e2e.py``'s configuration: 3 partitions,
  ``snapshot.mode: no_data``), from the moment the process is started;
- Debezium: its PostgreSQL connector (``cdc.dev.connect``: Debezium 3.3.1.Final in a Kafka Connect
  standalone worker of the broker's version, the JVM options Kafka ships) with ``plugin.name=pgoutput``,
  its own slot, the same publication, no snapshot at all (``connect.postgres_source_config``: it streams from
  its slot's position) and the JSON converter without schemas, from
  the moment the connector is added to a worker that is already up (the JVM's start is not counted).

Both are timed until the records in their topic (the sum of the partitions' high watermarks, read every
20 ms: acknowledged with acks=all) reach ``--rows``. That is the figure compared. Debezium confirms its
slot only when Connect flushes its offsets, so the slot's confirmed LSN is no measure of it; it is printed
beside (``slot s``), for the daemon it is ``e2e.py``'s measure. Also the rate from 10% to 100% of the
records (as the 2026-11-24 baseline was counted: start-up excluded), and the CPU a row of the connector's
process (the daemon; the Connect JVM), the Postgres server and the broker, from ``/proc`` (``cpu.py``),
over that 10%-100% window and from the start to N records. Medians of ``--runs``, and the ratios daemon / Debezium.

Then (``--latency-seconds``, 0 to skip) a latency run of each: 1,000 single-row transactions a second,
commit (``source.ts_ms``) to a consumer seeing the record (``e2e.py``'s measure), each on a slot of its own
made just before it starts, with its default settings (Debezium's ``poll.interval.ms`` is 500).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import structlog
from confluent_kafka import Consumer, KafkaException, TopicPartition

from cdc import dev
from cdc.dev import connect
from cdc.sink.kafka import TopicSpec, admin_client, ensure_topics
from cpu import Services, process_cpu  # bench/cpu.py
from decoder import PUBLICATION, TABLE, create_slots, setup_database, write_rows  # bench/decoder.py
from e2e import RUN, daemon, drop_bench_topics, latency_samples, wait_released  # bench/e2e.py

log = structlog.get_logger("bench.debezium")
POLL_S = 0.02
TIMEOUT_S = 900.0
SYSTEMS = ("daemon", "debezium")


@dataclass(frozen=True, slots=True)
class Run:
    """One reader over the whole workload. Times in seconds from the start (process or connector)."""

    system: str
    rows: int
    active: float  # the slot became active
    tenth: float  # 10% of the rows acknowledged
    done: float  # all of them
    confirmed: float | None  # the slot's confirmed LSN passed the workload's end (None: not within the wait)
    cpu_window: dict[str, float]  # CPU seconds from 10% to 100%: the connector's process, server, broker
    cpu_whole: dict[str, float]  # the same from the start to 100%

    @property
    def rate(self) -> float:
        return self.rows / self.done

    @property
    def rate_window(self) -> float:
        return (self.rows - self.rows // 10) / max(self.done - self.tenth, POLL_S)  # both seen in one poll: its length

    def per_row(self, name: str) -> float:
        """µs of CPU a row over the 10%-100% window."""
        return self.cpu_window[name] / (self.rows - self.rows // 10) * 1e6

    def per_row_whole(self, name: str) -> float:
        """µs of CPU a row from the start to N records."""
        return self.cpu_whole[name] / self.rows * 1e6


class Records:
    """How many records a topic holds: the sum of its partitions' high watermarks (0 while it does not exist)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-count-{RUN}"})
        self._topic = topic
        self._parts: list[TopicPartition] = []

    def count(self) -> int:
        if not self._parts:
            meta = self._consumer.list_topics(self._topic, timeout=10).topics.get(self._topic)
            if meta is None or meta.error is not None or not meta.partitions:
                return 0
            self._parts = [TopicPartition(self._topic, p) for p in meta.partitions]
        try:
            return sum(self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in self._parts)
        except KafkaException:
            return 0  # the partitions' leaders not elected yet

    def close(self) -> None:
        self._consumer.close()


def slot_state(conn: psycopg.Connection[tuple[object, ...]], slot: str, target: str) -> tuple[bool, bool]:
    """(active, confirmed past ``target``)."""
    row = conn.execute(
        "SELECT active, confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
        (target, slot),
    ).fetchone()
    return (bool(row[0]), bool(row[1])) if row else (False, False)


def follow(
    system: str,
    dsn: str,
    slot: str,
    target: str,
    records: Records,
    rows: int,
    pid: int,
    meter: Services,
    started: float,
    before: dict[str, float],
    failed: Callable[[], str | None],
) -> Run:
    """Watch a reader that was started at ``started`` (perf_counter; ``before``: the CPU seconds of its process,
    the server and the broker then) until its topic holds ``rows`` records, then a while longer for its
    slot's confirmation."""
    conn = psycopg.connect(dsn, autocommit=True)  # one session: a backend forked per poll would cost server CPU
    try:
        return _follow(system, conn, slot, target, records, rows, pid, meter, started, before, failed)
    finally:
        conn.close()


def _follow(
    system: str,
    conn: psycopg.Connection[tuple[object, ...]],
    slot: str,
    target: str,
    records: Records,
    rows: int,
    pid: int,
    meter: Services,
    started: float,
    before: dict[str, float],
    failed: Callable[[], str | None],
) -> Run:
    active = tenth = None
    at_tenth: dict[str, float] = {}
    deadline = time.monotonic() + TIMEOUT_S
    polls = 0
    while True:
        if time.monotonic() > deadline:
            raise SystemExit(f"{system}: {records.count()} of {rows} records after {TIMEOUT_S:.0f}s")
        # once a second: asking Connect's REST API every poll would add to the JVM's measured CPU
        if polls % 50 == 0 and (why := failed()) is not None:
            raise SystemExit(f"{system} failed:\n{why}")
        polls += 1
        now = time.perf_counter()
        if active is None and slot_state(conn, slot, target)[0]:
            active = now - started
        n = records.count()
        if tenth is None and n >= rows // 10:
            tenth = time.perf_counter() - started
            at_tenth = {"process": process_cpu(pid)} | meter.read()
        if n >= rows:
            done = time.perf_counter() - started
            at_done = {"process": process_cpu(pid)} | meter.read()
            break
        time.sleep(POLL_S)
    if n != rows:
        log.warning("bench.records_beyond_the_workload", system=system, records=n, rows=rows)
    confirmed = None
    wait_until = time.monotonic() + 15  # Connect flushes offsets every second (cdc.dev.connect's worker)
    while time.monotonic() < wait_until:
        if slot_state(conn, slot, target)[1]:
            confirmed = time.perf_counter() - started
            break
        time.sleep(POLL_S)
    return Run(
        system,
        rows,
        active if active is not None else done,
        tenth if tenth is not None else 0.0,
        done,
        confirmed,
        {name: at_done[name] - at_tenth[name] for name in at_done},
        {name: at_done[name] - before[name] for name in at_done},
    )


def daemon_config(dsn: str, bootstrap: str, slot: str, prefix: str) -> dict[str, object]:
    """``e2e.py``'s JSON daemon: the default settings, streaming only (the slot predates the workload)."""
    return {
        "source": {"dsn": dsn, "slot": slot, "publication": PUBLICATION},
        "tables": [TABLE],
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3},
        "topic_prefix": prefix,
        "format": "json",
        "http": {"enabled": False},
        "status_interval_s": 1.0,
        "snapshot": {"mode": "no_data"},
    }


def run_daemon(dsn: str, bootstrap: str, slot: str, target: str, rows: int, workdir: Path, meter: Services) -> Run:
    prefix = f"bench_{RUN}_{slot}"
    records = Records(bootstrap, f"{prefix}.{TABLE}")
    before = {"process": 0.0} | meter.read()
    started = time.perf_counter()
    proc, output = daemon(daemon_config(dsn, bootstrap, slot, prefix), workdir, slot)
    try:

        def failed() -> str | None:
            return None if proc.poll() is None else output.read_text()[-4000:]

        return follow("daemon", dsn, slot, target, records, rows, proc.pid, meter, started, before, failed)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        records.close()
        wait_released(dsn, slot)


def start_worker(bootstrap: str, workdir: Path) -> connect.ConnectWorker:
    plugins = [connect.postgres_plugin_path(log)]
    return connect.ConnectWorker(workdir, bootstrap, log, plugins=plugins, jvm=connect.SHIPPED_JVM).start()


def run_debezium(dsn: str, bootstrap: str, slot: str, target: str, rows: int, workdir: Path, meter: Services) -> Run:
    prefix = f"bench_{RUN}_{slot}"
    topic = f"{prefix}.{TABLE}"
    # the daemon's topic layout: 3 partitions, compacted (Connect would otherwise leave it to the broker's defaults)
    ensure_topics(admin_client(bootstrap, {}), [TopicSpec(topic, 3, 1)])
    records = Records(bootstrap, topic)
    worker = start_worker(bootstrap, workdir / slot)
    assert worker.pid is not None
    name = connect.unique_name(slot)
    try:
        before = {"process": process_cpu(worker.pid)} | meter.read()
        started = time.perf_counter()
        worker.add_connector(
            name,
            connect.postgres_source_config(
                dsn,
                slot=slot,
                publication=PUBLICATION,
                tables=[TABLE],
                topic_prefix=prefix,
            ),
        )

        def failed() -> str | None:
            trace = worker.failure(name)
            return None if trace is None else f"{trace}\n{worker.tail()}"

        return follow("debezium", dsn, slot, target, records, rows, worker.pid, meter, started, before, failed)
    finally:
        worker.stop()
        records.close()
        wait_released(dsn, slot)


def latency_of(
    system: str, dsn: str, bootstrap: str, workdir: Path, seconds: float, rate: int, first_id: int
) -> list[float]:
    slot = f"bench_lat_{system}"
    create_slots(dsn, [slot])  # after everything written so far: only the latency workload is read
    prefix = f"bench_{RUN}_{slot}"
    topic = f"{prefix}.{TABLE}"
    if system == "daemon":
        proc, _ = daemon(daemon_config(dsn, bootstrap, slot, prefix), workdir, slot)
        try:
            time.sleep(3)
            return latency_samples(dsn, bootstrap, topic, seconds, rate, first_id)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    ensure_topics(admin_client(bootstrap, {}), [TopicSpec(topic, 3, 1)])
    worker = start_worker(bootstrap, workdir / slot)
    try:
        name = connect.unique_name(slot)
        worker.add_connector(
            name,
            connect.postgres_source_config(
                dsn,
                slot=slot,
                publication=PUBLICATION,
                tables=[TABLE],
                topic_prefix=prefix,
            ),
        )
        deadline = time.monotonic() + 120
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not slot_state(conn, slot, "0/0")[0]:
                if time.monotonic() > deadline or worker.failure(name):
                    raise SystemExit(f"Debezium did not start streaming:\n{worker.failure(name)}\n{worker.tail()}")
                time.sleep(0.1)
        time.sleep(3)
        return latency_samples(dsn, bootstrap, topic, seconds, rate, first_id)
    finally:
        worker.stop()


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=15.0, help="per system; 0 skips the latency runs")
    parser.add_argument("--rate", type=int, default=1000, help="transactions per second for the latency runs")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up
    if args.rows < 10:
        parser.error("--rows must be at least 10")

    endpoints = dev.up(dev.default_state_dir(), registry=False)
    bootstrap = endpoints.kafka_bootstrap
    connect.postgres_plugin_path(log)  # fetched before anything is timed
    dsn = setup_database(endpoints.postgres_dsn)
    drop_bench_topics(bootstrap)
    runs = range(args.runs)
    create_slots(dsn, [f"bench_{system}_{i}" for i in runs for system in SYSTEMS])
    t0 = time.perf_counter()
    target = str(write_rows(dsn, args.rows, 1000))
    print(
        f"workload: {args.rows:,} rows in {-(-args.rows // 1000):,} transactions written in "
        f"{time.perf_counter() - t0:.1f}s; {os.cpu_count()} CPUs; Debezium {connect.postgres_source_version()} "
        f"in Kafka Connect {connect.worker_version()}"
    )

    workdir = Path(tempfile.mkdtemp(prefix="cdc-bench-dbz-"))
    meter = Services()
    results: dict[str, list[Run]] = {system: [] for system in SYSTEMS}
    header = (
        "run",
        "system",
        "slot active s",
        "records = N s",
        "slot confirmed s",
        "rows/s from start",
        "rows/s 10%-100%",
        "process µs/row",
        "server µs/row",
        "broker µs/row",
        "process µs/row from start",
        "server µs/row from start",
        "broker µs/row from start",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for i in runs:
        for system in SYSTEMS if i % 2 == 0 else SYSTEMS[::-1]:
            measure = run_daemon if system == "daemon" else run_debezium
            r = measure(dsn, bootstrap, f"bench_{system}_{i}", target, args.rows, workdir, meter)
            results[system].append(r)
            row = (
                str(i + 1),
                system,
                fmt_s(r.active),
                fmt_s(r.done),
                fmt_s(r.confirmed),
                f"{r.rate:,.0f}",
                f"{r.rate_window:,.0f}",
                f"{r.per_row('process'):.1f}",
                f"{r.per_row('server'):.1f}",
                f"{r.per_row('broker'):.1f}",
                f"{r.per_row_whole('process'):.1f}",
                f"{r.per_row_whole('server'):.1f}",
                f"{r.per_row_whole('broker'):.1f}",
            )
            print("| " + " | ".join(row) + " |")

    def median(system: str, figure: Callable[[Run], float]) -> float:
        return statistics.median(figure(r) for r in results[system])

    print(f"\nmedians of {args.runs} run(s), {args.rows:,} rows; records counted in each topic (acknowledged)")
    print("| | daemon | Debezium | daemon / Debezium |")
    print("|---|---|---|---|")
    figures: list[tuple[str, Callable[[Run], float], str]] = [
        ("rows/s, start to N records", lambda r: r.rate, ",.0f"),
        ("rows/s, 10% to 100% of the records", lambda r: r.rate_window, ",.0f"),
        ("CPU µs/row of the connector's process, 10%-100%", lambda r: r.per_row("process"), ".1f"),
        ("CPU µs/row of the Postgres server, 10%-100%", lambda r: r.per_row("server"), ".1f"),
        ("CPU µs/row of the broker, 10%-100%", lambda r: r.per_row("broker"), ".1f"),
        ("CPU µs/row of the connector's process, start to N", lambda r: r.per_row_whole("process"), ".1f"),
        ("CPU µs/row of the Postgres server, start to N", lambda r: r.per_row_whole("server"), ".1f"),
        ("CPU µs/row of the broker, start to N", lambda r: r.per_row_whole("broker"), ".1f"),
    ]
    for label, figure, spec in figures:
        a, b = median("daemon", figure), median("debezium", figure)
        print(f"| {label} | {a:{spec}} | {b:{spec}} | {a / b:.2f} |")

    if args.latency_seconds > 0:
        print(f"\nlatency, commit -> visible to a consumer, {args.rate} tx/s over {args.latency_seconds:.0f}s each")
        print("| system | n | p50 ms | p99 ms | max ms |")
        print("|---|---|---|---|---|")
        for n, system in enumerate(SYSTEMS):
            first_id = 10_000_000_000 + n * 1_000_000_000
            samples = latency_of(system, dsn, bootstrap, workdir, args.latency_seconds, args.rate, first_id)
            if len(samples) < 2:
                print(f"| {system} | {len(samples)} | - | - | - |")
                continue
            q = statistics.quantiles(samples, n=100)
            print(f"| {system} | {len(samples)} | {q[49]:.1f} | {q[98]:.1f} | {max(samples):.1f} |")

    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        slots = conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'bench\\_%%'").fetchall()
        for (slot,) in slots:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
