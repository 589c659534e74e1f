"""Compare every rebuilt view with the source database: row counts and per-row checksums on the key.

The database's rows are read with psycopg and turned into Spark rows of exactly the warehouse's
types (numerics as exact decimals, timestamps as UTC instants, time and intervals as microseconds,
float4 through its shortest text so 1.1 stays 1.1). Both sides are then normalized the same way:
per row, the JSON text of its key and of its compared columns, and a SHA-256 of the latter. A full
outer join on the key yields rows missing from the view, rows the database no longer has, and rows
whose checksum differs (with the differing columns named).

Declared views and indexes (``spark.views``, ``spark.indexes``) are checked against the same SQL over
the database's tables: a view row by row, an index document by document.

Not compared (named in the report): columns of kinds the warehouse keeps as JSON text of an
unknown type (``OTHER``) and intervals written as ISO text.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import structlog
from psycopg import sql
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from cdc.declared import SparkSection
from cdc_views import declared
from cdc_views.decode import spark_type
from cdc_views.jobs import JSON_OPTIONS, read_view
from cdc_views.tables import ColumnShape, Encoding, Kind, TableShape, read_shapes
from cdc_views.warehouse import read_table, table_path

log = structlog.get_logger("cdc_views.verify")

LISTED_DIFFERENCES = 20


@dataclass(frozen=True, slots=True)
class Difference:
    key: str
    what: str  # "missing from the view", "not in the database", "differs"
    detail: str = ""

    def __str__(self) -> str:
        return f"  {self.key}: {self.what}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class ViewCheck:
    name: str
    database_rows: int
    view_rows: int
    difference_count: int
    differences: list[Difference] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.difference_count == 0 and self.database_rows == self.view_rows

    def render(self) -> str:
        if self.error:
            return f"{self.name}: ERROR {self.error}"
        status = "OK" if self.ok else f"{self.difference_count} difference(s)"
        line = f"{self.name}: {self.database_rows} rows in the database, {self.view_rows} in the view: {status}"
        if self.not_compared:
            line += f" (not compared: {', '.join(self.not_compared)})"
        lines = [line, *[str(d) for d in self.differences]]
        if self.difference_count > len(self.differences):
            lines.append(f"  ... and {self.difference_count - len(self.differences)} more")
        return "\n".join(lines)


@dataclass
class VerifyReport:
    checks: list[ViewCheck]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def difference_count(self) -> int:
        return sum(c.difference_count + (1 if c.error else 0) for c in self.checks)

    def render(self) -> str:
        verdict = "all views match the database" if self.ok else f"{self.difference_count} difference(s)"
        return "\n".join([*(c.render() for c in self.checks), f"verify: {verdict}"])


# --------------------------------------------------------------------------- the database as Spark rows


def _compared(column: ColumnShape, encoding: Encoding) -> bool:
    if column.kind is Kind.OTHER or (column.kind is Kind.INTERVAL and encoding.interval_handling == "string"):
        return False
    return column.element is None or _compared(column.element, encoding)


def _select_expr(column: ColumnShape, encoding: Encoding) -> sql.Composable:
    c = sql.Identifier(column.name)
    kind = column.kind
    if kind in (Kind.FLOAT, Kind.TEXT, Kind.JSON, Kind.DECIMAL_TEXT, Kind.OTHER) or (
        kind is Kind.INTERVAL and encoding.interval_handling == "string"
    ):
        return sql.SQL("{}::text").format(c)
    if kind is Kind.TIME:
        return sql.SQL("(EXTRACT(EPOCH FROM {})*1000000)::bigint").format(c)
    if kind is Kind.INTERVAL:
        return sql.SQL(
            "((EXTRACT(YEAR FROM {c})*12 + EXTRACT(MONTH FROM {c}))::bigint*2629800000000"
            " + EXTRACT(DAY FROM {c})::bigint*86400000000"
            " + (EXTRACT(HOUR FROM {c})*3600000000 + EXTRACT(MINUTE FROM {c})*60000000"
            " + EXTRACT(MICROSECONDS FROM {c}))::bigint)"
        ).format(c=c)
    if kind in (Kind.DATE, Kind.TIMESTAMP, Kind.TIMESTAMPTZ):
        return sql.SQL("CASE WHEN isfinite({c}) THEN {c} END").format(c=c)
    return c


def _python_value(value: Any, column: ColumnShape, encoding: Encoding) -> Any:
    """A psycopg value -> what Spark accepts for the column's warehouse type."""
    if value is None:
        return None
    kind = column.kind
    if kind is Kind.ARRAY:
        assert column.element is not None
        return [_python_value(v, column.element, encoding) for v in value]
    if kind is Kind.FLOAT:
        return float(value)  # from text: 'NaN', 'Infinity' and float4's shortest digits
    if kind in (Kind.DECIMAL, Kind.DECIMAL_TEXT):
        if encoding.decimal_handling == "double":
            return float(value)
        return Decimal(value) if kind is Kind.DECIMAL else str(value)
    if kind is Kind.TIMESTAMP and isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC)  # the wall clock, stored as a UTC instant
    if kind is Kind.BYTES:
        return bytearray(value)
    return value


def database_frame(
    spark: SparkSession, conn: psycopg.Connection[Any], table: TableShape, encoding: Encoding
) -> DataFrame:
    """The source table's rows as a DataFrame with the warehouse's column types."""
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(_select_expr(c, encoding) for c in table.columns),
        sql.Identifier(table.schema),
        sql.Identifier(table.name),
    )
    rows = [
        tuple(_python_value(v, c, encoding) for v, c in zip(row, table.columns, strict=True))
        for row in conn.execute(query).fetchall()
    ]
    schema = StructType([StructField(c.name, spark_type(c, encoding), True) for c in table.columns])
    return spark.createDataFrame(rows, schema)


# --------------------------------------------------------------------------- comparing two frames


def without_trailing_zeros(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Decimal text as its shortest form (10.50 -> 10.5, 3.0 -> 3): the connector strips trailing
    zeros of unconstrained numerics (Debezium's VariableScaleDecimal), the database keeps them."""
    for c in columns:
        df = df.withColumn(c, F.regexp_replace(F.regexp_replace(F.col(c), r"(\.[0-9]*?)0+$", "$1"), r"\.$", ""))
    return df


def _normalized(df: DataFrame, key: Sequence[str], columns: Sequence[str]) -> DataFrame:
    body: Column = F.to_json(F.struct(*[F.col(c) for c in columns]), JSON_OPTIONS)
    return df.select(
        F.to_json(F.struct(*[F.col(k) for k in key]), JSON_OPTIONS).alias("k"),
        body.alias("v"),
        F.sha2(body, 256).alias("h"),
    )


def _column_diff(database: str | None, view: str | None) -> str:
    a = json.loads(database or "{}")
    b = json.loads(view or "{}")
    parts = [f"{k}: database {a.get(k)!r}, view {b.get(k)!r}" for k in a if a.get(k) != b.get(k)]
    return "; ".join(parts[:5])


def compare_frames(
    name: str, database: DataFrame, view: DataFrame, key: Sequence[str], columns: Sequence[str]
) -> ViewCheck:
    """Counts, and the differences of ``columns`` per ``key``, between the two frames."""
    for c in columns:
        if c not in view.columns:
            view = view.withColumn(c, F.lit(None).cast(database.schema[c].dataType))
    a = _normalized(database, key, columns).alias("a")
    b = _normalized(view, key, columns).alias("b")
    joined = a.join(b, F.col("a.k") == F.col("b.k"), "full_outer")
    is_diff = F.col("a.k").isNull() | F.col("b.k").isNull() | (F.col("a.h") != F.col("b.h"))
    counts = joined.agg(
        F.count("a.k").alias("database_rows"), F.count("b.k").alias("view_rows"), F.count_if(is_diff).alias("diffs")
    ).collect()[0]
    listed: list[Difference] = []
    if counts["diffs"]:
        rows = (
            joined.where(is_diff)
            .select(
                F.coalesce("a.k", "b.k").alias("k"),
                F.col("a.v").alias("av"),
                F.col("b.v").alias("bv"),
                F.col("a.k").isNull().alias("extra"),
                F.col("b.k").isNull().alias("missing"),
            )
            .orderBy("k")
            .limit(LISTED_DIFFERENCES)
            .collect()
        )
        for r in rows:
            if r["missing"]:
                listed.append(Difference(r["k"], "missing from the view"))
            elif r["extra"]:
                listed.append(Difference(r["k"], "not in the database"))
            else:
                listed.append(Difference(r["k"], "differs", _column_diff(r["av"], r["bv"])))
    return ViewCheck(name, int(counts["database_rows"]), int(counts["view_rows"]), int(counts["diffs"]), listed)


# --------------------------------------------------------------------------- the checks


def _check_table(
    spark: SparkSession, conn: psycopg.Connection[Any], warehouse: Path, table: TableShape, encoding: Encoding
) -> tuple[ViewCheck, DataFrame]:
    database = database_frame(spark, conn, table, encoding)
    name = f"table {table.qualified}"
    if not (table_path(warehouse, table) / "_delta_log").exists():
        check = ViewCheck(name, 0, 0, 0, error=f"no warehouse table at {table_path(warehouse, table)}")
        return check, database
    compared = [c.name for c in table.columns if _compared(c, encoding)]
    texts = [c.name for c in table.columns if c.kind is Kind.DECIMAL_TEXT and encoding.decimal_handling != "double"]
    view = without_trailing_zeros(read_table(spark, warehouse, table), texts)
    check = compare_frames(name, without_trailing_zeros(database, texts), view, table.key, compared)
    check.not_compared = [c.name for c in table.columns if not _compared(c, encoding)]
    return check, database


def verify(
    dsn: str,
    warehouse_dir: Path | str,
    tables: Sequence[str] | Mapping[str, TableShape],
    *,
    spark: SparkSession | None = None,
    encoding: Encoding | None = None,
    declared_section: SparkSection | None = None,
) -> VerifyReport:
    """Every warehouse table of ``tables``, and each view and index of ``declared_section``, against ``dsn``."""
    from cdc_views.session import build_session

    session = spark or build_session("cdc-verify")
    enc = encoding or Encoding()
    warehouse = Path(warehouse_dir)
    shapes = dict(tables) if isinstance(tables, Mapping) else read_shapes(dsn, list(tables))
    checks: list[ViewCheck] = []
    frames: dict[str, DataFrame] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        for name, table in shapes.items():
            check, frames[name] = _check_table(session, conn, warehouse, table, enc)
            log.info("verify.checked", view=check.name, ok=check.ok, differences=check.difference_count)
            checks.append(check)
    if declared_section is not None and (declared_section.views or declared_section.indexes):
        checks += _check_declared(session, warehouse, declared_section, frames)
    return VerifyReport(checks)


def _check_declared(
    spark: SparkSession, warehouse: Path, section: SparkSection, frames: Mapping[str, DataFrame]
) -> list[ViewCheck]:
    """Each declared view and index against the same SQL over the database's current rows."""
    declared.register(frames)
    checks: list[ViewCheck] = []
    for view in section.views:
        path = declared.view_path(warehouse, view.name)
        if not (path / "_delta_log").exists():
            checks.append(ViewCheck(f"view {view.name}", 0, 0, 0, error=f"no view at {path}: run the rebuild"))
            continue
        expected = spark.sql(view.sql)
        value_columns = [c for c in expected.columns if c not in view.key]
        check = compare_frames(f"view {view.name}", expected, read_view(spark, path), view.key, value_columns)
        log.info("verify.checked", view=check.name, ok=check.ok, differences=check.difference_count)
        checks.append(check)
    for index in section.indexes:
        path = declared.index_path(warehouse, index.name)
        try:
            indexed = declared.documents(path)
        except LookupError as exc:
            checks.append(ViewCheck(f"index {index.name}", 0, 0, 0, error=str(exc)))
            continue
        wanted = declared.expected_documents(
            index, (r.asDict(recursive=True) for r in spark.sql(index.sql).toLocalIterator())
        )
        fields = list(wanted[0]) if wanted else list(indexed[0]) if indexed else ["_id"]
        schema = StructType([StructField(f, StringType(), True) for f in fields])
        frames_of = [
            spark.createDataFrame([tuple(d.get(f, "") for f in fields) for d in docs], schema)
            for docs in (wanted, indexed)
        ]
        check = compare_frames(f"index {index.name}", frames_of[0], frames_of[1], ("_id",), fields[1:])
        log.info("verify.checked", view=check.name, ok=check.ok, differences=check.difference_count)
        checks.append(check)
    return checks
