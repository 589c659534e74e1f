"""Step 1 of the reading (``cdc_views.reader``): Kafka records -> one classified row per record.

``envelopes(raw, encoding, avro)`` gives each record's key text (the row identity), its position from
the ``cdc.lsn``/``cdc.commit_lsn``/``cdc.ordinal`` headers or, where a header is absent
(``kafka.position_headers: false``, the default), from the envelope: ``source.lsn``, the commit LSN
from ``source.sequence`` (``["<commit lsn>","<lsn>"]``), and no ordinal (records of one commit are then
placed by their LSN: ``cdc.sink.position``); a header that is present but not an integer makes the
record ``bad``. Then ``op``, ``after`` (JSON: its text; Avro: the value's bytes), and what the record
is: ``row``, ``delete``, ``truncate`` or ``bad`` with a reason. The steps after it are in
``cdc_views.reader``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, MapType, StringType, StructField, StructType

from cdc.sink.wire import COMMIT_LSN_HEADER, LEGACY_TRUNCATE_KEY_FIELD, LSN_HEADER, ORDINAL_HEADER
from cdc_views.tables import Encoding

if TYPE_CHECKING:
    from cdc_views.avro import AvroSchemas

_ENVELOPE = StructType(
    [
        StructField("op", StringType()),
        StructField("after", StringType()),  # the JSON text of the row object
        StructField(
            "source",
            StructType(
                [
                    StructField("lsn", LongType()),
                    StructField("ts_ms", LongType()),
                    StructField("sequence", StringType()),
                ]
            ),
        ),
    ]
)
_WRAPPED_ENVELOPE = StructType([StructField("payload", _ENVELOPE)])  # json.schemas_enable: true


def _header(name: str) -> Column:
    """The first header named ``name`` as text; null when absent. ``array_position`` over the header keys, not
    a ``filter`` lambda: a higher-order function has no generated code, and Spark then interprets the whole
    projection it is in (the envelope's parsing included) row by row (#39: a third of the read's CPU)."""
    position = F.array_position(F.col("headers.key"), F.lit(name))  # 1-based; 0 when absent, null without headers
    return F.get(F.col("headers"), position - 1)["value"].cast(StringType())  # get: null out of range (ANSI: no error)


def _long_header(name: str, has_headers: bool) -> tuple[Column, Column]:
    """(value, problem) of a header holding an integer: null when absent; a problem when present but not one."""
    if not has_headers:
        return F.lit(None).cast(LongType()), F.lit(None).cast(StringType())
    text = _header(name)
    value = text.try_cast(LongType())
    return value, F.when(text.isNotNull() & value.isNull(), F.lit(f"header {name} is not an integer"))


def envelopes(raw: DataFrame, encoding: Encoding, avro: AvroSchemas | None = None) -> DataFrame:
    """Kafka records -> one classified row per record (see the module docstring).

    ``encoding.format == "avro"`` needs ``avro``, the schemas of these records (``AvroSchemas.scan``);
    ``after`` is then the value's bytes, decoded by ``decode_rows`` for the latest records only.
    """
    has_headers = "headers" in raw.columns
    (lsn_header, lsn_bad), (commit_header, commit_bad), (ordinal_header, ordinal_bad) = (
        _long_header(name, has_headers) for name in (LSN_HEADER, COMMIT_LSN_HEADER, ORDINAL_HEADER)
    )
    headers = [
        lsn_header.alias("lsn_header"),
        commit_header.alias("commit_header"),
        ordinal_header.alias("ordinal"),
        F.coalesce(lsn_bad, commit_bad, ordinal_bad).alias("header_problem"),
    ]
    if encoding.format == "avro":
        if avro is None:
            raise ValueError("format avro: envelopes() needs the records' schemas (AvroSchemas.scan)")
        df = _avro_parts(raw, avro, headers)
    else:
        df = _json_parts(raw, encoding, headers)
    op = F.col("env.op")
    record, reason = _classify(op, check_after=encoding.format != "avro")
    lsn = F.coalesce(F.col("lsn_header"), F.col("env.source.lsn"))
    commit = F.coalesce(F.col("commit_header"), sequence_commit_lsn(F.col("env.source.sequence")), lsn)
    return df.select(
        "topic",
        "partition",
        "offset",
        F.col("key_text").alias("key"),
        record.alias("record"),
        reason.alias("reason"),
        op.alias("op"),
        lsn.alias("lsn"),
        commit.alias("commit_lsn"),
        F.col("ordinal"),  # null without the header: records of one commit are then placed by their LSN
        F.col("env.source.ts_ms").alias("ts_ms"),
        F.col("after"),
        F.col("after_scales"),
    )


_HEADER_COLUMNS = ("lsn_header", "commit_header", "ordinal", "header_problem")


def _avro_parts(raw: DataFrame, avro: AvroSchemas, headers: list[Column]) -> DataFrame:
    """The parts ``_classify`` reads of Avro records: key text, marker, envelope, problems; ``after`` is the
    value's bytes. Three projections, so that each schema id and each decode is computed once per record."""
    from cdc_views.avro import known_schema_id

    ids = raw.select(
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        known_schema_id(F.col("key"), avro.key_ids & set(avro.writers)).alias("kid"),
        known_schema_id(F.col("value"), avro.value_ids & set(avro.writers)).alias("vid"),
        *headers,
    )
    kid, vid = F.col("kid"), F.col("vid")
    decoded = ids.select(
        "*", avro.key_text(F.col("key"), kid).alias("key_text"), avro.envelope(F.col("value"), vid).alias("env")
    )
    return decoded.select(
        "topic",
        "partition",
        "offset",
        "key_text",
        F.col("key").isNull().alias("key_missing"),
        F.when(F.col("key").isNotNull(), avro.key_problem(kid, F.col("key_text"))).alias("key_problem"),
        avro.is_marker(kid).alias("is_marker"),
        F.col("value").isNull().alias("tombstone"),
        "env",
        F.col("value").alias("after"),
        *_HEADER_COLUMNS,
        F.when(F.col("value").isNotNull(), avro.value_problem(vid, F.col("env"))).alias("value_problem"),
        F.lit(None).cast(_SCALES).alias("after_scales"),  # Avro: the writer schema says (cdc_views.avro)
    )


def _json_parts(raw: DataFrame, encoding: Encoding, headers: list[Column]) -> DataFrame:
    """The parts ``_classify`` reads of JSON records: key text, marker, envelope, problems; ``after`` is the
    row object's text. Two projections, so that each ``from_json`` runs once per record (Spark keeps a
    projection whose expensive columns are referenced several times apart from the next one)."""
    key = F.col("key").cast(StringType())
    value = F.col("value").cast(StringType())
    parsed = (
        F.from_json(value, _WRAPPED_ENVELOPE)["payload"] if encoding.schemas_enable else F.from_json(value, _ENVELOPE)
    )
    key_map = F.from_json(key, "map<string,string>")
    if encoding.schemas_enable:
        key_map = F.from_json(F.get_json_object(key, "$.payload"), "map<string,string>")
        key = F.get_json_object(key, "$.payload")
    parsed_df = raw.select(
        "topic",
        "partition",
        "offset",
        key.alias("key_text"),
        key_map.alias("key_map"),
        value.isNull().alias("tombstone"),
        parsed.alias("env"),
        *headers,
        (_after_scales(value) if encoding.schemas_enable else F.lit(None).cast(_SCALES)).alias("after_scales"),
    )
    return parsed_df.select(
        "topic",
        "partition",
        "offset",
        "key_text",
        F.col("key_text").isNull().alias("key_missing"),
        F.when(F.col("key_map").isNull(), F.lit("key is not a JSON object")).alias("key_problem"),
        _json_marker_key(F.col("key_map")).alias("is_marker"),
        "tombstone",
        "env",
        F.col("env.after").alias("after"),
        *_HEADER_COLUMNS,
        F.lit(None).cast(StringType()).alias("value_problem"),
        "after_scales",
    )


_SCALES = MapType(StringType(), IntegerType())
_SCHEMA_FIELDS = ArrayType(
    StructType(
        [
            StructField("field", StringType()),
            StructField(
                "fields",
                ArrayType(
                    StructType(
                        [
                            StructField("field", StringType()),
                            StructField("parameters", MapType(StringType(), StringType())),
                        ]
                    )
                ),
            ),
        ]
    )
)


def sequence_commit_lsn(sequence: Column) -> Column:
    """The commit LSN in ``source.sequence`` (``["<commit lsn>","<lsn>"]``, decimal strings; null when
    the first is null or the text is not of that shape), as ``cdc.sink.position.parse_sequence`` reads it.
    ``try_cast``: a 19-digit number beyond a long is null (ANSI's cast would fail the job)."""
    text = F.regexp_extract(sequence, r'^\["([0-9]{1,19})",', 1)
    return F.when(text != "", text.try_cast(LongType()))


def _after_scales(value: Column) -> Column:
    """JSON with schemas: each ``after`` column's Decimal scale as this record's own schema block states it
    (``parameters.scale``). A record written before ``ALTER COLUMN ... TYPE numeric(p, s)`` carries its
    old scale: read at today's scale from the catalog it would be off by a power of ten."""
    fields = F.from_json(F.get_json_object(value, "$.schema.fields"), _SCHEMA_FIELDS)
    after = F.try_element_at(F.filter(fields, lambda f: f["field"] == "after"), F.lit(1))["fields"]
    with_scale = F.filter(after, lambda c: c["parameters"].getItem("scale").isNotNull())
    # a scale that is not an integer is null here, then reported by decode_rows (not read at a guessed scale)
    return F.map_from_entries(
        F.transform(
            with_scale, lambda c: F.struct(c["field"], c["parameters"].getItem("scale").try_cast(IntegerType()))
        )
    )


def _json_marker_key(key_map: Column) -> Column:
    """A truncate marker's JSON key: every key field null (or the legacy ``__cdc_truncate_partition``)."""
    distinct = F.array_distinct(F.map_values(key_map))  # keeps one null; no lambda (see _header)
    all_null = (F.size(key_map) > 0) & (F.size(distinct) == 1) & F.get(distinct, 0).isNull()
    legacy = key_map.getItem(LEGACY_TRUNCATE_KEY_FIELD).isNotNull()
    return F.coalesce(all_null | legacy, F.lit(False))


def _classify(op: Column, *, check_after: bool) -> tuple[Column, Column]:
    """(record kind, reason) of an envelope row; ``check_after``: a c/u/r needs a non-null ``after``
    (Avro rows are decoded after the reduction, where a missing ``after`` is reported)."""
    is_marker = F.col("is_marker")
    no_after = F.col("after").isNull() if check_after else F.lit(False)
    checks: list[tuple[Column, str, str | Column | None]] = [
        (F.col("key_missing"), "bad", "null key (a change topic's records are all keyed)"),
        (F.col("key_problem").isNotNull(), "bad", F.col("key_problem")),
        (F.col("header_problem").isNotNull(), "bad", F.col("header_problem")),
        (F.col("tombstone") & is_marker, "bad", "tombstone with a truncate marker's key"),
        (F.col("tombstone"), "delete", None),
        (F.col("value_problem").isNotNull(), "bad", F.col("value_problem")),
        (F.col("env").isNull() | op.isNull(), "bad", "value is not a Debezium envelope (no op)"),
        (is_marker & (op == "t"), "truncate", None),
        (is_marker, "bad", "a truncate marker's key (every key field null) but op is not 't'"),
        (op == "t", "bad", "op 't' under a row's key"),
        (op == "d", "delete", None),
        (op.isin("c", "u", "r") & no_after, "bad", "op c/u/r without an 'after' row"),
        (op.isin("c", "u", "r"), "row", None),
    ]
    record: Column = F.lit("bad")
    reason: Column = F.concat(F.lit("unexpected op "), F.coalesce(op, F.lit("null")))
    for condition, kind, why in reversed(checks):
        text = why if isinstance(why, Column) else F.lit(why).cast(StringType())
        record = F.when(condition, F.lit(kind)).otherwise(record)
        reason = F.when(condition, text).otherwise(reason)
    return record, reason
