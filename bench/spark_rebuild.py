"""Benchmark: records/s to rebuild a warehouse table from a change topic, beside simply counting it.

One command::

    .venv/bin/python bench/spark_rebuild.py                      # 5,000,000 records, 3 runs
    .venv/bin/python bench/spark_rebuild.py --records 500000     # a quicker run

It starts the local services (``cdc.dev``, state in ``.cdc-dev/bench``) unless ``--bootstrap`` is
given, publishes the synthetic table's schema history as the daemon's start-up does (its version at
``0/0:0`` on ``<prefix>.__cdc_schema``, through ``cdc.pipeline.history``: the jobs read a plain-JSON
Decimal only at the scale of a version in force), produces a synthetic topic with the connector's
own ``JsonSerializer`` (realistic Debezium envelopes and headers: inserts, updates, deletes with
their tombstones, a truncate marker per partition early on), then, in one Spark session (local
mode, ``--master``), measures per run:

* ``count``: the same reader's batch read of the topic, counted (Kafka source + ``count()``);
* ``rebuild``: the warehouse job for the table (read, classify, latest per key, decode, Delta
  write) into a fresh directory;
* ``rebuild again``: the same job over the table it just wrote (the MERGE path; it changes nothing).

and prints the median of the runs for each, in records/s of the topic. Then the continuous job with a
declared view over the table (orders per customer: count and sum of amounts, key ``customer_id``):
it catches up from offset 0 once (``catch-up``), then, ``--runs`` times, a batch of updates of 1% of
the topic's records is produced and the time for the continuous job to take it in (the table MERGEd,
the declared view recomputed; ``--refresh-fraction``) is measured; the median is printed. The update
batches stay in the topic: a later invocation counts them among the topic's records. The topic is reused by
later runs with the same ``--records`` (``--fresh-topic`` to produce it again).

``--phases rebuild`` or ``--phases refresh`` runs one of the two parts alone (both by default).

``--phases floor`` (not run by default) measures what the rebuild would cost if finding each key's last record
were free: the records ``compacted()`` keeps (what a complete run of Kafka's log cleaner leaves) are copied,
partition for partition, to a second topic (``<prefix>kept.public.bench_orders``, written afresh each time),
then ``--runs`` times: count the topic, rebuild from it, rebuild from the copy, count the copy (the last run
checks that both rebuilds wrote the same rows). It prints
``count + rebuild(kept) - count(kept)``, the rebuild with the compaction's work taken out but the full read kept,
as a rate against the count (the most any compaction could give), and the rebuild's rate over the copy
against its own count (the ratio a user sees once the cleaner has run).

``--format avro`` produces the topic with the connector's ``AvroSerializer`` instead (Confluent wire
format; the local services then include the schema registry, or give ``--registry``) and runs the
jobs with format avro.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import structlog
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "spark"))

from cdc.event import ChangeEvent, Column, Op, PgType, TableSchema, TruncateEvent
from cdc.lsn import Lsn
from cdc.pipeline.history import SchemaHistory, acknowledged_writer
from cdc.schema_history import BEGINNING, topic_for
from cdc.sink.avro import AvroSerializer, AvroSettings
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.kafka import TopicSpec, admin_client, ensure_topics, producer_config
from cdc.sink.records import EventSerializer
from cdc.sink.registry import RegistryClient

log = structlog.get_logger("bench.spark_rebuild")

TABLE = TableSchema(
    "public",
    "bench_orders",
    (
        Column("id", PgType(20, "int8"), key=True, nullable=False),
        Column("customer_id", PgType(23, "int4")),
        Column("status", PgType(25, "text")),
        Column("amount", PgType(1700, "numeric"), modifier=(12 << 16 | 2) + 4),
        Column("placed_at", PgType(1184, "timestamptz")),
        Column("note", PgType(25, "text")),
    ),
)
STATUSES = ("new", "paid", "shipped", "delivered", "cancelled")


def _row(key: int, rng: random.Random, version: int) -> dict[str, object]:
    return {
        "id": key,
        "customer_id": rng.randrange(1, 100_000),
        "status": STATUSES[version % len(STATUSES)],
        "amount": Decimal(rng.randrange(-10_000, 10_000_000)) / 100,
        "placed_at": 1_714_000_000_000_000 + rng.randrange(0, 10**13),
        "note": f"order {key} version {version}",
    }


def _serializer(topic_prefix: str, partitions: int, registry: str | None) -> EventSerializer[Any]:
    if registry is None:
        return JsonSerializer(JsonSettings(topic_prefix=topic_prefix, database="bench"), lambda _t: partitions)
    settings = AvroSettings(topic_prefix=topic_prefix, database="bench")
    return AvroSerializer(settings, lambda _t: partitions, RegistryClient(registry))


def _producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500000,
        }
    )


def _send(producer: Producer, serializer: EventSerializer[Any], event: ChangeEvent | TruncateEvent) -> int:
    sent = 0
    for record in serializer.records(event):
        while True:
            try:
                producer.produce(
                    record.topic,
                    record.value,
                    record.key,
                    partition=record.partition if record.partition is not None else -1,
                    headers=list(record.headers),
                )
                break
            except BufferError:
                producer.poll(0.1)
        sent += 1
    producer.poll(0)
    return sent


def publish_history(bootstrap: str, topic_prefix: str) -> None:
    """The synthetic table's schema history, as the daemon's start-up publishes it (``wiring.prepare``,
    ``SchemaHistory.publish_catalog``): the topic made as ``wiring.topic_specs`` makes it, then a table
    with no version gets its columns at ``0/0:0``, produced and acknowledged before any of its rows.
    Nothing is written when the version is already there (a reused topic)."""
    ensure_topics(admin_client(bootstrap, {}), [TopicSpec(topic_for(topic_prefix), 1, 1)])
    write_now = acknowledged_writer(producer_config(bootstrap, {}, 1_000_000))
    history = SchemaHistory.load(topic_prefix, bootstrap, {}, write_now=write_now)
    version = history.differs(TABLE, BEGINNING)
    if version is not None:
        write_now([history.record(version)])
    log.info("bench.schema_history", topic=history.topic, table=TABLE.qualified, published=version is not None)


def produce_updates(
    bootstrap: str, topic_prefix: str, count: int, keys: int, partitions: int, registry: str | None, seed: int
) -> None:
    """``count`` updates of random keys among the first ``keys`` (a key deleted earlier comes back)."""
    serializer, producer, rng = (
        _serializer(topic_prefix, partitions, registry),
        _producer(bootstrap),
        random.Random(seed),
    )
    lsn = 10**12 + seed * 10**9
    for i in range(count):
        lsn += 64
        key = rng.randrange(1, keys + 1)
        _send(
            producer,
            serializer,
            ChangeEvent(
                Op.UPDATE, TABLE, None, _row(key, rng, 1000 + seed), Lsn(lsn + 32), Lsn(lsn), 10**7 + i, 1, lsn
            ),
        )
    producer.flush(300)


def produce(bootstrap: str, topic_prefix: str, records: int, partitions: int, registry: str | None = None) -> str:
    """The synthetic topic: ~1 key per 4 records (insert, updates, and 1 in 20 keys deleted); Avro with ``registry``."""
    serializer = _serializer(topic_prefix, partitions, registry)
    topic = serializer.topic_for(TABLE)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config={"cleanup.policy": "compact"})])[topic].result(60)
    producer = _producer(bootstrap)
    rng = random.Random(42)
    keys = max(1, records // 4)
    versions = [0] * (keys + 1)
    lsn = 1_000_000
    produced = 0
    next_report = 500_000
    truncated = False
    started = time.monotonic()

    def send(event: ChangeEvent | TruncateEvent) -> None:
        nonlocal produced
        produced += _send(producer, serializer, event)

    while produced < records:
        lsn += 64
        if not truncated and produced >= records // 10:
            send(TruncateEvent((TABLE,), False, False, Lsn(lsn), Lsn(lsn), 7, 1, lsn))
            truncated = True
            continue
        key = rng.randrange(1, keys + 1)
        version = versions[key]
        if version <= 0:  # new, or deleted earlier: (re-)inserted
            op, before, after = Op.CREATE, None, _row(key, rng, 0)
            versions[key] = 1
        elif rng.random() < 0.05:
            op, before, after = Op.DELETE, {"id": key}, None
            versions[key] = -1
        else:
            op, before, after = Op.UPDATE, None, _row(key, rng, version)
            versions[key] = version + 1
        send(ChangeEvent(op, TABLE, before, after, Lsn(lsn + 32), Lsn(lsn), 1000 + produced, 1, lsn))
        if produced >= next_report:
            log.info("bench.producing", records=produced, of=records, seconds=round(time.monotonic() - started, 1))
            next_report += 500_000
    producer.flush(300)
    log.info("bench.produced", topic=topic, records=produced, seconds=round(time.monotonic() - started, 1))
    return topic


def delete_topic(bootstrap: str, source: Any, topic: str) -> None:
    """Delete ``topic`` if it exists, and wait until the broker no longer lists it."""
    if topic not in source.existing_topics():
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a temporary is destroyed before the result
    admin.delete_topics([topic])[topic].result(60)
    while topic in source.existing_topics():
        time.sleep(0.5)


def job_config(
    source: Any, prefix: str, shape: Any, work: Path, args: argparse.Namespace, registry: str | None, **more: Any
) -> Any:
    """The jobs' configuration for the bench's one table under ``prefix``, writing to ``work``."""
    from cdc.sink.registry import RegistrySettings
    from cdc_views.jobs import JobConfig
    from cdc_views.tables import Encoding

    return JobConfig(
        source,
        prefix,
        {shape.qualified: shape},
        work,
        Encoding(format=args.format),
        registry=RegistrySettings(url=registry) if registry else None,
        **more,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--bootstrap", help="an existing Kafka (default: start the local dev services)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--fresh-topic", action="store_true")
    parser.add_argument("--format", choices=["json", "avro"], default="json")
    parser.add_argument("--registry", help="format avro with --bootstrap: the schema registry's URL")
    parser.add_argument(
        "--refresh-fraction",
        type=float,
        default=0.01,
        help="the update batch of the continuous phase, as a share of the records (0: no such phase)",
    )
    parser.add_argument(
        "--phases",
        default="rebuild,refresh",
        help="which phases to run, comma-separated: rebuild (count, rebuild, rebuild again), refresh (the "
        "continuous job's catch-up and update batches), floor (the rebuild of the compacted records alone)",
    )
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    if not phases or phases - {"rebuild", "refresh", "floor"}:
        raise SystemExit(f"error: --phases {args.phases!r}: give rebuild, refresh, floor or several, comma-separated")
    if "floor" in phases and args.format == "avro":  # the copy's topic would need its own registry subjects
        raise SystemExit("error: --phases floor measures format json only; run it without --format avro")

    from cdc_views.reader import KafkaSource, read_batch
    from cdc_views.session import build_session
    from cdc_views.tables import ColumnShape, Kind, TableShape

    bootstrap, registry = args.bootstrap, args.registry
    avro = args.format == "avro"
    if bootstrap is None:
        from cdc import dev

        endpoints = dev.up(REPO / ".cdc-dev" / "bench", registry=avro)
        bootstrap, registry = endpoints.kafka_bootstrap, registry or endpoints.schema_registry_url
    if avro and registry is None:
        raise SystemExit("error: --format avro needs a schema registry (--registry URL with --bootstrap)")
    prefix = f"bench{args.records}" + ("avro" if avro else "")
    source = KafkaSource(bootstrap)
    topic = f"{prefix}.public.bench_orders"
    if args.fresh_topic:
        delete_topic(bootstrap, source, topic)
    publish_history(bootstrap, prefix)
    if topic not in source.existing_topics():
        produce(bootstrap, prefix, args.records, args.partitions, registry if avro else None)

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
    spark = build_session(
        "bench-spark-rebuild",
        master=args.master,
        shuffle_partitions=args.shuffle_partitions,
        conf={"spark.driver.memory": args.driver_memory},
    )
    total = read_batch(spark, source, [topic]).count()
    print(
        f"topic {topic} ({args.format}): {total} records, {args.partitions} partitions; Spark {spark.version}, "
        f"{args.master}"
    )
    if "rebuild" in phases:
        rebuild_phase(spark, source, prefix, shape, topic, total, args, registry if avro else None)
    if args.refresh_fraction > 0 and "refresh" in phases:
        refresh(spark, source, prefix, shape, args, total, registry if avro else None, bootstrap)
    if "floor" in phases:
        floor_phase(spark, source, prefix, shape, topic, args, bootstrap)
    spark.stop()
    return 0


def rebuild_phase(
    spark: Any,
    source: Any,
    prefix: str,
    shape: Any,
    topic: str,
    total: int,
    args: argparse.Namespace,
    registry: str | None,
) -> None:
    """``--runs`` times: count the topic, rebuild the table into a fresh directory, rebuild it again; medians."""
    from cdc_views.jobs import rebuild
    from cdc_views.reader import read_batch

    timings: dict[str, list[float]] = {"count": [], "rebuild": [], "rebuild again": []}
    rows = 0
    for run in range(1, args.runs + 1):
        work = Path(tempfile.mkdtemp(prefix="bench-warehouse-"))
        try:
            cfg = job_config(source, prefix, shape, work, args, registry)
            t = time.monotonic()
            read_batch(spark, source, [topic]).count()
            timings["count"].append(time.monotonic() - t)
            t = time.monotonic()
            rebuild(spark, cfg, ["warehouse"])
            timings["rebuild"].append(time.monotonic() - t)
            t = time.monotonic()
            rebuild(spark, cfg, ["warehouse"])
            timings["rebuild again"].append(time.monotonic() - t)
            rows = spark.read.format("delta").load(str(work / "tables" / shape.qualified)).count()
            log.info("bench.run", run=run, of=args.runs, rows=rows, **{k: round(v[-1], 1) for k, v in timings.items()})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedians of {args.runs} runs, {total} records ({rows} live rows after the rebuild):")
    for name, values in timings.items():
        median = statistics.median(values)
        print(
            f"  {name:<14} {median:8.1f} s  {total / median:12,.0f} records/s   (runs: "
            f"{', '.join(f'{v:.1f}' for v in values)})"
        )
    count_median = statistics.median(timings["count"])
    print(f"  rebuild / count: {count_median / statistics.median(timings['rebuild']):.2f} of the plain count's rate")


def floor_phase(
    spark: Any,
    source: Any,
    prefix: str,
    shape: Any,
    topic: str,
    args: argparse.Namespace,
    bootstrap: str,
) -> None:
    """The rebuild with the compaction's work taken out: over a copy of the records ``compacted()`` keeps, in
    each partition in their order (a truncate marker applies to what comes before it); the table it writes is
    checked equal to the rebuild's of the whole topic. Format json only (``main`` refuses avro)."""
    from cdc_views.jobs import rebuild
    from cdc_views.reader import compacted, read_batch

    kept_prefix = f"{prefix}kept"
    kept_topic = f"{kept_prefix}.public.bench_orders"
    delete_topic(bootstrap, source, kept_topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(topic, timeout=15).topics[topic].partitions)
    admin.create_topics([NewTopic(kept_topic, partitions, 1, config={"cleanup.policy": "compact"})])[kept_topic].result(
        60
    )
    publish_history(bootstrap, kept_prefix)
    (
        compacted(read_batch(spark, source, [topic]))
        .repartition(partitions, "partition")  # one task writes each partition, in offset order:
        .sortWithinPartitions("partition", "offset")  # the producer keeps a partition's order
        .select("key", "value", "headers", "partition")
        .write.format("kafka")
        .options(**source.spark_options())
        .option("topic", kept_topic)
        .save()
    )
    timings: dict[str, list[float]] = {"count": [], "rebuild": [], "rebuild of the kept": [], "count of the kept": []}
    kept = total = 0
    for run in range(1, args.runs + 1):
        work = Path(tempfile.mkdtemp(prefix="bench-warehouse-"))
        try:
            configs = {name: job_config(source, name, shape, work / name, args, None) for name in (prefix, kept_prefix)}
            t = time.monotonic()
            total = read_batch(spark, source, [topic]).count()
            timings["count"].append(time.monotonic() - t)
            t = time.monotonic()
            rebuild(spark, configs[prefix], ["warehouse"])
            timings["rebuild"].append(time.monotonic() - t)
            t = time.monotonic()
            rebuild(spark, configs[kept_prefix], ["warehouse"])
            timings["rebuild of the kept"].append(time.monotonic() - t)
            t = time.monotonic()
            kept = read_batch(spark, source, [kept_topic]).count()
            timings["count of the kept"].append(time.monotonic() - t)
            log.info("bench.floor_run", run=run, of=args.runs, **{k: round(v[-1], 1) for k, v in timings.items()})
            if run == args.runs:  # the copy rebuilds the same table, or its figure means nothing
                whole, copy = (
                    spark.read.format("delta").load(str(work / name / "tables" / shape.qualified))
                    for name in (prefix, kept_prefix)
                )
                columns = [c.name for c in shape.columns]
                differ = whole.select(columns).exceptAll(copy.select(columns)).count()
                differ += copy.select(columns).exceptAll(whole.select(columns)).count()
                rows = whole.count()
                if differ or rows == 0:
                    raise SystemExit(f"error: the rebuild of {kept_topic} differs from the topic's: {differ} rows")
                log.info("bench.floor_checked", rows=rows)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in timings.items()}
    print(f"\nfloor, medians of {args.runs} runs: {total} records, of which compacted() keeps {kept} ({kept_topic}):")
    for name, values in timings.items():
        print(f"  {name:<20} {medians[name]:8.1f} s   (runs: {', '.join(f'{v:.1f}' for v in values)})")
    print(f"  rebuild / count: {medians['count'] / medians['rebuild']:.2f} of the plain count's rate")
    floor = medians["count"] + medians["rebuild of the kept"] - medians["count of the kept"]
    print(
        f"  floor: count + rebuild(kept) - count(kept) = {floor:.1f} s: at most {medians['count'] / floor:.2f} "
        "of the plain count's rate with a compaction that costs nothing"
    )
    ratio = medians["count of the kept"] / medians["rebuild of the kept"]
    print(f"  rebuild / count over the compacted copy: {ratio:.2f}")


def refresh(
    spark: Any,
    source: Any,
    prefix: str,
    shape: Any,
    args: argparse.Namespace,
    total: int,
    registry: str | None,
    bootstrap: str,
) -> None:
    """The continuous job with a declared view: catch up once, then time each 1% update batch taken in."""
    from cdc.declared import DeclaredView, SparkSection
    from cdc_views.jobs import start_continuous

    section = SparkSection(
        views=[
            DeclaredView(
                name="orders_per_customer",
                sql=(
                    "SELECT customer_id, count(*) AS orders, sum(amount) AS total FROM public_bench_orders GROUP "
                    "BY customer_id"
                ),
                key=["customer_id"],
            )
        ]
    )
    batch = max(1, int(total * args.refresh_fraction))
    work = Path(tempfile.mkdtemp(prefix="bench-continuous-"))
    try:
        cfg = job_config(source, prefix, shape, work, args, registry, declared=section)

        def pass_() -> float:
            t = time.monotonic()
            query = start_continuous(spark, cfg, available_now=True)
            query.awaitTermination()
            if query.exception() is not None:
                raise SystemExit(f"error: the continuous job failed: {query.exception()}")
            return time.monotonic() - t

        catch_up = pass_()
        print(f"\ncontinuous job with a declared view ({section.views[0].name}, key customer_id):")
        print(f"  catch-up from offset 0 {catch_up:8.1f} s  {total / catch_up:12,.0f} records/s")
        seconds = []
        for run in range(1, args.runs + 1):
            produce_updates(bootstrap, prefix, batch, max(1, args.records // 4), args.partitions, registry, seed=run)
            seconds.append(pass_())
            log.info("bench.refresh", run=run, of=args.runs, records=batch, seconds=round(seconds[-1], 1))
        view_rows = spark.read.format("delta").load(str(work / "views" / section.views[0].name)).count()
        print(
            f"  a batch of {batch} updates ({args.refresh_fraction:.0%} of the records) taken in, table MERGEd and the "
            f"view ({view_rows} rows) recomputed: median {statistics.median(seconds):.1f} s "
            f"(runs: {', '.join(f'{v:.1f}' for v in seconds)})"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
