"""Where a rebuild's time goes: each step of the batch job run on its own, with Spark's own metrics per stage.

One command (the topic of ``bench/spark_rebuild.py`` with the same ``--records``, produced if absent)::

    .venv/bin/python bench/spark_stages.py --records 500000 [--plans plans.txt] [--format avro]

Steps, each a Spark job group, timed on the wall clock, in the order the batch job runs them:

* ``count``: the Kafka source alone (``read_batch(...).count()``);
* ``rebuild`` (``--whole``): the batch job itself (``jobs.rebuild`` of the warehouse table into a fresh
  directory), the figure ``bench/spark_rebuild.py`` divides by the count;
* ``read+envelope``: ``envelopes(raw)`` written to Spark's ``noop`` sink (key and envelope parsing);
* ``latest``: ``reduce_topics`` (read, envelope, latest per key), persisted and counted;
* ``decode+check``: ``Changes.of_topics`` (decode ``after`` of the latest records, persisted, the bad-record
  and marker summary job);
* ``delta write``: ``merge_rows`` into a fresh table (a first build: written outright);
* ``compare+merge``: ``merge_rows`` again over that table (the re-run: compare, MERGE only what changed);
* ``view SQL``: the bench's declared view (orders per customer) computed from the changes and written;
* ``index``: a declared tantivy index of the live rows (``id``, ``note`` text, ``status`` facet).

``--parts N`` instead times the parts of the read on their own, into Spark's ``noop`` sink, N rounds (medians
printed): ``count``; the key and value cast to text; ``from_json`` of every value with the envelope's schema,
and with that schema less ``after`` (what a first pass that leaves the row to the decode would parse);
the same and the key's ``from_json`` to a map; ``envelopes()``; ``envelopes()`` then ``latest()``;
``compacted()`` alone, and then ``envelopes()`` and ``latest()`` of the records it keeps (the jobs' read). The
gap between the count and ``from_json`` alone is what any rebuild that parses every record pays (JSON).

Per step: the wall time, how much of it some Spark stage was running (the rest is the driver's: planning,
code generation, Delta's log, Python), and per Spark stage its duration, tasks, executor run and CPU time, GC time,
records read and shuffle bytes, from the Spark UI's REST API. ``--plans FILE`` writes
``explain("formatted")`` of the reduced, decoded and written frames.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "spark"))
sys.path.insert(0, str(REPO / "bench"))

log = structlog.get_logger("bench.spark_stages")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=300) as response:  # a loaded machine answers slowly
        return json.load(response)


class Stages:
    """The Spark UI's REST API of this session: the stages of the jobs of one job group."""

    def __init__(self, spark: Any) -> None:
        self.sc = spark.sparkContext
        self.base = f"{self.sc.uiWebUrl}/api/v1/applications/{self.sc.applicationId}"

    def of_group(self, group: str) -> list[dict[str, Any]]:
        time.sleep(1.0)  # the listener bus delivers the last stage's end asynchronously
        jobs = [j for j in _get(f"{self.base}/jobs") if j.get("jobGroup") == group]
        ids = sorted({s for j in jobs for s in j["stageIds"]})
        out = []
        for stage_id in ids:
            for attempt in _get(f"{self.base}/stages/{stage_id}"):
                if attempt.get("status") != "COMPLETE":
                    continue
                start, end = attempt.get("submissionTime"), attempt.get("completionTime")
                out.append(
                    {
                        "stage": stage_id,
                        "name": attempt["name"].split(" at ")[0],
                        "seconds": _seconds(start, end),
                        "span": (_instant(start), _instant(end)),
                        "tasks": attempt["numTasks"],
                        "run_s": attempt["executorRunTime"] / 1000,
                        "cpu_s": attempt["executorCpuTime"] / 1e9,
                        "gc_s": attempt.get("jvmGcTime", 0) / 1000,
                        "input_records": attempt.get("inputRecords", 0),
                        "shuffle_read_mb": attempt.get("shuffleReadBytes", 0) / 1e6,
                        "shuffle_write_mb": attempt.get("shuffleWriteBytes", 0) / 1e6,
                        "spill_mb": attempt.get("diskBytesSpilled", 0) / 1e6,
                    }
                )
        return out


def _instant(text: str | None) -> float:
    """A Spark UI time (``2026-12-02T07:06:24.123GMT``) as seconds since the epoch; 0 when absent."""
    from datetime import datetime

    if not text:
        return 0.0
    return datetime.strptime(text.replace("GMT", "UTC"), "%Y-%m-%dT%H:%M:%S.%f%Z").timestamp()


def _seconds(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    return _instant(end) - _instant(start)


def busy_seconds(rows: list[dict[str, Any]]) -> float:
    """Wall seconds during which at least one of the stages ran (the union of their spans): the rest of a
    step's wall time is the driver's (planning, code generation, Delta's log, Python)."""
    total, reach = 0.0, 0.0
    for start, end in sorted(r["span"] for r in rows if r["span"][0] and r["span"][1]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--bootstrap")
    parser.add_argument("--registry")
    parser.add_argument("--format", choices=["json", "avro"], default="json")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--plans", type=Path, help="write explain('formatted') of the main frames here")
    parser.add_argument(
        "--skip", default="", help="comma-separated steps to leave out (e.g. index; latest: every step after it)"
    )
    parser.add_argument(
        "--parts", type=int, default=0, help="time the read's parts into the noop sink, this many rounds (JSON)"
    )
    parser.add_argument(
        "--whole",
        action="store_true",
        help="first time the whole batch job (jobs.rebuild of the warehouse table into a fresh directory) as one step",
    )
    args = parser.parse_args(argv)

    import spark_rebuild as bench
    from cdc.declared import DeclaredIndex, DeclaredView, SparkSection
    from cdc.sink.registry import RegistryClient, RegistrySettings
    from cdc_views import jobs
    from cdc_views.reader import Changes, KafkaSource, envelopes, read_batch, reduce_topics, schema_history
    from cdc_views.session import build_session
    from cdc_views.tables import ColumnShape, Encoding, Kind, TableShape
    from cdc_views.warehouse import merge_rows

    bootstrap, registry = args.bootstrap, args.registry
    avro = args.format == "avro"
    if bootstrap is None:
        from cdc import dev

        endpoints = dev.up(REPO / ".cdc-dev" / "bench", registry=avro)
        bootstrap, registry = endpoints.kafka_bootstrap, registry or endpoints.schema_registry_url
    prefix = f"bench{args.records}" + ("avro" if avro else "")
    source = KafkaSource(bootstrap)
    topic = f"{prefix}.public.bench_orders"
    bench.publish_history(bootstrap, prefix)
    if topic not in source.existing_topics():
        bench.produce(bootstrap, prefix, args.records, args.partitions, registry if avro else None)
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
    encoding = Encoding(format=args.format)
    spark = build_session(
        "bench-spark-stages",
        master=args.master,
        shuffle_partitions=args.shuffle_partitions,
        ui=True,
        conf={
            "spark.driver.memory": args.driver_memory,
            "spark.ui.port": "0",
            "spark.ui.retainedJobs": "10000",
            "spark.ui.retainedStages": "10000",
        },
    )
    stages = Stages(spark)
    skip = set(filter(None, args.skip.split(",")))
    client = RegistryClient.from_settings(RegistrySettings(url=registry)) if avro and registry else None
    total = read_batch(spark, source, [topic]).count()  # warm-up: JIT, Kafka consumer pool
    print(
        f"topic {topic} ({args.format}): {total} records; Spark {spark.version}, {args.master}, "
        f"{args.shuffle_partitions} shuffle partitions"
    )
    if args.parts:  # before the warehouse folder and the declarations: it writes nothing
        parts(spark, stages, source, topic, encoding, args.parts)
        spark.stop()
        return 0
    report: list[tuple[str, float, list[dict[str, Any]]]] = []
    work = Path(tempfile.mkdtemp(prefix="bench-stages-"))
    section = SparkSection(
        views=[
            DeclaredView(
                name="orders_per_customer",
                key=["customer_id"],
                sql=(
                    "SELECT customer_id, count(*) AS orders, sum(amount) AS total FROM public_bench_orders GROUP "
                    "BY customer_id"
                ),
            )
        ],
        indexes=[
            DeclaredIndex(
                name="orders",
                id="id",
                sql="SELECT id, note, status FROM public_bench_orders",
                text={"note": 1.0},
                facets=["status"],
            )
        ],
    )
    cfg = jobs.JobConfig(
        source,
        prefix,
        {shape.qualified: shape},
        work,
        encoding,
        registry=RegistrySettings(url=registry) if client else None,
        declared=section,
    )

    def step(name: str, fn: Any) -> Any:
        spark.sparkContext.setJobGroup(name, name)
        t = time.monotonic()
        result = fn()
        seconds = time.monotonic() - t
        report.append((name, seconds, stages.of_group(name)))
        log.info("bench.step", step=name, seconds=round(seconds, 2))
        return result

    try:
        step("count", lambda: read_batch(spark, source, [topic]).count())
        if args.whole:
            whole = jobs.JobConfig(
                source, prefix, {shape.qualified: shape}, work / "whole", encoding, registry=cfg.registry
            )
            step("rebuild", lambda: jobs.rebuild(spark, whole, ["warehouse"]))
        history = schema_history(source, prefix, encoding)
        if "read+envelope" not in skip:
            from cdc_views.reader import avro_schemas

            def envelope_only() -> None:
                raw = read_batch(spark, source, [topic])
                envelopes(raw, encoding, avro_schemas(raw, encoding, client)).write.format("noop").mode(
                    "overwrite"
                ).save()

            step("read+envelope", envelope_only)

        if "latest" not in skip:  # the rest builds on the reduced records

            def reduce() -> Any:
                reduced, schemas = reduce_topics(spark, source, [topic], encoding, client)
                reduced.count()
                return reduced, schemas

            reduced, schemas = step("latest", reduce)
            changes = step(
                "decode+check",
                lambda: Changes.of_topics(reduced, {topic: shape}, encoding, "fail", schemas, history)[topic],
            )
            if args.plans:
                with args.plans.open("w") as out:
                    for title, frame in (
                        ("reduced (read, envelope, latest per key)", reduced),
                        ("decoded latest records", changes.decoded),
                        ("rows written", changes.rows),
                    ):
                        mode = getattr(getattr(spark._jvm.org.apache.spark.sql.execution, "FormattedMode$"), "MODULE$")
                        out.write(f"===== {title}\n{frame._jdf.queryExecution().explainString(mode)}\n")
            path = work / "tables" / shape.qualified
            step("delta write", lambda: merge_rows(spark, path, changes.rows, changes.truncates, full=True))
            if "compare+merge" not in skip:
                step("compare+merge", lambda: merge_rows(spark, path, changes.rows, changes.truncates, full=True))
            frames = {shape.qualified: jobs._source_rows(changes)}
            if "view" not in skip:
                step("view SQL", lambda: jobs._write_view(spark, cfg, section.views[0], frames, job="bench"))
            if "index" not in skip:
                step("index", lambda: jobs._write_index(spark, cfg, section.indexes[0], frames, job="bench"))
            reduced.unpersist()
            changes.unpersist()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\n{'step':<15}{'wall s':>8}  stages (name: seconds, tasks, executor run s / cpu s / gc s, records in, "
        "shuffle read/write MB)"
    )
    for name, seconds, rows in report:
        cpu = sum(r["cpu_s"] for r in rows)
        print(f"{name:<15}{seconds:8.1f}  (stages running {busy_seconds(rows):.1f} s of it; executor cpu {cpu:.1f} s)")
        for r in rows:
            print(
                f"{'':<25}{r['stage']:>4} {r['name']:<28} {r['seconds']:6.1f} s {r['tasks']:>4} tasks  run "
                f"{r['run_s']:6.1f} "
                f"cpu {r['cpu_s']:6.1f} gc {r['gc_s']:5.1f}  in {r['input_records']:>9}  shuffle "
                f"{r['shuffle_read_mb']:7.1f}/"
                f"{r['shuffle_write_mb']:7.1f}  spill {r['spill_mb']:.0f}"
            )
    spark.stop()
    return 0


def parts(spark: Any, stages: Stages, source: Any, topic: str, encoding: Any, rounds: int) -> None:
    """``--parts``: each part of the read into the ``noop`` sink, ``rounds`` times; wall and executor CPU medians."""
    import statistics

    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from cdc_views.envelope import _ENVELOPE
    from cdc_views.reader import compacted, envelopes, latest, read_batch

    def raw() -> Any:
        return read_batch(spark, source, [topic])

    def noop(frame: Any) -> None:
        frame.write.format("noop").mode("overwrite").save()

    value, key = F.col("value").cast("string"), F.col("key").cast("string")
    without_after = StructType([f for f in _ENVELOPE.fields if f.name != "after"])  # what skipping it would save
    variants: dict[str, Callable[[], Any]] = {
        "count": lambda: raw().count(),
        "cast to text": lambda: noop(raw().select(key, value)),
        "from_json envelope": lambda: noop(raw().select(F.from_json(value, _ENVELOPE))),
        "... without after": lambda: noop(raw().select(F.from_json(value, without_after))),
        "+ key from_json map": lambda: noop(
            raw().select(F.from_json(value, _ENVELOPE), F.from_json(key, "map<string,string>"))
        ),
        "envelopes()": lambda: noop(envelopes(raw(), encoding)),
        "envelopes()+latest()": lambda: noop(latest(envelopes(raw(), encoding))),
        "compacted()": lambda: noop(compacted(raw())),
        "compacted()+envelopes()+latest()": lambda: noop(latest(envelopes(compacted(raw()), encoding))),
    }
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for round_ in range(1, rounds + 1):
        for name, run in variants.items():
            group = f"{name} #{round_}"
            spark.sparkContext.setJobGroup(group, group)
            t = time.monotonic()
            run()
            wall = time.monotonic() - t
            cpu = sum(r["cpu_s"] for r in stages.of_group(group))
            seen[name].append((wall, cpu))
            log.info("bench.part", part=name, round=round_, wall_s=round(wall, 2), executor_cpu_s=round(cpu, 2))
    count_wall = statistics.median(w for w, _ in seen["count"])
    print(f"\n{'part (into noop)':<24}{'wall s':>8}{'cpu s':>8}  count's wall / this wall   (medians of {rounds})")
    for name, runs in seen.items():
        wall = statistics.median(w for w, _ in runs)
        print(f"{name:<24}{wall:8.1f}{statistics.median(c for _, c in runs):8.1f}  {count_wall / wall:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
