"""Benchmark: commit in PostgreSQL to the row in a declared view, with the continuous Spark job.

One command::

    .venv/bin/python bench/spark_latency.py                  # 1,000 transactions/s for 60 s
    .venv/bin/python bench/spark_latency.py --seconds 30     # a quicker run

It starts the local services (``cdc.dev``, state in ``.cdc-dev/bench``, as ``spark_rebuild.py`` does),
makes its own database (``cdc_bench_spark_latency``, dropped and recreated) with one table::

    public.orders (id bigint PRIMARY KEY, customer_id int, amount numeric(12,2), note text)

and runs, all at once:

1. the daemon (``cdc run``, format JSON, no snapshot) streaming the table to ``<prefix>.public.orders``;
2. the continuous job (``cdc_views.jobs.start_continuous`` at its default trigger, ``--interval`` to
   change it) with two declared views: ``orders_latest`` (one row per order, key ``id``: refreshed
   by the keys a micro-batch touched) and ``orders_per_customer`` (count and sum per customer, key
   ``customer_id``: refreshed by the groups a micro-batch touched);
3. a writer process: ``--rate`` single-row transactions a second for ``--seconds`` (each inserts a new
   order; one in ``--update-every`` updates an earlier one instead), noting the wall-clock time each
   insert's COMMIT returned.

Then, for every inserted order, the first version of ``orders_latest`` that holds it is found (Delta
time travel over the view's versions, read after the workload so it costs the job nothing), and the
order's latency is that version's commit file's modification time minus the order's commit time: when
a reader of the view could first see the row. Orders committed in the first ``--warm-up`` seconds are
left out of the steady-state figures (the first micro-batches pay for the JVM's warm-up and build the
views whole). Printed: p50, p90, p99 and max, the writer's achieved rate, the micro-batches'
durations (Structured Streaming's own progress reports) and the machine's load.

``--views`` measures what fewer Delta commits per micro-batch would give: ``keyed`` declares
``orders_latest`` alone, ``none`` declares no view and measures commit to the row in the warehouse
table itself (``tables/public.orders``, MERGEd by every micro-batch). The default, ``both``, is the
configuration above, whose figures are comparable from run to run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import structlog
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "spark"))

log = structlog.get_logger("bench.spark_latency")

DB = "cdc_bench_spark_latency"
TABLE = "public.orders"
PUBLICATION = "bench_spark_latency_pub"
SLOT = "bench_spark_latency"
KEYED_VIEW = "orders_latest"
GROUPED_VIEW = "orders_per_customer"


def setup_database(admin_dsn: str) -> str:
    """The benchmark's own database with its table and publication; the slot of an earlier run dropped."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)):
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=DB)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.orders (id bigint PRIMARY KEY, customer_id int NOT NULL, amount numeric(12,2), "
            "note text)"
        )
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE public.orders")
    return dsn


def start_daemon(dsn: str, bootstrap: str, prefix: str, workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    config = {
        "source": {"dsn": dsn, "slot": SLOT, "publication": PUBLICATION},
        "tables": [TABLE],
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3},
        "topic_prefix": prefix,
        "http": {"enabled": False},
        "status_interval_s": 1.0,
        "snapshot": {"mode": "no_data"},  # the table is empty: the stream is all there is
    }
    path = workdir / "daemon.yaml"
    path.write_text(yaml.safe_dump(config))
    out = workdir / "daemon.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc.cli", "--log-format", "json", "run", "--config", str(path)],
        stdout=open(out, "wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, out


def wait_for(what: str, ready: Any, timeout: float, proc: subprocess.Popen[bytes], out: Path) -> None:
    """Until ``ready()``; SystemExit naming ``what`` (with the daemon's log) on timeout or if the daemon exits."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited before {what}:\n{out.read_text()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {timeout:.0f} s; the daemon's log:\n{out.read_text()}")
        time.sleep(0.2)


def write_load(dsn: str, rate: int, seconds: float, update_every: int, customers: int, out: str) -> None:
    """The writer process: ``rate`` single-row transactions a second, paced on the clock; the inserted ids
    with the wall-clock time (epoch seconds) their COMMIT returned, and the achieved rate, to ``out``."""
    rng = random.Random(7)
    committed: list[tuple[int, float]] = []
    updates = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        interval = 1.0 / rate
        start = time.perf_counter()
        next_at, end = start, start + seconds
        n = 0
        while time.perf_counter() < end:
            n += 1
            if committed and n % update_every == 0:
                conn.execute(
                    "UPDATE public.orders SET amount = amount + 1, note = %s WHERE id = %s",
                    (f"updated {n}", committed[rng.randrange(len(committed))][0]),
                )
                updates += 1
            else:
                order = len(committed) + 1
                conn.execute(
                    "INSERT INTO public.orders VALUES (%s, %s, %s, %s)",
                    (order, rng.randrange(1, customers + 1), rng.randrange(100, 100_000) / 100, f"order {order}"),
                )
                committed.append((order, time.time()))
            next_at += interval
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        elapsed = time.perf_counter() - start
    Path(out).write_text(json.dumps({"committed": committed, "updates": updates, "seconds": elapsed}))


def first_versions(spark: Any, path: Path) -> dict[int, int]:
    """For each id in the Delta table at ``path``: the first version that holds it."""
    from pyspark.sql import functions as F

    latest = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").agg(F.max("version")).first()[0]
    frames = [
        spark.read.format("delta").option("versionAsOf", v).load(str(path)).select("id", F.lit(v).alias("v"))
        for v in range(latest + 1)
    ]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return {int(r[0]): int(r[1]) for r in union.groupBy("id").agg(F.min("v")).collect()}


def version_times(path: Path) -> dict[int, float]:
    """Each version of the Delta table at ``path``: when its commit file was written (epoch seconds)."""
    return {int(p.stem): p.stat().st_mtime for p in (path / "_delta_log").glob("*.json") if p.stem.isdigit()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=1000, help="transactions per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the steady load runs")
    parser.add_argument("--warm-up", type=float, default=10.0, help="seconds of orders left out of the figures")
    parser.add_argument("--interval", type=float, default=None, help="the job's trigger (default: its default)")
    parser.add_argument("--update-every", type=int, default=5, help="one transaction in N updates an earlier order")
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument(
        "--drain-timeout", type=float, default=600.0, help="seconds after the load for the view to hold every order"
    )
    parser.add_argument(
        "--views",
        choices=("both", "keyed", "none"),
        default="both",
        help="the views declared: both (default), orders_latest alone, or none (latency to the warehouse table)",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--bootstrap", help="an existing Kafka (with --dsn; default: start the local dev services)")
    parser.add_argument("--dsn", help="an existing PostgreSQL (admin DSN; the benchmark makes its own database)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the daemon and the slot are cleaned up too

    from delta.tables import DeltaTable

    from cdc.declared import DeclaredView, SparkSection
    from cdc_views.jobs import JobConfig, start_continuous
    from cdc_views.reader import KafkaSource
    from cdc_views.session import build_session
    from cdc_views.tables import read_shapes
    from cdc_views.warehouse import table_path

    bootstrap, admin_dsn = args.bootstrap, args.dsn
    if bootstrap is None or admin_dsn is None:
        from cdc import dev

        endpoints = dev.up(REPO / ".cdc-dev" / "bench")
        bootstrap, admin_dsn = bootstrap or endpoints.kafka_bootstrap, admin_dsn or endpoints.postgres_dsn
    dsn = setup_database(admin_dsn)
    prefix = "benchlat" + time.strftime("%Y%m%d%H%M%S")
    topic = f"{prefix}.{TABLE}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-spark-latency-"))
    warehouse = workdir / "warehouse"
    load_before = os.getloadavg()
    proc, out = start_daemon(dsn, bootstrap, prefix, workdir)
    query = None
    try:
        source = KafkaSource(bootstrap)
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_for(
                "replication connection",
                lambda: bool(
                    (
                        r := conn.execute(
                            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
                        ).fetchone()
                    )
                    and r[0]
                ),
                120,
                proc,
                out,
            )
        wait_for(f"topic {topic}", lambda: topic in source.existing_topics(), 60, proc, out)

        keyed = DeclaredView(name=KEYED_VIEW, sql="SELECT id, customer_id, amount, note FROM public_orders", key=["id"])
        grouped = DeclaredView(
            name=GROUPED_VIEW,
            sql="SELECT customer_id, count(*) AS orders, sum(amount) AS total FROM public_orders GROUP BY customer_id",
            key=["customer_id"],
        )
        declared = {"both": [keyed, grouped], "keyed": [keyed], "none": []}[args.views]
        shapes = read_shapes(dsn, [TABLE])
        cfg = JobConfig(source, prefix, shapes, warehouse, declared=SparkSection(views=declared))
        # where an order's latency is read: the keyed view, or the warehouse table when no view is declared
        target = warehouse / "views" / KEYED_VIEW if declared else table_path(warehouse, shapes[TABLE])
        target_name = KEYED_VIEW if declared else TABLE
        spark = build_session("bench-spark-latency", master=args.master)
        trigger = {} if args.interval is None else {"interval_s": args.interval}
        query = start_continuous(spark, cfg, **trigger)

        committed_file = workdir / "committed.json"
        writer = multiprocessing.get_context("spawn").Process(
            target=write_load,
            args=(dsn, args.rate, args.seconds, args.update_every, args.customers, str(committed_file)),
        )
        writer.start()
        writer.join()
        if writer.exitcode != 0:
            raise SystemExit(f"the writer process failed (exit code {writer.exitcode})")
        load = json.loads(committed_file.read_text())
        committed: dict[int, float] = {int(i): float(t) for i, t in load["committed"]}
        transactions = len(committed) + load["updates"]
        print(
            f"\nload: {transactions} transactions in {load['seconds']:.1f} s "
            f"({transactions / load['seconds']:,.0f}/s of "
            f"{args.rate}/s offered; {len(committed)} inserts, {load['updates']} updates), Spark {spark.version}, "
            f"{args.master}, trigger {args.interval if args.interval is not None else 'default'}, "
            f"views {args.views}",
            flush=True,
        )
        last = max(committed)
        deadline = time.monotonic() + args.drain_timeout
        while True:  # until the target holds the last order
            if query.exception() is not None or not query.isActive:
                raise SystemExit(f"the continuous job stopped: {query.exception() or 'its log says why'}")
            if DeltaTable.isDeltaTable(spark, str(target)) and (
                spark.read.format("delta").load(str(target)).where(f"id = {last}").count() > 0
            ):
                break
            if time.monotonic() > deadline:
                done = [p for p in query.recentProgress if p.get("numInputRows")]
                raise SystemExit(
                    f"order {last} was not in {target_name} within {args.drain_timeout:.0f} s of the load's end "
                    f"({len(done)} micro-batches with input finished; load average {os.getloadavg()[0]:.1f})"
                )
            time.sleep(1.0)
        progress = [p for p in query.recentProgress if p.get("numInputRows")]
        query.stop()
        query = None
        load_after = os.getloadavg()

        versions = first_versions(spark, target)
        times = version_times(target)
        start = min(committed.values())
        all_ms = [(times[versions[i]] - t) * 1000 for i, t in committed.items()]
        steady_ms = [(times[versions[i]] - t) * 1000 for i, t in committed.items() if t - start >= args.warm_up]
        missing = [i for i in committed if i not in versions]
        if missing:
            raise SystemExit(f"{len(missing)} committed orders never appeared in {target_name} (first: {missing[:5]})")
        batches = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
        rows = [p["numInputRows"] for p in progress]
        print(
            f"micro-batches with input: {len(batches)}, seconds median {statistics.median(batches):.1f} "
            f"max {max(batches):.1f}, records median {statistics.median(rows):.0f} max {max(rows)}"
        )
        for name, values in (("after warm-up", steady_ms), ("all orders", all_ms)):
            print(
                f"commit -> row in {target_name} ({name}, {len(values)} orders): p50 "
                f"{percentile(values, 0.5) / 1000:.1f} s, "
                f"p90 {percentile(values, 0.9) / 1000:.1f} s, p99 {percentile(values, 0.99) / 1000:.1f} s, "
                f"max {max(values) / 1000:.1f} s"
            )
        print(
            "load average (1, 5, 15 min): before "
            + ", ".join(f"{v:.2f}" for v in load_before)
            + "; after "
            + ", ".join(f"{v:.2f}" for v in load_after)
        )
        spark.stop()
    finally:
        if query is not None:
            query.stop()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
            )
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
