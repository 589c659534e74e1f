"""Avro change topics: the Confluent wire format, decoded by Spark's own ``from_avro`` (spark-avro jar).

A record's key and value are each ``0x00``, a 4-byte big-endian schema id, then the Avro binary
body. ``AvroSchemas.scan(raw, registry)`` runs one Spark job over the records for the distinct
(topic, key schema id, value schema id) present, then fetches from the registry each writer
schema by id (``/schemas/ids/{id}``) and, per topic, the latest version of ``<topic>-value`` as
the reader schema. An id the registry does not know is remembered as unknown: its records become
bad records (reported with partition and offset), never a silent gap.

Every decode is ``from_avro(body, WRITER, {"avroSchema": READER, "mode": "PERMISSIVE"})``: in
spark-avro 3.5 (``AvroDataToCatalyst``) the second argument is the schema the bytes were written
with (``actualSchema``) and the ``avroSchema`` option the schema they are resolved to
(``expectedSchema``, which also gives the result's Spark type), as in Avro's own
``GenericDatumReader(writer, reader)``. One ``CASE`` over the schema id picks the writer, so each
record is decoded once per step, by its own writer schema, to the same Spark type. PERMISSIVE
turns a body that does not decode into a row of nulls, which the reader reports.

* Keys: decoded with their own writer schema and written as JSON text (``{"id":7}``), the same
  text the JSON format's keys have; it is the row identity (``_cdc_key``) and stays the same
  when a column is added (the key schema keeps its id) or an int key column is promoted to a
  long. Truncate markers have keys of their own schema (``<ns>.TruncateKey``): a record whose key
  schema is one of those is a marker.
* Envelopes (``envelope``): resolved to a reader that keeps only ``op`` and ``source.lsn``,
  ``source.ts_ms``, so classifying every record does not build its rows.
* Rows (``after``): only the latest record of each key, resolved to the topic's latest value
  schema (pruned to ``after``): older records get the new columns as null.

The schemas given to Spark differ from the registered ones in one way: a decimal Spark cannot
hold (precision above 38: ``money`` has 64) loses its ``logicalType`` and is read as the bytes
the JSON format has in base64, then converted by ``cdc_views.decode``.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import ArrayType, BinaryType, DataType, DecimalType, StringType, StructType

from cdc.sink.avro_diff import named_types
from cdc.sink.avro_schema import avro_field_name
from cdc.sink.registry import RegistryClient, RegistryError
from cdc.sink.wire import LEGACY_TRUNCATE_KEY_FIELD
from cdc_views.decode import decode, spark_type
from cdc_views.tables import ColumnShape, Encoding, Kind, TableShape

log = structlog.get_logger("cdc_views.avro")

_MAX_SPARK_PRECISION = 38
_OPTIONS = {"mode": "PERMISSIVE"}


class AvroSchemaError(RuntimeError):
    """The registry cannot be used, or holds schemas the jobs cannot read; names the URL and the fix."""


# --------------------------------------------------------------------------- the wire format


def framed(data: Column) -> Column:
    """True where ``data`` is in the Confluent wire format (magic byte 0, 4-byte id, a body)."""
    return (F.length(data) >= 5) & (F.substring(data, 1, 1) == F.lit(bytearray(b"\x00")))


def schema_id(data: Column) -> Column:
    """The schema id of a framed record (null where it is not framed)."""
    return F.when(framed(data), F.conv(F.hex(F.substring(data, 2, 4)), 16, 10).cast("long"))


def known_schema_id(data: Column, ids: Iterable[int]) -> Column:
    """``schema_id(data)``, found for the ``ids`` by comparing the record's first 5 bytes with theirs (magic byte,
    id): bytes compared, where ``schema_id`` makes two strings of every record (hex, then base 10) (#39)."""
    found = schema_id(data)
    prefix = F.substring(data, 1, 5)
    for sid in sorted(ids, reverse=True):
        if 0 <= sid < 2**32:
            found = F.when(prefix == F.lit(bytearray(b"\x00" + sid.to_bytes(4, "big"))), F.lit(sid)).otherwise(found)
    return found.cast("long")


def body(data: Column) -> Column:
    return data.substr(F.lit(6), F.length(data) - 5)


# --------------------------------------------------------------------------- schemas as Spark reads them


def _inline(node: Any, names: Mapping[str, Any], namespace: str) -> Any:
    """``node`` with a reference to a named type replaced by its definition (a field kept alone needs it)."""
    if isinstance(node, list):
        return [_inline(branch, names, namespace) for branch in node]
    if isinstance(node, str):
        full = node if "." in node else f"{namespace}.{node}"
        if full in names:
            return copy.deepcopy(names[full])
        return node
    return node


def _spark_ready(node: Any) -> Any:
    """A copy without ``logicalType: decimal`` where Spark's DecimalType cannot hold the precision."""
    if isinstance(node, list):
        return [_spark_ready(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _spark_ready(v) for k, v in node.items()}
    if out.get("logicalType") == "decimal":
        precision, scale = out.get("precision", 0), out.get("scale", 0)
        if not (0 < precision <= _MAX_SPARK_PRECISION and 0 <= scale <= precision):
            del out["logicalType"]
    return out


def _pruned(schema: dict[str, Any], keep: Mapping[str, Iterable[str] | None]) -> dict[str, Any]:
    """The envelope record with only the ``keep`` fields (a nested record's field list, or all of it)."""
    names = named_types(schema)
    namespace = schema.get("namespace", "")
    fields = []
    for f in schema["fields"]:
        if f["name"] not in keep:
            continue
        kept = dict(f, type=_inline(f["type"], names, namespace))
        inner = keep[f["name"]]
        if inner is not None:
            record = kept["type"]
            if not (isinstance(record, dict) and record.get("type") == "record"):
                raise AvroSchemaError(f"field {f['name']!r} of {schema.get('name')} is not a record: {record!r}")
            wanted = set(inner)
            kept["type"] = dict(record, fields=[g for g in record["fields"] if g["name"] in wanted])
        fields.append(kept)
    return dict(schema, fields=fields)


def _envelope_shape(decoded: Column, reader: Mapping[str, Any]) -> Column:
    """``decoded`` (read with ``reader``, a ``_pruned`` envelope) as struct<op, source: struct<lsn, ts_ms,
    sequence>> whatever the writer had: one type for every writer schema; a field the writer lacks (a
    ``sequence`` in a source block that has none) is null."""
    source_fields: list[dict[str, Any]] = next(
        (f["type"].get("fields", []) for f in reader["fields"] if f["name"] == "source"), []
    )
    have = {f["name"] for f in source_fields}
    types = {"lsn": "bigint", "ts_ms": "bigint", "sequence": "string"}
    source = F.struct(
        *[
            (decoded["source"][name] if name in have else F.lit(None)).cast(kind).alias(name)
            for name, kind in types.items()
        ]
    )
    return F.when(decoded.isNotNull(), F.struct(decoded["op"].alias("op"), source.alias("source")))


def _is_truncate_key(schema: Any) -> bool:
    """A truncate marker's key schema: the record ``<ns>.TruncateKey`` (the table's key fields, optional),
    or the legacy one-field record of ``__cdc_truncate_partition``."""
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return False
    return schema.get("name") == "TruncateKey" or [f.get("name") for f in schema.get("fields", [])] == [
        LEGACY_TRUNCATE_KEY_FIELD
    ]


@dataclass(frozen=True)
class TopicSchemas:
    """The schemas one topic's records were written with, and its reader schema."""

    topic: str
    reader: dict[str, Any] | None  # the latest value schema; None when no value was ever written
    reader_id: int | None


@dataclass
class AvroSchemas:
    """What ``from_avro`` needs for the records of one read (see the module docstring)."""

    registry_url: str
    writers: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> writer schema (Spark-ready)
    unknown: set[int] = field(default_factory=set)  # ids found in the records that the registry lacks
    topics: dict[str, TopicSchemas] = field(default_factory=dict)
    key_ids: set[int] = field(default_factory=set)
    value_ids: set[int] = field(default_factory=set)

    @classmethod
    def scan(cls, raw: DataFrame, registry: RegistryClient) -> AvroSchemas:
        """The distinct schema ids in ``raw`` (one Spark job), their schemas and each topic's reader."""
        try:
            registry.check_reachable()
        except RegistryError as exc:
            raise AvroSchemaError(f"{exc}. For the jobs: --registry URL or schema_registry.url in --config") from None
        ids = raw.select("topic", schema_id(F.col("key")).alias("k"), schema_id(F.col("value")).alias("v")).distinct()
        found = ids.collect()
        out = cls(registry.url)
        topics = {r["topic"] for r in found}
        out.key_ids = {int(r["k"]) for r in found if r["k"] is not None}
        out.value_ids = {int(r["v"]) for r in found if r["v"] is not None}
        try:
            for sid in sorted(out.key_ids | out.value_ids):
                text = registry.find_schema_text(sid)
                if text is None:
                    out.unknown.add(sid)
                    log.warning("avro.unknown_schema_id", schema_id=sid, registry=registry.url)
                else:
                    out.writers[sid] = _spark_ready(json.loads(text))
            for topic in sorted(topics):
                latest = registry.latest(f"{topic}-value")
                reader: dict[str, Any] | None
                reader_id: int | None
                if latest is not None:
                    reader, reader_id = _spark_ready(json.loads(latest.schema)), latest.id
                else:  # records under another subject name: the newest writer of the topic reads them all
                    present = sorted(int(r["v"]) for r in found if r["topic"] == topic and r["v"] in out.writers)
                    reader, reader_id = (out.writers[present[-1]], present[-1]) if present else (None, None)
                    log.warning("avro.no_value_subject", subject=f"{topic}-value", reader_id=reader_id)
                out.topics[topic] = TopicSchemas(topic, reader, reader_id)
        except RegistryError as exc:
            raise AvroSchemaError(f"{exc}. For the jobs: --registry URL or schema_registry.url in --config") from None
        log.info(
            "avro.schemas",
            topics=sorted(topics),
            key_ids=sorted(out.key_ids),
            value_ids=sorted(out.value_ids),
            unknown=sorted(out.unknown),
            readers={t: s.reader_id for t, s in out.topics.items()},
        )
        return out

    # --- keys -------------------------------------------------------------------

    def truncate_key_ids(self) -> list[int]:
        return sorted(i for i in self.key_ids if i in self.writers and _is_truncate_key(self.writers[i]))

    def key_text(self, key: Column, kid: Column) -> Column:
        """The decoded key (schema id ``kid``) as JSON text (``{}`` where the body does not decode)."""
        text: Column = F.lit(None).cast(StringType())
        for sid in sorted(self.key_ids & set(self.writers)):
            decoded = from_avro(body(key), json.dumps(self.writers[sid]), _OPTIONS)
            text = F.when(kid == sid, F.to_json(decoded)).otherwise(text)
        return text

    def key_problem(self, kid: Column, text: Column) -> Column:
        """Why a (non-null) key with schema id ``kid`` and decoded ``text`` is bad, or null."""
        return (
            F.when(kid.isNull(), F.lit("key is not in the Confluent Avro wire format (magic byte 0, 4-byte schema id)"))
            .when(kid.isin(*self.unknown) if self.unknown else F.lit(False), _unknown("key", kid, self.registry_url))
            # a marker's key fields are all null, which to_json writes as {} too: it is no decoding failure
            .when(
                (text == "{}") & ~self.is_marker(kid),
                F.concat(F.lit("key does not decode with its schema (id "), kid.cast("string"), F.lit(")")),
            )
        )

    def is_marker(self, kid: Column) -> Column:
        ids = self.truncate_key_ids()
        return kid.isin(*ids) if ids else F.lit(False)

    # --- values -----------------------------------------------------------------

    def envelope(self, value: Column, vid: Column) -> Column:
        """struct<op, source: struct<lsn, ts_ms, sequence>> of a value with schema id ``vid`` (null fields: no
        decode)."""
        env: Column = F.lit(None)
        for sid in sorted(self.value_ids & set(self.writers)):
            writer = self.writers[sid]
            reader = _pruned(writer, {"op": None, "source": ("lsn", "ts_ms", "sequence")})
            decoded = from_avro(body(value), json.dumps(writer), {**_OPTIONS, "avroSchema": json.dumps(reader)})
            env = F.when(vid == sid, _envelope_shape(decoded, reader)).otherwise(env)
        return env

    def value_problem(self, vid: Column, env: Column) -> Column:
        """Why a (non-null) value with schema id ``vid`` and decoded envelope ``env`` is bad, or null."""
        return (
            F.when(
                vid.isNull(), F.lit("value is not in the Confluent Avro wire format (magic byte 0, 4-byte schema id)")
            )
            .when(vid.isin(*self.unknown) if self.unknown else F.lit(False), _unknown("value", vid, self.registry_url))
            .when(
                env.isNull() | env["op"].isNull(),
                F.concat(F.lit("value does not decode with its schema (id "), vid.cast("string"), F.lit(")")),
            )
        )

    def after(self, topic: str, value: Column) -> Column | None:
        """The ``after`` row of a value resolved to the topic's latest value schema (None: no reader)."""
        schemas = self.topics.get(topic)
        if schemas is None or schemas.reader is None:
            return None
        pruned = _pruned(schemas.reader, {"after": None})
        reader = json.dumps(pruned)
        vid = known_schema_id(value, self.value_ids & set(self.writers))
        row: Column = F.lit(None)
        for sid in sorted(self.value_ids & set(self.writers)):
            writer = self.writers[sid]
            changed = _decimals_changed(pruned, writer)
            if not changed:
                decoded = from_avro(body(value), json.dumps(writer), {**_OPTIONS, "avroSchema": reader})
                row = F.when(vid == sid, decoded["after"]).otherwise(row)
                continue
            # Avro does not resolve a decimal's scale: bytes written at scale 2 read at scale 3 are ten
            # times too small. Read those columns at the writer's precision and scale, then cast each to
            # the reader's (exact when the scale grows; rounded half up, as PostgreSQL rounded the table,
            # when it shrinks). A value that does not fit the reader's precision (try_cast: null, where
            # ANSI's cast would fail the job naming no record) nulls the whole row, which decode_rows
            # reports as a bad record with its partition and offset.
            own = json.dumps(_with_decimals(pruned, changed))
            decoded = from_avro(body(value), json.dumps(writer), {**_OPTIONS, "avroSchema": own})["after"]
            rescaled = {name: decoded[name].try_cast(DecimalType(*changed[name][1])) for name in changed}
            fits = functools.reduce(
                lambda ok, name: ok & (decoded[name].isNull() | rescaled[name].isNotNull()), changed, F.lit(True)
            )
            fields = [rescaled.get(name, decoded[name]).alias(name) for name in _after_fields(pruned)]
            log.info(
                "avro.decimal_scale_resolved",
                topic=topic,
                writer_id=sid,
                columns={n: {"writer": w, "reader": r} for n, (w, r) in changed.items()},
            )
            row = F.when(vid == sid, F.when(decoded.isNotNull() & fits, F.struct(*fields))).otherwise(row)
        return row


def _after_record(envelope: dict[str, Any]) -> dict[str, Any] | None:
    """The record schema of an envelope's ``after`` field (its union's record branch), inlined."""
    names = named_types(envelope)
    for f in envelope.get("fields", ()):
        if f["name"] != "after":
            continue
        branches = f["type"] if isinstance(f["type"], list) else [f["type"]]
        for branch in branches:
            branch = _inline(branch, names, envelope.get("namespace", ""))
            if isinstance(branch, dict) and branch.get("type") == "record":
                return branch
    return None


def _after_fields(envelope: dict[str, Any]) -> list[str]:
    record = _after_record(envelope)
    return [f["name"] for f in record["fields"]] if record else []


def _decimal_of(node: Any) -> tuple[int, int] | None:
    """(precision, scale) of a decimal type, or of the decimal branch of a nullable union."""
    for branch in node if isinstance(node, list) else [node]:
        if isinstance(branch, dict) and branch.get("logicalType") == "decimal":
            return int(branch.get("precision", 0)), int(branch.get("scale", 0))
    return None


def _decimals_changed(
    reader: dict[str, Any], writer: dict[str, Any]
) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """The ``after`` columns that are decimals in both schemas with another precision or scale:
    name -> ((writer precision, scale), (reader precision, scale))."""
    r, w = _after_record(reader), _after_record(writer)
    if r is None or w is None:
        return {}
    written = {f["name"]: _decimal_of(f["type"]) for f in w["fields"]}
    out = {}
    for f in r["fields"]:
        mine, theirs = _decimal_of(f["type"]), written.get(f["name"])
        if mine is not None and theirs is not None and mine != theirs:
            out[f["name"]] = (theirs, mine)
    return out


def _with_decimals(
    envelope: dict[str, Any], changed: Mapping[str, tuple[tuple[int, int], tuple[int, int]]]
) -> dict[str, Any]:
    """``envelope`` (pruned to ``after``) with the ``changed`` columns' decimals at the writer's precision and scale."""
    out = copy.deepcopy(envelope)
    record = _after_record(out)
    assert record is not None
    for f in out["fields"]:
        if f["name"] == "after":
            f["type"] = ["null", record] if isinstance(f["type"], list) else record
    for f in record["fields"]:
        if f["name"] in changed:
            (precision, scale), _ = changed[f["name"]]
            for branch in f["type"] if isinstance(f["type"], list) else [f["type"]]:
                if isinstance(branch, dict) and branch.get("logicalType") == "decimal":
                    branch["precision"], branch["scale"] = precision, scale
    return out


def _unknown(what: str, sid: Column, url: str) -> Column:
    return F.concat(F.lit(f"{what} schema id "), sid.cast("string"), F.lit(f" is not in the schema registry at {url}"))


# --------------------------------------------------------------------------- typed columns


def column_value(row: Column, row_type: StructType, column: ColumnShape, encoding: Encoding) -> tuple[Column, Column]:
    """(typed value, failed) of a table column in a decoded ``after`` row of Spark type ``row_type``.

    A column the reader schema lacks (added upstream, not yet written) is null, not a failure.
    """
    name = avro_field_name(column.name)
    target = spark_type(column, encoding)
    if name not in row_type.fieldNames():
        return F.lit(None).cast(target), F.lit(False)
    raw = row[name]
    value = _convert(raw, row_type[name].dataType, column, encoding)
    if column.kind is Kind.ARRAY:
        present = F.size(F.filter(raw, lambda item: item.isNotNull()))
        converted = F.size(F.filter(value, lambda item: item.isNotNull()))
        return value, raw.isNotNull() & (value.isNull() | (present != converted))
    return value, raw.isNotNull() & value.isNull()


def _convert(raw: Column, have: DataType, column: ColumnShape, encoding: Encoding) -> Column:
    """A value as from_avro gives it -> the column's Spark type (``cdc_views.decode`` for what differs)."""
    target = spark_type(column, encoding)
    if have == target:
        return raw
    if column.kind is Kind.ARRAY and isinstance(have, ArrayType):
        assert column.element is not None
        element = column.element
        return F.transform(raw, lambda item: _convert(item, have.elementType, element, encoding))
    if isinstance(have, DecimalType):  # another precision or scale, plain text, or a double as decimal_handling asks:
        return raw.try_cast(target)  # null where it does not fit, reported as a failed column (ANSI cast: job error)
    if isinstance(have, BinaryType):  # a decimal Spark cannot hold as one: the JSON format's base64
        return decode(F.base64(raw), column, encoding)
    if isinstance(have, StructType):  # VariableScaleDecimal {scale, value}: its JSON text
        return decode(F.to_json(raw), column, encoding)
    # Anything else through its text, as the JSON format has it: a float's shortest text (1.1, not
    # 1.100000023841858), days and microseconds since the epoch, int16 from int
    return decode(raw.cast(StringType()), column, encoding)


def row_columns(
    row: Column, row_type: StructType, table: TableShape, encoding: Encoding
) -> list[tuple[Column, Column]]:
    return [column_value(row, row_type, c, encoding) for c in table.columns]
