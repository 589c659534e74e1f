"""The jobs: rebuild the views from offset 0 (batch), or keep them up to date (Structured Streaming).

Layout under the warehouse directory::

    tables/<schema>.<table>/      Delta, one per captured table        (warehouse.py)
    views/<name>/                 Delta, one per declared view         (declared.py; spark.views in cdc.yaml)
    search/<name>/                tantivy, one per declared index      (declared.py; spark.indexes in cdc.yaml)
    _checkpoints/stream/          the continuous job's Structured Streaming checkpoint

Batch (``rebuild``): one Kafka read of every topic from the earliest offsets, reduced to the latest
state per key; each table MERGEd into its Delta table (rows the topic no longer has deleted); each
declared view computed from the same state and MERGEd (a row is rewritten only when its content
changed); each declared index rebuilt from zero. Running it twice changes nothing.

Continuous (``start_continuous``): the same topics as one stream (so one checkpoint sequences all
tables) with ``foreachBatch``: each micro-batch is reduced the same way and MERGEd into the
warehouse tables with the LSN guard (a replayed batch changes nothing); then each declared view and
index is brought up to date from the warehouse tables (``refresh_declared``: the keys the batch touched
where the view's key lineage allows it, the groups it touched where the view is an aggregate by columns of
one table, the whole view otherwise; the log says which). A restart continues from the checkpoint.
"""

from __future__ import annotations

import functools
import operator
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

from cdc import declared as declared_model
from cdc.declared import DeclaredIndex, DeclaredView, KeyLineage, NoKeyLineage, SparkSection
from cdc.sink.registry import RegistryClient, RegistrySettings
from cdc_views import declared, toast
from cdc_views.history import SchemaHistory
from cdc_views.reader import (
    META,
    Changes,
    KafkaSource,
    OnBadRecord,
    avro_schemas,
    envelopes,
    read_batch,
    read_stream,
    reduce_records,
    reduce_topics,
    schema_history,
)
from cdc_views.tables import Encoding, TableShape
from cdc_views.warehouse import ensure_table, merge_rows, table_path, table_schema, written_rows

log = structlog.get_logger("cdc_views.jobs")

View = Literal["warehouse", "declared"]
ALL_VIEWS: tuple[View, ...] = ("warehouse", "declared")
FULL_REFRESH_ABOVE = 20_000  # touched keys in one micro-batch above which an index is built whole (they are collected)
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"}  # to_json keeps microseconds


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


def checkpoint_path(warehouse: Path) -> Path:
    return warehouse / "_checkpoints" / "stream"


def _source_rows(changes: Changes) -> DataFrame:
    """The live rows of a table as the changes state them (for views built from the topics)."""
    return changes.rows.where(F.col("_cdc_action") == "upsert").select(*[c.name for c in changes.table.columns])


# --------------------------------------------------------------------------- keyed views


def _row_hash(columns: Sequence[str]) -> Column:
    return F.sha2(F.to_json(F.struct(*[F.col(c) for c in columns]), JSON_OPTIONS), 256)


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
    if scope is not None:
        return _merge_scoped(table, source, key, value_columns, scope)
    target = table.toDF()
    t = target.select(*[F.col(k).alias(f"_t_{k}") for k in key], F.col("_view_hash").alias("_t_hash"))
    on = [source[k].eqNullSafe(t[f"_t_{k}"]) for k in key]
    joined = source.join(t, on, "full_outer")
    missing = F.col(f"_t_{key[0]}").isNull()
    gone = F.col("_view_hash").isNull()
    changed = (
        joined.where(missing | gone | (F.col("_view_hash") != F.col("_t_hash")))
        .select(
            *[F.coalesce(F.col(k), F.col(f"_t_{k}")).alias(k) for k in key],
            *[F.col(c) for c in value_columns],
            F.col("_view_hash"),
            gone.alias("_view_delete"),
        )
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        count = changed.count()
        if count == 0:
            return 0
        _view_merge(table, changed, key, source.columns)
        return count
    finally:
        changed.unpersist()


def _view_merge(table: DeltaTable, changes: DataFrame, key: Sequence[str], columns: Sequence[str]) -> DataFrame:
    """MERGE ``changes`` (the view's ``columns``, ``_view_hash`` among them, and ``_view_delete``) into the view on
    its key: a delete where flagged, an update where the content hash differs, an insert of a new key; returns
    Delta's metrics of the MERGE (``num_affected_rows``...)."""
    condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)
    assignments: dict[str, str | Column] = {f"`{c}`": f"s.`{c}`" for c in columns}
    return (
        table.alias("t")
        .merge(changes.alias("s"), condition)
        .whenMatchedDelete(condition="s._view_delete")
        .whenMatchedUpdate(condition="t._view_hash <> s._view_hash", set=assignments)
        .whenNotMatchedInsert(condition="NOT s._view_delete", values=assignments)
        .execute()
    )


def _merge_scoped(
    table: DeltaTable, source: DataFrame, key: Sequence[str], value_columns: Sequence[str], scope: DataFrame
) -> int:
    """``merge_view`` for the keys of ``scope`` (a micro-batch's touched keys or groups): one MERGE, no read of the
    view before it. The recomputed rows, and a delete for each key of ``scope`` they lack, are the MERGE's
    source; its conditions leave a row whose content hash is unchanged alone. Returns the keys it changed (the
    MERGE's own metrics). A re-run rewrites nothing (a MERGE that changes no row commits no version either),
    as the micro-batch's MERGE into the warehouse table (#39: comparing first was a join with the view and a
    Spark job of its own, about a second of each micro-batch per view)."""
    keys = scope.select(*[F.col(k).alias(f"_k_{k}") for k in key]).distinct()
    joined = source.join(keys, [source[k].eqNullSafe(keys[f"_k_{k}"]) for k in key], "full_outer")
    merged = joined.select(
        *[F.coalesce(F.col(k), F.col(f"_k_{k}")).alias(k) for k in key],
        *[F.col(c) for c in value_columns],
        F.col("_view_hash"),
        F.col("_view_hash").isNull().alias("_view_delete"),
    )
    metrics = _view_merge(table, merged, key, source.columns).collect()
    return int(metrics[0]["num_affected_rows"]) if metrics else -1


def read_view(spark: SparkSession, path: Path) -> DataFrame:
    df = spark.read.format("delta").load(str(path))
    return df.drop("_view_hash")


# --------------------------------------------------------------------------- batch


def rebuild(spark: SparkSession, cfg: JobConfig, wanted: Sequence[View] = ALL_VIEWS) -> dict[str, object]:
    """The batch job: the wanted views rebuilt from every topic's offset 0; a summary of what was written."""
    started = time.monotonic()
    summary: dict[str, object] = {}
    wants_declared = "declared" in wanted and bool(cfg.declared.views or cfg.declared.indexes)
    if wants_declared:  # Spark's analyzer over the tables' schemas: a bad declaration stops us before any read
        declared.check(spark, cfg.declared, _empty_frames(spark, cfg))
    if not ("warehouse" in wanted or wants_declared):
        raise ValueError(
            f"nothing to build: views {list(wanted)} name neither the warehouse nor declared views and indexes "
            "(spark.views / spark.indexes in cdc.yaml, or a file spark.file names)"
        )
    names = list(cfg.tables)
    topics = {n: cfg.topic(n) for n in names}
    log.info("rebuild.started", views=list(wanted), topics=list(topics.values()), warehouse=str(cfg.warehouse))
    history = schema_history(cfg.source, cfg.topic_prefix, cfg.encoding)  # before the records it must cover
    reduced, avro = reduce_topics(spark, cfg.source, list(topics.values()), cfg.encoding, cfg.registry_client())
    changes: dict[str, Changes] = {}
    try:
        by_topic = Changes.of_topics(
            reduced, {topics[n]: cfg.tables[n] for n in names}, cfg.encoding, cfg.on_bad_record, avro, history
        )
        reduced.unpersist()  # the decoded records are persisted now: the views read those
        changes = {n: by_topic[topics[n]] for n in names}
        summary["bad_records_skipped"] = {n: c.bad_count for n, c in changes.items() if c.bad_count}
        # a second read of only the topics whose latest records hold the unchanged-TOAST placeholder
        fill_placeholders(
            spark,
            cfg,
            changes,
            lambda wanted: read_batch(spark, cfg.source, wanted),
            history,
        )
        summary["placeholders_filled"] = {n: c.placeholders_filled for n, c in changes.items() if c.placeholders_filled}
        summary["placeholders_skipped"] = {
            n: c.placeholders_unresolved for n, c in changes.items() if c.placeholders_unresolved
        }
        if "warehouse" in wanted:
            mark_pending(cfg, set(changes))  # views not built here are recomputed whole by the next stream batch
            for i, (name, change) in enumerate(changes.items(), 1):
                written = merge_rows(
                    spark, table_path(cfg.warehouse, change.table), change.rows, change.truncates, full=True
                )
                log.info("rebuild.table_written", table=name, n=i, of=len(changes), changed_keys=written)
                summary[f"table {name}"] = written
        if wants_declared:
            summary.update(build_declared(spark, cfg, {n: _source_rows(changes[n]) for n in names}))
    finally:
        reduced.unpersist()
        for change in changes.values():
            change.unpersist()
    summary["seconds"] = round(time.monotonic() - started, 2)
    log.info("rebuild.finished", **{k.replace(" ", "_"): v for k, v in summary.items()})
    return summary


# --------------------------------------------------------------------------- unchanged TOASTed values


def fill_placeholders(
    spark: SparkSession,
    cfg: JobConfig,
    changes: dict[str, Changes],
    earlier: Callable[[list[str]], DataFrame],
    history: SchemaHistory | None,
) -> None:
    """Replace, in place, each table's changes whose latest records hold the unchanged-TOAST placeholder by
    ``toast.resolve``'s: the key's previous value from ``earlier(topics)`` (the same read's records of those
    topics, every one: not only those ``compacted`` keeps) or the warehouse table. Raises
    ``UnresolvedPlaceholders`` unless ``cfg.on_bad_record == 'skip'``. Tables without placeholders cost nothing
    here."""
    held = [n for n, c in changes.items() if c.placeholders]
    if not held:
        return
    raw = earlier([cfg.topic(n) for n in held])
    avro = avro_schemas(raw, cfg.encoding, cfg.registry_client())  # the superseded records' schemas too
    records = envelopes(raw, cfg.encoding, avro)
    for name in held:
        change = changes[name]
        path = table_path(cfg.warehouse, change.table)
        previous = spark.read.format("delta").load(str(path)) if DeltaTable.isDeltaTable(spark, str(path)) else None
        changes[name] = toast.resolve(
            change,
            topic=cfg.topic(name),
            earlier=records,
            previous=previous,
            encoding=cfg.encoding,
            avro=avro,
            history=history.of(change.table.qualified) if history is not None else None,
            on_bad_record=cfg.on_bad_record,
        )


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
    summary: dict[str, object] = {}
    for view in cfg.declared.views:
        summary[f"view {view.name}"] = _write_view(spark, cfg, view, frames, job=mode)
    for index in cfg.declared.indexes:
        summary[f"index {index.name}"] = _write_index(spark, cfg, index, frames, job=mode)
    return summary


def _write_view(
    spark: SparkSession,
    cfg: JobConfig,
    view: DeclaredView,
    frames: Mapping[str, DataFrame],
    *,
    job: str,
    keys: TouchedKeys | None = None,
    reason: str = "the whole view is recomputed; only rows whose content changed are rewritten",
    unique: bool = False,
) -> int:
    """The view recomputed whole from ``frames``, or for the ``keys`` of its key-lineage table only.
    ``unique``: its rows are one per key by construction (``Refresh.unique``), not checked again."""
    path = declared.view_path(cfg.warehouse, view.name)
    rows, scope = _query(spark, view.sql, frames, keys)
    if scope is not None and keys is not None:
        # a few rows, read by the check and by both passes of the MERGE: computed once
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        scope = scope.select(*[F.col(keys.lineage.columns[k]).alias(k) for k in view.key])
    try:
        if not unique:
            _unique_keys(view.name, rows, view.key)
        written = merge_view(spark, path, rows, view.key, scope=scope)
    finally:
        if scope is not None:
            rows.unpersist()
    if keys is None:  # the view now matches this declaration whole: a later micro-batch may refresh it by keys
        _declaration_file(path).write_text(view.model_dump_json())
    _pending_file(path).unlink(missing_ok=True)
    log.info("view_written", view=view.name, changed_keys=written, job=job, **_refreshed(keys, reason))
    return written


def _write_index(
    spark: SparkSession,
    cfg: JobConfig,
    index: DeclaredIndex,
    frames: Mapping[str, DataFrame],
    *,
    job: str,
    keys: TouchedKeys | None = None,
    reason: str = "the whole index is built again",
) -> int:
    """The index built again from ``frames``, or its documents of the ``keys`` replaced."""
    path = declared.index_path(cfg.warehouse, index.name)
    rows, _ = _query(spark, index.sql, frames, keys)
    documents = (r.asDict(recursive=True) for r in rows.toLocalIterator())
    if keys is None:
        count = declared.build_index(index, documents, path)
    else:
        values = keys.values
        assert values is not None  # _refresh_declared builds an index whole when they were too many to collect
        count = declared.update_index(index, documents, [declared.document_id(v[0]) for v in values], path)
    _pending_file(path).unlink(missing_ok=True)
    log.info("index_written", index=index.name, documents=count, job=job, **_refreshed(keys, reason))
    return count


def _refreshed(keys: TouchedKeys | None, reason: str) -> dict[str, object]:
    """What ``view_written`` and ``index_written`` say of how: by keys or by groups (how many), or whole, and why."""
    return {"mode": keys.by if keys else "whole", "keys": keys.count if keys else None, "reason": reason}


def _query(
    spark: SparkSession, sql: str, frames: Mapping[str, DataFrame], keys: TouchedKeys | None
) -> tuple[DataFrame, DataFrame | None]:
    """A declared query over ``frames``; with ``keys``, over its key-lineage table's rows of those keys only
    (and those keys as a frame of the table's key columns)."""
    if keys is None:
        declared.register(frames)
        return spark.sql(sql), None
    touched = keys.frame
    restricted = dict(frames)
    restricted[keys.lineage.table] = frames[keys.lineage.table].join(touched, list(touched.columns), "left_semi")
    declared.register(restricted)
    return spark.sql(sql), touched


def _declaration_file(path: Path) -> Path:
    return path.with_suffix(".json")


# --------------------------------------------------------------------------- continuous


@dataclass(frozen=True)
class TouchedKeys:
    """The values of ``lineage.table``'s lineage columns (its key, or the columns a view groups by: ``by``)
    that a micro-batch's rows had before or after it: ``frame`` (distinct, computed before the batch is merged
    and kept: a local checkpoint, never computed again from the merged table), ``count`` of them.

    A view's refresh joins ``frame`` (#39: collecting the values and sending them back from Python cost
    seconds per batch, and capped a refresh by keys at ``FULL_REFRESH_ABOVE``); an index takes its document
    ids from ``values``, collected when there are at most ``FULL_REFRESH_ABOVE`` (None: too many)."""

    lineage: KeyLineage
    frame: DataFrame
    count: int
    by: Literal["keys", "groups"] = "keys"

    @functools.cached_property
    def values(self) -> list[tuple[object, ...]] | None:
        if self.count > FULL_REFRESH_ABOVE:
            return None
        return [tuple(r) for r in self.frame.collect()]


Touched = tuple[str, str, tuple[str, ...]]  # by keys or groups, table, columns: what TouchedKeys are taken by


@dataclass(frozen=True)
class Refresh:
    """How the continuous job keeps one declared view or index: the tables it reads, and its lineage (None:
    recomputed whole whenever a batch touches one of its tables; ``reason`` says why). ``by``: ``keys`` (a
    view row per row of ``lineage.table``) or ``groups`` (a view row per group of ``lineage.table``'s rows
    that share the values of ``lineage.columns``: an aggregate by them)."""

    reads: frozenset[str]
    lineage: KeyLineage | None
    reason: str
    by: Literal["keys", "groups"] = "keys"
    unique: bool = False  # one view row per key by the SQL alone (grouped by exactly the key): not checked again

    @property
    def touched(self) -> Touched | None:
        """What a batch's touched values are taken by: by keys or groups, the lineage table and its columns (None:
        the view is recomputed whole)."""
        if self.lineage is None:
            return None
        return self.by, self.lineage.table, tuple(sorted(set(self.lineage.columns.values())))


_ROW_BY_ROW_PLAN = {
    "Project",
    "Filter",
    "Join",
    "SubqueryAlias",
    "View",
    "LogicalRDD",
    "LocalRelation",
    "Relation",
    "LogicalRelation",
}
_ROW_BY_ROW_JOINS = {"Inner", "LeftOuter", "LeftSemi", "LeftAnti", "Cross"}
_PER_GROUP_PLAN = {*_ROW_BY_ROW_PLAN, "Aggregate", "Sort"}


def _plan_nodes(frame: DataFrame) -> list[str]:
    """The operators of Spark's analyzed plan of ``frame`` (with a join's type: ``Join LeftOuter``)."""
    tree = frame._jdf.queryExecution().analyzed().treeString()
    nodes = []
    for line in str(tree).splitlines():
        words = line.lstrip(" :+-|").replace(",", " ").replace("[", " ").replace("(", " ").split()
        if words:
            nodes.append(" ".join(words[:2]) if words[0] == "Join" else words[0])
    return nodes


def refresh_plan(spark: SparkSession, cfg: JobConfig, name: str, sql: str, key: Sequence[str]) -> Refresh:
    """The key lineage of a declared query (``cdc.declared.key_lineage``), confirmed on Spark's analyzed plan:
    only projections, filters and inner or left joins over the tables (an empty frame of each)."""
    columns = {n: [c.name for c in t.columns] for n, t in cfg.tables.items()}
    reads = frozenset(declared_model.tables_read(sql, list(cfg.tables)))
    lineage = declared_model.key_lineage(
        DeclaredView(name=name, sql=sql, key=list(key)), columns, {n: list(t.key) for n, t in cfg.tables.items()}
    )
    by: Literal["keys", "groups"] = "keys"
    allowed = _ROW_BY_ROW_PLAN
    if isinstance(lineage, NoKeyLineage):
        grouped = declared.group_lineage(sql, key, columns)
        if isinstance(grouped, NoKeyLineage):
            return Refresh(reads, None, f"recomputed whole: {lineage.reason}; and not by groups: {grouped.reason}")
        lineage, by, allowed = grouped, "groups", _PER_GROUP_PLAN
    declared.register(_empty_frames(spark, cfg))
    nodes = _plan_nodes(spark.sql(sql))
    other = [n for n in nodes if n not in allowed and not (n.startswith("Join ") and n.split()[1] in _ROW_BY_ROW_JOINS)]
    if by == "groups" and nodes.count("Aggregate") > 1:
        other.append("more than one Aggregate")
    if other:
        return Refresh(reads, None, f"recomputed whole: Spark's plan has {', '.join(sorted(set(other)))}")
    if by == "groups":
        grouped_by = ", ".join(lineage.columns.values())
        reason = f"the groups ({grouped_by}) of {lineage.table} a batch touched, when it touched no other table"
        # grouped by exactly its key: one row per key. Else (more columns grouped by) each refresh checks.
        return Refresh(reads, lineage, reason, by, unique=declared.grouped_by_exactly(sql, lineage.columns.values()))
    # By keys the check stays: the warehouse holds one row per Kafka key, and two keys may still carry the same
    # key columns (rows captured before a change of the table's primary key), let alone what a join repeats.
    return Refresh(reads, lineage, f"the keys of {lineage.table} a batch touched, when it touched no other table")


def _touched_keys(plan: Refresh, change: Changes, touched_rows: Callable[[], DataFrame]) -> TouchedKeys | str:
    """The values of the lineage columns (the table's key, or the view's group columns) of the table's rows the
    batch changes, before and after (``touched_rows``, read before it is merged); or why the view is
    recomputed whole."""
    lineage = plan.lineage
    assert lineage is not None
    if change.truncates:
        return "the batch truncates " + lineage.table
    columns = list(dict.fromkeys(lineage.columns.values()))
    # eager: computed now, while the warehouse table still holds the rows' values before the batch; a local
    # checkpoint, not a cache, so that a lost block fails the batch instead of being recomputed from the merged
    # table. Spark's ContextCleaner frees its blocks once the frame is no longer referenced.
    rows = touched_rows().select(*columns).distinct().localCheckpoint(eager=True)
    null = functools.reduce(operator.or_, [F.col(c).isNull() for c in columns])
    found = rows.agg(F.count(F.lit(1)).alias("n"), F.count(F.when(null, 1)).alias("nulls")).first()
    assert found is not None
    if plan.by == "groups" and found["nulls"]:
        return f"the batch touched a group of {lineage.table} with a null in {', '.join(columns)}"
    return TouchedKeys(lineage, rows, int(found["n"]), plan.by)


def _by_keys(refresh: Refresh, path: Path, declaration: str, touched: set[str], interrupted: bool) -> str | None:
    """None when the batch's change can be applied by keys; else why the whole is recomputed."""
    if refresh.lineage is None:
        return refresh.reason
    others = (touched & refresh.reads) - {refresh.lineage.table}
    if others:
        return f"recomputed whole: the batch touched {', '.join(sorted(others))}, which it reads too"
    if interrupted:  # its tables were merged without it: the keys those changes touched are unknown now
        return (
            "recomputed whole: its tables changed since it was refreshed (a job stopped in between, or merged "
            "the tables alone)"
        )
    meta = _declaration_file(path)
    if not (path.is_dir() and meta.exists() and meta.read_text() == declaration):
        return "recomputed whole: not yet built whole from this declaration"
    return None


def _pending_file(path: Path) -> Path:
    """Present from before a micro-batch merges the tables a view reads until the view is refreshed."""
    return path.with_name(f".{path.name}.pending")


def mark_pending(cfg: JobConfig, touched: set[str], reads: Mapping[str, frozenset[str]] | None = None) -> set[str]:
    """Before tables are merged: mark every declared view and index that reads one of ``touched`` as pending
    until it is refreshed (``_write_view``, ``_write_index``); returns those that were pending already. A view
    left pending (a job stopped in between, or one that merges tables without building the views, such as
    ``--views warehouse``) may miss changes a keyed refresh would not see: it is recomputed whole next.
    ``reads``: the tables each declaration reads, where known already (the stream's ``Refresh`` plans)."""
    pending = set()
    for what, declaration, path in _declarations(cfg):
        marker = _pending_file(path)
        known = (reads or {}).get(what)
        if marker.exists():
            pending.add(what)
        elif (
            known if known is not None else set(declared_model.tables_read(declaration.sql, list(cfg.tables)))
        ) & touched:
            path.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
    return pending


def _declarations(cfg: JobConfig) -> list[tuple[str, DeclaredView | DeclaredIndex, Path]]:
    return [
        *((f"view {v.name}", v, declared.view_path(cfg.warehouse, v.name)) for v in cfg.declared.views),
        *((f"index {i.name}", i, declared.index_path(cfg.warehouse, i.name)) for i in cfg.declared.indexes),
    ]


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


def _refresh_plans(spark: SparkSession, cfg: JobConfig) -> dict[str, Refresh]:
    """How the continuous job refreshes each declared view and index (``refresh_plan``), checked and logged."""
    declared.check(spark, cfg.declared, _empty_frames(spark, cfg))
    plans: dict[str, Refresh] = {}
    for v in cfg.declared.views:
        plans[f"view {v.name}"] = refresh_plan(spark, cfg, v.name, v.sql, v.key)
    for i in cfg.declared.indexes:
        plans[f"index {i.name}"] = refresh_plan(spark, cfg, i.name, i.sql, [i.id])
    for what, plan in plans.items():
        log.info(
            "stream.refresh_planned",
            declared=what,
            by_keys_of=plan.lineage.table if plan.lineage and plan.by == "keys" else None,
            by_groups_of=plan.lineage.table if plan.lineage and plan.by == "groups" else None,
            reads=sorted(plan.reads),
            reason=plan.reason,
        )
    return plans


def micro_batch_writer(
    spark: SparkSession, cfg: JobConfig, wanted: Sequence[View] = ALL_VIEWS
) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function of the continuous job."""
    topics = cfg.topics
    by_topic = {t: n for n, t in topics.items()}
    wants_declared = "declared" in wanted and bool(cfg.declared.views or cfg.declared.indexes)
    plans = _refresh_plans(spark, cfg) if wants_declared else {}  # before the stream starts: a bad one reads nothing
    registry = cfg.registry_client()  # one client: schemas by id are fetched once for all micro-batches

    def write(batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        # Read after the batch's offsets were fixed: it covers the batch (the connector acknowledges a version
        # before it produces the records that use it).
        history = schema_history(cfg.source, cfg.topic_prefix, cfg.encoding)
        reduced, avro = reduce_records(batch, cfg.encoding, registry)
        changes: dict[str, Changes] = {}
        touched_rows: dict[str, DataFrame] = {}
        keys: dict[Touched, TouchedKeys | str] = {}
        try:
            present = [by_topic[r[0]] for r in reduced.select("topic").distinct().collect() if r[0] in by_topic]
            found = Changes.of_topics(
                reduced, {topics[n]: cfg.tables[n] for n in present}, cfg.encoding, cfg.on_bad_record, avro, history
            )
            changes = {n: found[topics[n]] for n in present}
            fill_placeholders(
                spark,
                cfg,
                changes,
                lambda wanted: batch.where(F.col("topic").isin(*wanted)),
                history,
            )
            phases = {"decode": time.monotonic() - started}  # with the schema history and the placeholders' fill
            # before the merge: the warehouse still has the old rows
            for plan in plans.values():
                touched = plan.touched
                if touched and set(changes) & plan.reads == {touched[1]} and touched not in keys:
                    name = touched[1]

                    def rows_of(name: str = name) -> DataFrame:  # read once for all the views that need them
                        if name not in touched_rows:
                            touched_rows[name] = _touched_rows(spark, cfg, name, changes[name]).persist(
                                StorageLevel.MEMORY_AND_DISK
                            )
                        return touched_rows[name]

                    keys[touched] = _touched_keys(plan, changes[name], rows_of)
            phases["touched"] = time.monotonic() - started - sum(phases.values())
            interrupted = mark_pending(cfg, set(changes), {what: plan.reads for what, plan in plans.items()})
            written = {
                n: merge_rows(spark, table_path(cfg.warehouse, c.table), c.rows, c.truncates, full=False)
                for n, c in changes.items()
            }
            phases["merge"] = time.monotonic() - started - sum(phases.values())
            if plans and changes:
                _refresh_declared(spark, cfg, plans, set(changes), keys, interrupted, job=f"batch {batch_id}")
            phases["declared"] = time.monotonic() - started - sum(phases.values())
            log.info(
                "stream.batch_written",
                batch=batch_id,
                changed_keys=written,
                seconds=round(time.monotonic() - started, 2),
                **{f"{phase}_seconds": round(spent, 2) for phase, spent in phases.items()},
            )
        finally:
            reduced.unpersist()
            for rows in touched_rows.values():
                rows.unpersist()
            for change in changes.values():
                change.unpersist()

    return write


def _refresh_declared(
    spark: SparkSession,
    cfg: JobConfig,
    plans: Mapping[str, Refresh],
    touched: set[str],
    keys: Mapping[Touched, TouchedKeys | str],
    interrupted: set[str],
    *,
    job: str,
) -> None:
    """Each declared view and index after a micro-batch that changed the tables ``touched``: untouched when it
    reads none of them; by the touched keys where its plan allows; whole otherwise. Logged per view."""
    frames = _warehouse_frames(spark, cfg)
    for what, declaration, path in _declarations(cfg):
        plan = plans[what]
        if not plan.reads & touched:
            log.info(
                "declared_unchanged",
                declared=what,
                job=job,
                mode="unchanged",
                reason="the batch touched none of its tables",
            )
            continue
        why = _by_keys(plan, path, declaration.model_dump_json(), touched, what in interrupted)
        by_keys = None
        if why is None and plan.touched is not None:
            selected = keys.get(plan.touched)  # TouchedKeys, or why the batch's keys were not taken
            if isinstance(selected, TouchedKeys):
                by_keys = selected
            else:
                why = f"recomputed whole: {selected}"
        reason = why or plan.reason
        if isinstance(declaration, DeclaredView):
            unique = by_keys is not None and plan.unique
            _write_view(spark, cfg, declaration, frames, job=job, keys=by_keys, reason=reason, unique=unique)
        else:
            if by_keys is not None and by_keys.values is None:
                by_keys, reason = None, f"recomputed whole: the batch touched more than {FULL_REFRESH_ABOVE} keys"
            _write_index(spark, cfg, declaration, frames, job=job, keys=by_keys, reason=reason)


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
    writer = (
        writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=f"{interval_s} seconds")
    )
    query = writer.queryName("cdc_views_continuous").start()
    log.info(
        "stream.started",
        topics=list(cfg.topics.values()),
        checkpoint=str(checkpoint_path(cfg.warehouse)),
        available_now=available_now,
    )
    return query
