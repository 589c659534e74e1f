"""Benchmark: the warehouse rebuild on a Spark standalone cluster, one worker against two (#39).

One command::

    .venv/bin/python bench/spark_cluster.py                       # 1,000,000 records, 3 runs, 1 then 2 workers
    .venv/bin/python bench/spark_cluster.py --records 200000 --runs 1

It starts the local services (``cdc.dev``, state in ``.cdc-dev/bench``) unless ``--bootstrap`` is given, and
produces bench/spark_rebuild.py's synthetic topic (its schema history, inserts, updates, deletes with their
tombstones, truncate markers) under the prefix ``cluster<records>`` (reused by later runs with the same
``--records``). Then, for each worker count of ``--workers`` (default 1 then 2): a standalone master and
that many workers from the installed pyspark (``--cores`` and ``--worker-memory`` each, loopback; see
tests/support/spark_cluster.py), and this process as the driver (client mode). Per run: a plain count of the
topic, then the warehouse rebuild into a fresh directory. It prints the median of the runs for each worker
count, the executors that ran the rebuild's tasks (from the application's event log), and the rebuild's
speed-up from the first worker count to the last.

Each worker adds executor cores (``--cores`` each): two workers of one core are twice the cores of one. On
a machine with fewer cores than the workers, the driver and the Kafka broker beside them, expect no speed-up.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "spark"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from spark_rebuild import produce, publish_history
from tests.support.spark_cluster import event_log_conf, standalone_cluster, tasks_by_executor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4, help="of the topic (the read's tasks)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts, in order")
    parser.add_argument("--cores", type=int, default=1, help="per worker")
    parser.add_argument("--worker-memory", default="2g")
    parser.add_argument("--executor-memory", default="1536m")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--bootstrap", help="an existing Kafka (default: start the local dev services)")
    args = parser.parse_args(argv)

    from cdc_views.jobs import JobConfig, rebuild
    from cdc_views.reader import KafkaSource, read_batch
    from cdc_views.session import build_session
    from cdc_views.tables import ColumnShape, Encoding, Kind, TableShape

    bootstrap = args.bootstrap
    if bootstrap is None:
        from cdc import dev

        bootstrap = dev.up(REPO / ".cdc-dev" / "bench").kafka_bootstrap
    prefix = f"cluster{args.records}"
    source = KafkaSource(bootstrap)
    topic = f"{prefix}.public.bench_orders"
    publish_history(bootstrap, prefix)
    if topic not in source.existing_topics():
        produce(bootstrap, prefix, args.records, args.partitions)
    shape = TableShape(
        "public",
        "bench_orders",
        (
            ColumnShape("id", Kind.INT64, "int8"),
            ColumnShape("customer_id", Kind.INT32, "int4"),
            ColumnShape("status", Kind.TEXT, "text"),
            ColumnShape("amount", Kind.DECIMAL, "numeric", 12, 2),
            ColumnShape("placed_at", Kind.TIMESTAMPTZ, "timestamptz", 6),
            ColumnShape("note", Kind.TEXT, "text"),
        ),
        ("id",),
    )

    medians: dict[int, float] = {}
    total = 0
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-cluster-"))
    try:
        for workers in args.workers:
            events = scratch / f"events-{workers}"
            with standalone_cluster(
                scratch / f"cluster-{workers}", workers, cores=args.cores, memory=args.worker_memory
            ) as cluster:
                spark = build_session(
                    f"bench-spark-cluster-{workers}",
                    master=cluster.url,
                    shuffle_partitions=args.shuffle_partitions,
                    conf={
                        "spark.driver.memory": args.driver_memory,
                        "spark.executor.memory": args.executor_memory,
                        **event_log_conf(events),
                    },
                )
                try:
                    counts, rebuilds = [], []
                    for run in range(1, args.runs + 1):
                        t = time.monotonic()
                        total = read_batch(spark, source, [topic]).count()
                        counts.append(time.monotonic() - t)
                        work = scratch / f"warehouse-{workers}-{run}"
                        cfg = JobConfig(source, prefix, {shape.qualified: shape}, work, Encoding())
                        t = time.monotonic()
                        rebuild(spark, cfg, ["warehouse"])
                        rebuilds.append(time.monotonic() - t)
                        shutil.rmtree(work, ignore_errors=True)
                        print(
                            f"  {workers} worker(s), run {run}: count {counts[-1]:.1f} s, rebuild {rebuilds[-1]:.1f} s",
                            flush=True,
                        )
                finally:
                    spark.stop()
            [(_, tasks)] = tasks_by_executor(events)
            medians[workers] = statistics.median(rebuilds)
            print(
                f"{workers} worker(s) x {args.cores} core(s): {total} records; count median "
                f"{statistics.median(counts):.1f} s, rebuild median {medians[workers]:.1f} s "
                f"({total / medians[workers]:,.0f} records/s; runs: {', '.join(f'{r:.1f}' for r in rebuilds)}); "
                f"tasks per executor (counts and rebuilds): {dict(sorted(tasks.items()))}",
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    first, last = args.workers[0], args.workers[-1]
    print(f"rebuild speed-up, {first} -> {last} worker(s): {medians[first] / medians[last]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
