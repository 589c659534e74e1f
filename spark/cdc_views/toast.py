"""Unchanged TOASTed values: the connector's placeholder never reaches a table, a view or an index.

Under ``REPLICA IDENTITY DEFAULT`` an UPDATE that leaves a large (TOASTed) value alone does not carry
it; a connector in ``toast.mode: placeholder`` (or Debezium) writes ``__debezium_unavailable_value``
(its ``toast.placeholder``, ``Encoding.unavailable_value``) in its place: text, json and unknown types
get the text, bytea (and JSON Decimals) its UTF-8 bytes (base64 in JSON), arrays of integers those
bytes as numbers, other arrays a one-element list (``cdc.sink.typemap.toast_placeholder``,
``cdc.sink.avro._placeholder``). Records written before the connector filled these values may still
hold it.

Two steps, both Spark expressions (no Python UDFs):

1. Detection (``json_placeholder``, ``avro_placeholder``), in ``decode_rows`` for the latest record of
   each key only, and only for the columns that can hold one (varlena types, ``may_hold_placeholder``):
   such a value decodes to null, is not a decode failure, and its column is named in the record's
   ``_cdc_placeholders`` array; ``Changes.placeholders`` counts the records that have any. Without
   placeholders nothing else runs.
2. ``resolve(changes, ...)``, only for a table whose latest records hold some: each such column takes
   the same key's previous value, from the latest earlier record of that key in the same read (batch:
   the topic from offset 0; continuous: the micro-batch) that holds a real value and follows the key's
   last delete, or failing that from the existing warehouse row (a value is held when it is not null:
   an unchanged TOASTed value is never NULL). Where neither holds one (compaction removed the earlier
   records and the warehouse never had them), the job fails with ``UnresolvedPlaceholders`` naming
   the table, and the key, column, partition and offset of each (up to 20); with
   ``on_bad_record='skip'`` the column is written as null, the warehouse's previous value, which is
   none (counted in ``Changes.placeholders_unresolved`` and logged as ``toast.placeholders_unresolved_skipped``);
   the values filled are counted in ``Changes.placeholders_filled`` and logged as ``toast.placeholders_filled``.
"""

from __future__ import annotations

import base64
import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import structlog
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, ShortType, StringType, StructType

from cdc.sink.avro_schema import avro_field_name
from cdc_views.tables import ColumnShape, Encoding, Kind, TableShape

if TYPE_CHECKING:
    from cdc_views.avro import AvroSchemas
    from cdc_views.history import TableVersions
    from cdc_views.reader import Changes, OnBadRecord

log = structlog.get_logger("cdc_views.toast")

PLACEHOLDERS = "_cdc_placeholders"  # decoded records: the columns whose value was the placeholder
REPORTED = 20
_TOASTABLE_KINDS = frozenset(
    {Kind.TEXT, Kind.JSON, Kind.BYTES, Kind.DECIMAL, Kind.DECIMAL_TEXT, Kind.ARRAY, Kind.OTHER}
)
_INT_ELEMENTS = frozenset({"int2", "int4", "int8"})  # cdc.sink.typemap: such arrays get the bytes as numbers


def may_hold_placeholder(column: ColumnShape) -> bool:
    """A varlena column (from the catalog's ``typlen``), or one whose kind may be varlena when not read from one."""
    if column.toastable is not None:
        return column.toastable
    return column.kind in _TOASTABLE_KINDS


def toastable_columns(table: TableShape) -> list[ColumnShape]:
    return [c for c in table.columns if may_hold_placeholder(c) and c.name not in table.key]


def _int_array(column: ColumnShape) -> bool:
    return column.kind is Kind.ARRAY and column.element is not None and column.element.type_name in _INT_ELEMENTS


def json_placeholder(raw: Column, column: ColumnShape, text: str) -> Column | None:
    """True where ``raw`` (the column's JSON text, as ``decode`` takes it) is the placeholder; None when the
    column cannot hold one. Never null."""
    if not may_hold_placeholder(column):
        return None
    b64 = base64.b64encode(text.encode()).decode()
    if column.kind is Kind.ARRAY:
        expected = [str(b) for b in text.encode()] if _int_array(column) else [text]
        short = F.length(raw) <= 4 * len(text.encode()) + 8 + 4 * len(text)  # a cheap guard before parsing
        found = F.when(short, F.from_json(raw, ArrayType(StringType(), True)) == F.array(*[F.lit(e) for e in expected]))
    elif column.kind is Kind.BYTES:
        found = raw == F.lit(b64)
    elif column.kind in (Kind.DECIMAL, Kind.DECIMAL_TEXT):  # a Decimal's bytes (precise), else the text
        found = raw.isin(b64, text)
    else:
        found = raw == F.lit(text)
    return F.coalesce(found, F.lit(False))


def avro_placeholder(row: Column, row_type: StructType, column: ColumnShape, text: str) -> Column | None:
    """As ``json_placeholder`` for a decoded Avro ``after`` row (``cdc.sink.avro._placeholder``)."""
    if not may_hold_placeholder(column):
        return None
    name = avro_field_name(column.name)
    if name not in row_type.fieldNames():
        return None
    raw, have = row[name], row_type[name].dataType
    found: Column | None = None
    if isinstance(have, StringType):
        found = raw == F.lit(text)
    elif isinstance(have, BinaryType) and column.kind is Kind.BYTES:
        found = raw == F.lit(bytearray(text.encode()))
    elif isinstance(have, ArrayType) and isinstance(have.elementType, StringType):
        found = raw == F.array(F.lit(text))
    elif isinstance(have, ArrayType) and isinstance(have.elementType, (ShortType, IntegerType, LongType)):
        element = have.elementType
        found = raw == F.array(*[F.lit(b).cast(element) for b in text.encode()])
    return None if found is None else F.coalesce(found, F.lit(False))


def placeholder_names(flags: Sequence[tuple[Column, str]]) -> Column:
    """The ``_cdc_placeholders`` column: the names of the columns whose flag is true, null when none."""
    if not flags:
        return F.lit(None).cast(ArrayType(StringType(), True))
    names = F.filter(F.array(*[F.when(flag, F.lit(name)) for flag, name in flags]), lambda n: n.isNotNull())
    return F.when(functools.reduce(operator.or_, [flag for flag, _ in flags]), names)  # the array only when needed


# --------------------------------------------------------------------------- step 2: resolve


@dataclass(frozen=True, slots=True)
class Unresolved:
    key: str
    column: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"key {self.key} column {self.column!r} partition {self.partition} offset {self.offset}"


class UnresolvedPlaceholders(RuntimeError):
    """Placeholders whose previous value neither the topic nor the warehouse holds; names each."""

    def __init__(self, table: str, topic: str, placeholder: str, count: int, examples: Sequence[Unresolved]) -> None:
        self.table, self.topic, self.count, self.examples = table, topic, count, list(examples)
        listed = "; ".join(str(u) for u in self.examples)
        more = f" (first {len(self.examples)} listed)" if count > len(self.examples) else ""
        super().__init__(
            f"table {table} (topic {topic}): {count} column value(s) are the placeholder {placeholder!r} (an unchanged "
            f"TOASTed value an UPDATE did not carry) and neither an earlier record of the key in the topic nor the "
            f"warehouse row holds the previous value (compaction removed the key's earlier records){more}: {listed}. "
            "Fix: have the connector fill these values (toast.mode: fill, or REPLICA IDENTITY FULL on the table) and "
            "re-snapshot the table so its topic holds them again; or run with on_bad_record='skip' "
            "(--on-bad-record skip) to write these columns as null, counted and logged"
        )


def resolve(
    changes: Changes,
    *,
    topic: str,
    earlier: DataFrame,
    previous: DataFrame | None,
    encoding: Encoding,
    avro: AvroSchemas | None = None,
    history: TableVersions | None = None,
    on_bad_record: OnBadRecord = "fail",
) -> Changes:
    """``changes`` (a table whose latest records hold placeholders) with each placeholder replaced by the key's
    previous value: from ``earlier`` (the same read's envelopes, ``cdc_views.envelope.envelopes``, of any topics)
    or ``previous`` (the warehouse table, None when there is none); see the module docstring."""
    from cdc_views.reader import _rows, _truncated

    table = changes.table
    decoded = changes.decoded
    assert decoded is not None
    columns = [c.name for c in toastable_columns(table)]
    holds = F.coalesce(
        (F.col("record") == "row") & F.col(PLACEHOLDERS).isNotNull() & ~_truncated(changes.truncates), F.lit(False)
    )
    held = decoded.where(holds)
    fine = decoded.where(~holds)

    # the earlier records of the keys whose latest record holds a placeholder, decoded like the latest ones
    found = _earlier_values(held, earlier, changes, topic, columns, encoding, avro, history)
    fixed = _filled(held, found, previous, columns, decoded.columns).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        stats = _fill_report(fixed, table.qualified, topic, encoding.unavailable_value, on_bad_record)
    except BaseException:
        fixed.unpersist()
        raise
    rows = _rows(fine.unionByName(fixed.select(*decoded.columns)), table, changes.truncates)
    return replace(
        changes,
        rows=rows,
        placeholders_filled=stats.filled,
        placeholders_unresolved=stats.missing,
        also_persisted=[*changes.also_persisted, fixed],
    )


def _earlier_values(
    held: DataFrame,
    earlier: DataFrame,
    changes: Changes,
    topic: str,
    columns: list[str],
    encoding: Encoding,
    avro: AvroSchemas | None,
    history: TableVersions | None,
) -> DataFrame:
    """Per key of ``held``: column ``_topic{i}`` the last value of ``columns[i]`` its earlier records wrote,
    null where none did or a delete came after it (decoded like the latest records)."""
    from cdc_views.reader import _truncated, decode_rows

    targets = held.select(
        F.col("key").alias("_t_key"), F.col("partition").alias("_t_partition"), F.col("offset").alias("_t_offset")
    )
    prior = (
        earlier.where(F.col("topic") == topic)
        .join(targets, (F.col("key") == F.col("_t_key")) & (F.col("partition") == F.col("_t_partition")), "inner")
        .where((F.col("offset") < F.col("_t_offset")) & ~_truncated(changes.truncates))
        .drop("_t_key", "_t_partition", "_t_offset")
    )
    values = decode_rows(prior, changes.table, encoding, avro, topic=topic, history=history)
    row = F.col("record") == "row"
    aggregates = [F.max(F.when(F.col("record") == "delete", F.col("offset"))).alias("_deleted")]
    for i, name in enumerate(columns):
        value = F.struct(F.col("offset").alias("o"), F.col(name).alias("v"))
        aggregates.append(F.max_by(value, F.when(row & F.col(name).isNotNull(), F.col("offset"))).alias(f"_e{i}"))
    found = values.groupBy(F.col("key").alias("_f_key")).agg(*aggregates)
    return found.select(
        "_f_key",
        *[
            F.when(F.col("_deleted").isNull() | (F.col(f"_e{i}.o") > F.col("_deleted")), F.col(f"_e{i}.v")).alias(
                f"_topic{i}"
            )
            for i in range(len(columns))
        ],
    )


def _filled(
    held: DataFrame, found: DataFrame, previous: DataFrame | None, columns: list[str], decoded_columns: list[str]
) -> DataFrame:
    """``held`` with each placeholder replaced by the topic's earlier value, else the warehouse's; besides,
    ``_missing`` (the columns neither holds) and the counts ``_from_topic`` and ``_from_warehouse``."""
    joined = held.join(found, F.col("key") == F.col("_f_key"), "left")
    if previous is not None:
        kept = [c for c in columns if c in previous.columns]
        warehouse = previous.select(
            F.col("_cdc_key").alias("_w_key"), *[F.col(c).alias(f"_w{columns.index(c)}") for c in kept]
        )
        joined = joined.join(warehouse, F.col("key") == F.col("_w_key"), "left")
    else:
        kept = []
    out: dict[str, Column] = {}
    unresolved: list[Column] = []
    from_topic: list[Column] = []
    from_warehouse: list[Column] = []
    for i, name in enumerate(columns):
        is_placeholder = F.coalesce(F.array_contains(F.col(PLACEHOLDERS), F.lit(name)), F.lit(False))
        topic_value = F.col(f"_topic{i}")
        warehouse_value = F.col(f"_w{i}") if name in kept else F.lit(None)
        out[name] = F.when(is_placeholder, F.coalesce(topic_value, warehouse_value)).otherwise(F.col(name))
        unresolved.append(F.when(is_placeholder & topic_value.isNull() & warehouse_value.isNull(), F.lit(name)))
        from_topic.append(F.when(is_placeholder & topic_value.isNotNull(), F.lit(1)).otherwise(F.lit(0)))
        from_warehouse.append(
            F.when(is_placeholder & topic_value.isNull() & warehouse_value.isNotNull(), F.lit(1)).otherwise(F.lit(0))
        )
    missing = F.filter(F.array(*unresolved), lambda n: n.isNotNull())
    return joined.select(
        *[out[c].alias(c) if c in out else F.col(c) for c in decoded_columns],
        missing.alias("_missing"),
        functools.reduce(operator.add, from_topic).alias("_from_topic"),
        functools.reduce(operator.add, from_warehouse).alias("_from_warehouse"),
    )


@dataclass(frozen=True)
class FillStats:
    """What a fill did: placeholder values filled (from the topic or the warehouse) and those neither held."""

    filled: int
    missing: int


def _fill_report(fixed: DataFrame, table: str, topic: str, placeholder: str, on_bad_record: OnBadRecord) -> FillStats:
    """Count what ``_filled`` did, log it, and raise ``UnresolvedPlaceholders`` for a value neither source
    holds unless ``on_bad_record`` is ``skip`` (the value is then written as null, and said so)."""
    stats = fixed.agg(
        F.count(F.lit(1)).alias("records"),
        F.coalesce(F.sum("_from_topic"), F.lit(0)).alias("from_topic"),
        F.coalesce(F.sum("_from_warehouse"), F.lit(0)).alias("from_warehouse"),
        F.coalesce(F.sum(F.size("_missing")), F.lit(0)).alias("missing"),
        F.slice(
            F.sort_array(
                F.collect_list(F.when(F.size("_missing") > 0, F.struct("partition", "offset", "key", "_missing")))
            ),
            1,
            REPORTED,
        ).alias("first"),
    ).first()
    assert stats is not None
    examples = [
        Unresolved(str(r["key"]), str(c), int(r["partition"]), int(r["offset"]))
        for r in stats["first"]
        for c in r["_missing"]
    ]
    missing_count = int(stats["missing"])
    if missing_count and on_bad_record == "fail":
        raise UnresolvedPlaceholders(table, topic, placeholder, missing_count, examples[:REPORTED])
    log.info(
        "toast.placeholders_filled",
        table=table,
        topic=topic,
        records=int(stats["records"]),
        from_topic=int(stats["from_topic"]),
        from_warehouse=int(stats["from_warehouse"]),
    )
    if missing_count:
        log.warning(
            "toast.placeholders_unresolved_skipped",
            table=table,
            topic=topic,
            count=missing_count,
            written_as="null",
            first=[str(u) for u in examples[:5]],
        )
    return FillStats(int(stats["from_topic"]) + int(stats["from_warehouse"]), missing_count)
