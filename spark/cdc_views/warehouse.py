"""Warehouse view: every captured table as a Delta Lake table, written idempotently.

Layout: ``<warehouse>/tables/<schema>.<table>/`` (Delta). Each table holds the source columns plus
the ``META`` columns of the record that last wrote the row (key text, partition, offset, LSNs, op,
commit time). ``merge_rows(...)`` writes one table's changes in three steps:

1. new source columns (``ALTER TABLE ... ADD COLUMN`` upstream) are added to the Delta table;
2. truncate markers: rows last written from partition p below a marker's offset o are deleted;
3. one MERGE on ``_cdc_key``, guarded by the source position ``(_cdc_commit_lsn, _cdc_lsn)``: an
   upsert replaces a row only when it is newer, a delete removes it when not older, an unknown key
   is inserted; with ``full=True`` (a batch rebuild from offset 0, where the changes are the whole
   state) rows the topic no longer has are deleted too.

So a re-run or a replayed micro-batch converges to the same table, and a second batch run changes
nothing. The batch and continuous jobs that call this are in ``jobs.py``.
"""

from __future__ import annotations

import functools
import json
import operator
from pathlib import Path

import structlog
from delta.tables import DeltaTable
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegerType, LongType, StringType, StructField, StructType

from cdc_views.decode import spark_type
from cdc_views.reader import META
from cdc_views.tables import Encoding, TableShape

log = structlog.get_logger("cdc_views.warehouse")

NEWER = (
    "(s._cdc_commit_lsn > t._cdc_commit_lsn OR (s._cdc_commit_lsn = t._cdc_commit_lsn AND s._cdc_lsn > t._cdc_lsn)"
    " OR t._cdc_commit_lsn IS NULL)"
)
NOT_OLDER = (
    "(s._cdc_lsn IS NULL OR t._cdc_commit_lsn IS NULL OR s._cdc_commit_lsn > t._cdc_commit_lsn"
    " OR (s._cdc_commit_lsn = t._cdc_commit_lsn AND s._cdc_lsn >= t._cdc_lsn))"
)


META_TYPES: dict[str, DataType] = {
    "_cdc_key": StringType(),
    "_cdc_partition": IntegerType(),
    "_cdc_offset": LongType(),
    "_cdc_lsn": LongType(),
    "_cdc_commit_lsn": LongType(),
    "_cdc_op": StringType(),
    "_cdc_ts_ms": LongType(),
}


class SchemaChangeError(RuntimeError):
    """A column changed type upstream; the Delta table has to be rebuilt."""


def table_path(warehouse: Path, table: TableShape) -> Path:
    return warehouse / "tables" / table.qualified


def table_schema(table: TableShape, encoding: Encoding) -> StructType:
    """The Delta schema of a warehouse table: the source columns, then META."""
    fields = [StructField(c.name, spark_type(c, encoding), True) for c in table.columns]
    return StructType(fields + [StructField(m, META_TYPES[m], True) for m in META])


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def ensure_table(spark: SparkSession, path: Path, schema: StructType) -> DeltaTable:
    """The Delta table at ``path``, created with ``schema``, or with the columns it lacks added."""
    if not DeltaTable.isDeltaTable(spark, str(path)):
        (DeltaTable.createIfNotExists(spark).location(str(path)).addColumns(schema).execute())
        return DeltaTable.forPath(spark, str(path))
    table = DeltaTable.forPath(spark, str(path))
    existing = {f.name: f for f in table.toDF().schema.fields}
    added: list[StructField] = []
    for field in schema.fields:
        have = existing.get(field.name)
        if have is None:
            added.append(field)
        elif have.dataType != field.dataType:
            raise SchemaChangeError(
                f"column {field.name!r} of {path} is {have.dataType.simpleString()} but the source now has "
                f"{field.dataType.simpleString()}: delete {path} (and its checkpoints) and rebuild it from offset 0"
            )
    if added:
        columns = ", ".join(f"{_quote(f.name)} {f.dataType.simpleString()}" for f in added)
        spark.sql(f"ALTER TABLE delta.{_quote(str(path))} ADD COLUMNS ({columns})")
        log.info("warehouse.columns_added", table=str(path), columns=[f.name for f in added])
        table = DeltaTable.forPath(spark, str(path))  # the handle of the new version, with the new columns
    return table


def written_rows(spark: SparkSession, path: Path) -> int:
    """Rows the Delta table's latest commit wrote (its ``numOutputRows``; no second read of the data).

    Read in the driver from the commit file itself (Delta's log protocol: ``_delta_log/<20-digit
    version>.json``, one action per line, ``commitInfo.operationMetrics``): ``DeltaTable.history`` would
    load the table's snapshot and run a Spark job for the same line (#39)."""
    commits = sorted(path.glob("_delta_log/" + "[0-9]" * 20 + ".json"))
    for line in commits[-1].read_text().splitlines() if commits else []:
        info = json.loads(line).get("commitInfo")
        if info is not None and "numOutputRows" in (info.get("operationMetrics") or {}):
            return int(info["operationMetrics"]["numOutputRows"])
    return spark.read.format("delta").load(str(path)).count()


def effective_changes(rows: DataFrame, target: DataFrame, *, full: bool) -> DataFrame:
    """The rows of ``rows`` that change ``target``, plus (``full``) deletes of keys ``rows`` lacks.

    Comparing first keeps a re-run from committing anything, and lets MERGE touch only the files
    that hold changed keys.
    """
    t = target.select(
        F.col("_cdc_key").alias("_t_key"),
        F.col("_cdc_commit_lsn").alias("_t_commit"),
        F.col("_cdc_lsn").alias("_t_lsn"),
    )
    joined = rows.join(t, rows["_cdc_key"] == t["_t_key"], "full_outer" if full else "left")
    s_pos = F.struct(F.col("_cdc_commit_lsn").alias("c"), F.col("_cdc_lsn").alias("l"))
    t_pos = F.struct(F.col("_t_commit").alias("c"), F.col("_t_lsn").alias("l"))
    unknown = F.col("_t_key").isNull()
    upsert = (F.col("_cdc_action") == "upsert") & (unknown | F.col("_t_commit").isNull() | (s_pos > t_pos))
    delete = (
        (F.col("_cdc_action") == "delete")
        & ~unknown
        & (F.col("_cdc_lsn").isNull() | F.col("_t_commit").isNull() | (s_pos >= t_pos))
    )
    changed = joined.where(upsert | delete)
    if not full:
        return changed.drop("_t_key", "_t_commit", "_t_lsn")
    gone = (
        joined.where(F.col("_cdc_key").isNull())
        .select(
            *[
                F.lit(None).cast(f.dataType).alias(f.name)
                for f in rows.schema.fields
                if f.name not in ("_cdc_key", "_cdc_action")
            ],
            F.col("_t_key").alias("_cdc_key"),
            F.lit("delete").alias("_cdc_action"),
        )
        .select(*rows.columns)
    )
    return changed.drop("_t_key", "_t_commit", "_t_lsn").unionByName(gone)


def merge_rows(spark: SparkSession, path: Path, rows: DataFrame, truncates: dict[int, int], *, full: bool) -> int:
    """Steps 1-3 of the module docstring for ``rows`` (table columns + META + ``_cdc_action``).

    Returns how many keys were inserted, updated or deleted (-1: not counted, for a micro-batch).
    """
    columns = [c for c in rows.columns if c != "_cdc_action"]
    schema = StructType([f for f in rows.schema.fields if f.name in columns])
    if not DeltaTable.isDeltaTable(spark, str(path)):  # a first build: no MERGE needed
        live = rows.where(F.col("_cdc_action") == "upsert").select(*columns)
        live.write.format("delta").mode("errorifexists").save(str(path))
        return written_rows(spark, path)
    table = ensure_table(spark, path, schema)
    if truncates:
        stale = functools.reduce(
            operator.or_,
            [(F.col("_cdc_partition") == p) & (F.col("_cdc_offset") < o) for p, o in sorted(truncates.items())],
        )
        if not table.toDF().where(stale).isEmpty():
            table.delete(stale)
    if not full:  # a micro-batch: almost always changes something; the MERGE's guards keep a replay harmless
        _merge(table, rows, columns)
        return -1
    effective = effective_changes(rows, table.toDF(), full=full).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        count = effective.count()
        if count == 0:
            return 0
        _merge(table, effective, columns)
        return count
    finally:
        effective.unpersist()


def _merge(table: DeltaTable, rows: DataFrame, columns: list[str]) -> None:
    assignments: dict[str, str | Column] = {_quote(c): f"s.{_quote(c)}" for c in columns}
    (
        table.alias("t")
        .merge(rows.alias("s"), "t._cdc_key = s._cdc_key")
        .whenMatchedUpdate(condition=f"s._cdc_action = 'upsert' AND {NEWER}", set=assignments)
        .whenMatchedDelete(condition=f"s._cdc_action = 'delete' AND {NOT_OLDER}")
        .whenNotMatchedInsert(condition="s._cdc_action = 'upsert'", values=assignments)
        .execute()
    )


def read_table(spark: SparkSession, warehouse: Path, table: TableShape) -> DataFrame:
    """The warehouse table's rows with the source columns only (no META)."""
    df = spark.read.format("delta").load(str(table_path(warehouse, table)))
    return df.select(*[c for c in df.columns if c not in META])
