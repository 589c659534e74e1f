"""The jobs: rebuild the views from offset 0 (batch), or keep them up to date (Structured Streaming).

Layout under the warehouse directory::

    tables/<schema>.<table>/      Delta, one per captured table        (warehouse.py)
    views/orders_enriched/        Delta, orders joined with customers, lines and products
    search/                       tantivy index, one document per order and product
    _checkpoints/stream/          the continuous job's Structured Streaming checkpoint

Batch (``rebuild``): one Kafka read of every topic from the earliest offsets, reduced to the latest
state per key; each table MERGEd into its Delta table (rows the topic no longer has deleted); the
joined view computed from the same state and MERGEd (a row is rewritten only when its content
changed); the search index rebuilt from zero. Running it twice changes nothing.

Continuous (``start_continuous``): the same topics as one stream (so one checkpoint orders all
tables) with ``foreachBatch``: each micro-batch is reduced the same way and MERGEd into the
warehouse tables with the LSN guard (a replayed batch changes nothing); then the orders and
products the batch touched (directly, or through a customer, product or line) are recomputed from
the warehouse tables and replaced in the joined view and the search index. A restart continues
from the checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import structlog
from delta.tables import DeltaTable
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructField, StructType

from cdc.declared import SparkSection
from cdc.sink.registry import RegistryClient, RegistrySettings
from cdc_views import declared
from cdc_views import search as search_index
from cdc_views import views
from cdc_views.reader import (
    META,
    Changes,
    KafkaSource,
    OnBadRecord,
    avro_schemas,
    envelopes,
    latest,
    read_stream,
    reduce_topics,
)
from cdc_views.tables import Encoding, TableShape
from cdc_views.warehouse import ensure_table, merge_rows, table_path, table_schema, written_rows

log = structlog.get_logger("cdc_views.jobs")

View = Literal["warehouse", "orders", "search", "declared"]
ALL_VIEWS: tuple[View, ...] = ("warehouse", "orders", "search", "declared")
FULL_REFRESH_ABOVE = 20_000  # touched entities in one micro-batch above which a view is recomputed whole


@dataclass(frozen=True)
class JobConfig:
    source: KafkaSource
    topic_prefix: str
    tables: Mapping[str, TableShape]
    warehouse: Path
    encoding: Encoding = field(default_factory=Encoding)
    on_bad_record: OnBadRecord = "fail"
    registry: RegistrySettings | None = None  # format avro: where the writer and reader schemas are
    declared: SparkSection = field(default_factory=SparkSection)  # the user's views and indexes (spark: in cdc.yaml)

    def registry_client(self) -> RegistryClient | None:
        return RegistryClient.from_settings(self.registry) if self.registry is not None else None

    def topic(self, name: str) -> str:
        return self.tables[name].topic(self.topic_prefix)

    @property
    def topics(self) -> dict[str, str]:
        return {name: self.topic(name) for name in self.tables}


def orders_view_path(warehouse: Path) -> Path:
    return warehouse / "views" / views.ORDERS_VIEW


def search_path(warehouse: Path) -> Path:
    return warehouse / "search"


def checkpoint_path(warehouse: Path) -> Path:
    return warehouse / "_checkpoints" / "stream"


def _source_rows(changes: Changes) -> DataFrame:
    """The live rows of a table as the changes state them (for views built from the topics)."""
    return changes.rows.where(F.col("_cdc_action") == "upsert").select(*[c.name for c in changes.table.columns])


# --------------------------------------------------------------------------- keyed views


def _row_hash(columns: Sequence[str]) -> Column:
    return F.sha2(F.to_json(F.struct(*[F.col(c) for c in columns]), views.JSON_OPTIONS), 256)


def merge_view(
    spark: SparkSession, path: Path, rows: DataFrame, key: Sequence[str], *, scope: DataFrame | None = None
) -> int:
    """Make the Delta view at ``path`` hold ``rows`` (one per ``key``); returns keys changed.

    ``scope=None``: ``rows`` is the whole view (keys it lacks are deleted). Otherwise ``scope`` holds
    the keys that were recomputed: those of them missing from ``rows`` are deleted, others untouched.
    A row is rewritten only when its content hash changed, so a re-run commits nothing.
    """
    value_columns = [c for c in rows.columns if c not in key]
    source = rows.withColumn("_view_hash", _row_hash(value_columns))
    if not DeltaTable.isDeltaTable(spark, str(path)):  # a first build: no MERGE needed
        source.write.format("delta").mode("errorifexists").save(str(path))
        return written_rows(spark, path)
    table = ensure_table(spark, path, source.schema)
    target = table.toDF()
    if scope is not None:
        target = target.join(scope.select(*key).distinct(), list(key), "left_semi")
    t = target.select(*[F.col(k).alias(f"_t_{k}") for k in key], F.col("_view_hash").alias("_t_hash"))
    on = [source[k].eqNullSafe(t[f"_t_{k}"]) for k in key]
    joined = source.join(t, on, "full_outer")
    missing = F.col(f"_t_{key[0]}").isNull()
    gone = F.col("_view_hash").isNull()
    changed = joined.where(missing | gone | (F.col("_view_hash") != F.col("_t_hash"))).select(
        *[F.coalesce(F.col(k), F.col(f"_t_{k}")).alias(k) for k in key],
        *[F.col(c) for c in value_columns],
        F.col("_view_hash"),
        gone.alias("_view_delete"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        count = changed.count()
        if count == 0:
            return 0
        condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)
        assignments: dict[str, str | Column] = {f"`{c}`": f"s.`{c}`" for c in source.columns}
        (
            table.alias("t")
            .merge(changed.alias("s"), condition)
            .whenMatchedDelete(condition="s._view_delete")
            .whenMatchedUpdate(condition="t._view_hash <> s._view_hash", set=assignments)
            .whenNotMatchedInsert(condition="NOT s._view_delete", values=assignments)
            .execute()
        )
        return count
    finally:
        changed.unpersist()


def read_view(spark: SparkSession, path: Path) -> DataFrame:
    df = spark.read.format("delta").load(str(path))
    return df.drop("_view_hash")


# --------------------------------------------------------------------------- batch


def rebuild(spark: SparkSession, cfg: JobConfig, wanted: Sequence[View] = ALL_VIEWS) -> dict[str, object]:
    """The batch job: the wanted views rebuilt from every topic's offset 0; a summary of what was written."""
    started = time.monotonic()
    summary: dict[str, object] = {}
    wants_shop = ("orders" in wanted or "search" in wanted) and views.has_shop_tables(cfg.tables)
    wants_declared = "declared" in wanted and bool(cfg.declared.views or cfg.declared.indexes)
    if wants_declared:  # Spark's analyzer over the tables' schemas: a bad declaration stops us before any read
        declared.check(spark, cfg.declared, _empty_frames(spark, cfg))
    everything = "warehouse" in wanted or wants_declared
    names = list(cfg.tables) if everything else [n for n in views.SHOP_TABLES if wants_shop]
    if not names:
        raise ValueError(
            f"nothing to build: views {list(wanted)} need the tables {list(views.SHOP_TABLES)}, or declared "
            "views and indexes (spark.views / spark.indexes in cdc.yaml)"
        )
    topics = {n: cfg.topic(n) for n in names}
    log.info("rebuild.started", views=list(wanted), topics=list(topics.values()), warehouse=str(cfg.warehouse))
    reduced, avro = reduce_topics(spark, cfg.source, list(topics.values()), cfg.encoding, cfg.registry_client())
    changes: dict[str, Changes] = {}
    try:
        by_topic = Changes.of_topics(
            reduced, {topics[n]: cfg.tables[n] for n in names}, cfg.encoding, cfg.on_bad_record, avro
        )
        reduced.unpersist()  # the decoded records are persisted now: the views read those
        changes = {n: by_topic[topics[n]] for n in names}
        summary["bad_records_skipped"] = {n: c.bad_count for n, c in changes.items() if c.bad_count}
        if "warehouse" in wanted:
            for i, (name, change) in enumerate(changes.items(), 1):
                written = merge_rows(spark, table_path(cfg.warehouse, change.table), change.rows, change.truncates, full=True)
                log.info("rebuild.table_written", table=name, n=i, of=len(changes), changed_keys=written)
                summary[f"table {name}"] = written
        if wants_shop:
            frames = {n: _source_rows(changes[n]) for n in views.SHOP_TABLES}
            if "orders" in wanted:
                written = merge_view(spark, orders_view_path(cfg.warehouse), views.orders_enriched(frames), views.ORDERS_VIEW_KEY)
                log.info("rebuild.view_written", view=views.ORDERS_VIEW, changed_keys=written)
                summary[f"view {views.ORDERS_VIEW}"] = written
            if "search" in wanted:
                docs = views.search_documents(frames)
                summary["search documents"] = search_index.build(
                    (r.asDict() for r in docs.toLocalIterator()), search_path(cfg.warehouse)
                )
        if wants_declared:
            summary.update(build_declared(spark, cfg, {n: _source_rows(changes[n]) for n in names}))
    finally:
        reduced.unpersist()
        for change in changes.values():
            change.unpersist()
    summary["seconds"] = round(time.monotonic() - started, 2)
    log.info("rebuild.finished", **{k.replace(" ", "_"): v for k, v in summary.items()})
    return summary


# --------------------------------------------------------------------------- declared views and indexes


def _empty_frames(spark: SparkSession, cfg: JobConfig) -> dict[str, DataFrame]:
    """Every table as an empty frame of its warehouse schema: enough for Spark to analyze a query."""
    frames = {}
    for name, table in cfg.tables.items():
        df = spark.createDataFrame([], table_schema(table, cfg.encoding))
        frames[name] = df.select(*[c for c in df.columns if c not in META])
    return frames


def _warehouse_frames(spark: SparkSession, cfg: JobConfig) -> dict[str, DataFrame]:
    """Every table as the warehouse holds it now (empty for a table not written yet)."""
    frames = _empty_frames(spark, cfg)
    for name, table in cfg.tables.items():
        path = table_path(cfg.warehouse, table)
        if DeltaTable.isDeltaTable(spark, str(path)):
            df = spark.read.format("delta").load(str(path))
            frames[name] = df.select(*[c for c in df.columns if c not in META])
    return frames


def _unique_keys(name: str, rows: DataFrame, key: Sequence[str]) -> None:
    dupes = rows.groupBy(*key).count().where(F.col("count") > 1).limit(3).collect()
    if dupes:
        shown = "; ".join(", ".join(f"{k}={r[k]!r}" for k in key) for r in dupes)
        raise declared.DeclarationError(
            f"view {name}: its key ({', '.join(key)}) is not unique: several rows for {shown}. Fix: declare the "
            "columns that identify a row of the query as its key, or aggregate the query to one row per key"
        )


def build_declared(
    spark: SparkSession, cfg: JobConfig, frames: Mapping[str, DataFrame], *, mode: str = "rebuild"
) -> dict[str, object]:
    """Every declared view MERGEd into its Delta table (whole: only changed rows are rewritten) and every
    declared index built again, from ``frames`` (the tables' live rows)."""
    declared.register(frames)
    summary: dict[str, object] = {}
    for view in cfg.declared.views:
        rows = spark.sql(view.sql)
        _unique_keys(view.name, rows, view.key)
        written = merge_view(spark, declared.view_path(cfg.warehouse, view.name), rows, view.key)
        log.info("view_written", view=view.name, changed_keys=written, mode="full", job=mode,
                 reason="the whole view is recomputed; only rows whose content changed are rewritten")  # fmt: skip
        summary[f"view {view.name}"] = written
    for index in cfg.declared.indexes:
        rows = spark.sql(index.sql)
        count = declared.build_index(index, (r.asDict(recursive=True) for r in rows.toLocalIterator()),
                                     declared.index_path(cfg.warehouse, index.name))  # fmt: skip
        log.info("index_written", index=index.name, documents=count, mode="full", job=mode)
        summary[f"index {index.name}"] = count
    return summary


# --------------------------------------------------------------------------- continuous


@dataclass
class Touched:
    """Orders and products whose view rows or documents a micro-batch may have changed."""

    orders: set[object] = field(default_factory=set)
    products: set[object] = field(default_factory=set)
    customers: set[object] = field(default_factory=set)

    def is_large(self) -> bool:
        return max(len(self.orders), len(self.products), len(self.customers)) > FULL_REFRESH_ABOVE


def _ids(df: DataFrame, column: str) -> set[object]:
    return {r[0] for r in df.select(column).where(F.col(column).isNotNull()).distinct().collect()}


def _touched_rows(spark: SparkSession, cfg: JobConfig, name: str, change: Changes) -> DataFrame:
    """The table's rows a batch changes: their values before (warehouse) and after (batch)."""
    columns = [c.name for c in change.table.columns]
    after = change.rows.where(F.col("_cdc_action") == "upsert").select(*columns)
    path = table_path(cfg.warehouse, change.table)
    if not DeltaTable.isDeltaTable(spark, str(path)):
        return after
    current = spark.read.format("delta").load(str(path))
    truncated: Column = F.lit(False)
    for partition, offset in change.truncates.items():
        truncated = truncated | ((F.col("_cdc_partition") == partition) & (F.col("_cdc_offset") < offset))
    before = current.join(change.rows.select("_cdc_key"), "_cdc_key", "left_semi").unionByName(current.where(truncated))
    present = [c for c in columns if c in before.columns]
    return after.select(*present).unionByName(before.select(*present))


_LINKS: dict[str, tuple[tuple[str, str], ...]] = {  # table -> (column, entity it identifies)
    views.ORDERS: (("id", "orders"), ("customer_id", "customers")),
    views.ORDER_LINES: (("order_id", "orders"), ("product_id", "products")),
    views.PRODUCTS: (("id", "products"),),
    views.CUSTOMERS: (("id", "customers"),),
}


def _touch(touched: Touched, name: str, rows: DataFrame) -> None:
    """Add the entities ``rows`` of table ``name`` identify (one Spark job)."""
    links = _LINKS.get(name, ())
    if not links:
        return
    for row in rows.select(*[column for column, _ in links]).distinct().collect():
        for column, entity in links:
            if row[column] is not None:
                getattr(touched, entity).add(row[column])


def _shop_frames(spark: SparkSession, cfg: JobConfig) -> dict[str, DataFrame]:
    """The shop tables from the warehouse (empty frames for tables not written yet)."""
    frames = {}
    for name in views.SHOP_TABLES:
        table = cfg.tables[name]
        path = table_path(cfg.warehouse, table)
        if DeltaTable.isDeltaTable(spark, str(path)):
            df = spark.read.format("delta").load(str(path))
        else:
            df = spark.createDataFrame([], table_schema(table, cfg.encoding))
        frames[name] = df.select(*[c for c in df.columns if c not in META])
    return frames


def _expand(spark: SparkSession, frames: Mapping[str, DataFrame], touched: Touched) -> None:
    """Follow the joins: a customer touches its orders; a product its orders; an order its products."""
    orders, lines = frames[views.ORDERS], frames[views.ORDER_LINES]
    if touched.customers:
        touched.orders |= _ids(orders.where(F.col("customer_id").isin(list(touched.customers))), "id")
    if touched.products:
        touched.orders |= _ids(lines.where(F.col("product_id").isin(list(touched.products))), "order_id")
    if touched.orders:
        touched.products |= _ids(lines.where(F.col("order_id").isin(list(touched.orders))), "product_id")


def _refresh_views(spark: SparkSession, cfg: JobConfig, touched: Touched, wanted: Sequence[View]) -> None:
    frames = _shop_frames(spark, cfg)
    full = touched.is_large()
    if not full:
        _expand(spark, frames, touched)
        full = touched.is_large()
    if "orders" in wanted and (full or touched.orders):
        rows = views.orders_enriched(frames)
        scope = None
        if not full:
            rows = rows.where(F.col("order_id").isin(list(touched.orders)))
            key_type = rows.schema["order_id"].dataType
            scope = spark.createDataFrame([(i,) for i in touched.orders], StructType([StructField("order_id", key_type)]))
        merge_view(spark, orders_view_path(cfg.warehouse), rows, views.ORDERS_VIEW_KEY, scope=scope)
    if "search" in wanted and (full or touched.orders or touched.products):
        docs = views.search_documents(frames)
        if full:
            search_index.build((r.asDict() for r in docs.toLocalIterator()), search_path(cfg.warehouse))
            return
        doc_ids = [f"order:{i}" for i in touched.orders] + [f"product:{i}" for i in touched.products]
        current = docs.where(F.col("doc_id").isin(doc_ids)).collect()
        search_index.update(search_path(cfg.warehouse), (r.asDict() for r in current), doc_ids)


def micro_batch_writer(
    spark: SparkSession, cfg: JobConfig, wanted: Sequence[View] = ALL_VIEWS
) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function of the continuous job."""
    topics = cfg.topics
    by_topic = {t: n for n, t in topics.items()}
    shop = views.has_shop_tables(cfg.tables) and ("orders" in wanted or "search" in wanted)
    wants_declared = "declared" in wanted and bool(cfg.declared.views or cfg.declared.indexes)
    if wants_declared:  # before the stream starts: a bad declaration reads nothing
        declared.check(spark, cfg.declared, _empty_frames(spark, cfg))
    registry = cfg.registry_client()  # one client: schemas by id are fetched once for all micro-batches

    def write(batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        avro = avro_schemas(batch, cfg.encoding, registry)
        reduced = latest(envelopes(batch, cfg.encoding, avro)).persist(StorageLevel.MEMORY_AND_DISK)
        changes: dict[str, Changes] = {}
        try:
            present = [by_topic[r[0]] for r in reduced.select("topic").distinct().collect() if r[0] in by_topic]
            found = Changes.of_topics(reduced, {topics[n]: cfg.tables[n] for n in present}, cfg.encoding,
                                      cfg.on_bad_record, avro)  # fmt: skip
            changes = {n: found[topics[n]] for n in present}
            touched = Touched()
            if shop:
                for name, change in changes.items():
                    _touch(touched, name, _touched_rows(spark, cfg, name, change))
            written = {n: merge_rows(spark, table_path(cfg.warehouse, c.table), c.rows, c.truncates, full=False)
                       for n, c in changes.items()}  # fmt: skip
            if shop and (touched.orders or touched.products or touched.customers):
                _refresh_views(spark, cfg, touched, wanted)
            if wants_declared and changes:
                build_declared(spark, cfg, _warehouse_frames(spark, cfg), mode=f"batch {batch_id}")
            log.info("stream.batch_written", batch=batch_id, changed_keys=written, touched_orders=len(touched.orders),
                     touched_products=len(touched.products), seconds=round(time.monotonic() - started, 2))  # fmt: skip
        finally:
            reduced.unpersist()
            for change in changes.values():
                change.unpersist()

    return write


def start_continuous(
    spark: SparkSession,
    cfg: JobConfig,
    *,
    available_now: bool = False,
    interval_s: float = 2.0,
    wanted: Sequence[View] = ALL_VIEWS,
    max_offsets_per_trigger: int | None = None,
) -> StreamingQuery:
    """Start the continuous job; ``available_now``: process what is there, then stop by itself."""
    stream = read_stream(spark, cfg.source, list(cfg.topics.values()), max_offsets_per_trigger)
    writer = stream.writeStream.foreachBatch(micro_batch_writer(spark, cfg, wanted)).option(
        "checkpointLocation", str(checkpoint_path(cfg.warehouse))
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=f"{interval_s} seconds")
    query = writer.queryName("cdc_views_continuous").start()
    log.info("stream.started", topics=list(cfg.topics.values()), checkpoint=str(checkpoint_path(cfg.warehouse)),
             available_now=available_now)  # fmt: skip
    return query
