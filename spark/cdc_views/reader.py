"""The one reading library of the jobs: change topics from offset 0 -> the latest state per key.

A table's topic is read with Spark's Kafka source (batch from the earliest offsets, or as a stream)
and reduced in four steps, each a plain DataFrame transformation, so batch jobs and streaming
micro-batches share them (``reduce_records`` runs steps 0-2):

0. ``compacted(raw)``: the records Kafka's log compaction keeps, found before any is parsed: per
   partition and key (its bytes) the last record. Superseded records (a tombstone's delete event
   among them) are not parsed, decoded or checked: the jobs read a topic as the log cleaner leaves
   it, so their result and the bad records they report are the same before and after compaction.
1. ``envelopes(raw, encoding, avro)`` (``cdc_views.envelope``): one row per record: the key's text
   (the row identity), its position from the ``cdc.lsn``/``cdc.commit_lsn``/``cdc.ordinal`` headers
   or, where a header is absent (``kafka.position_headers: false``), from the envelope
   (``source.lsn``; the commit LSN from ``source.sequence``, ``["<commit lsn>","<lsn>"]``; no
   ordinal: see ``cdc.sink.position``); a header present but not an integer makes the record bad;
   ``op``, ``after`` (JSON: its text; Avro: the value's bytes), and what the record is:
   ``row`` (c/u/r), ``delete`` (d or a tombstone), ``truncate`` (a marker: op ``t`` with the
   table's key fields all null, ``{"id":null}``; topics written before that shape carry the key
   ``{"__cdc_truncate_partition":p}``, still recognised) or ``bad`` (key or value that is not what
   the connector writes; with a reason).
2. ``latest(envelopes)``: the last record of each key in offset order (a key lives in one
   partition), a tombstone without a position taking its delete event's where the records read hold
   it (the jobs read ``compacted`` records, where they do not: such a delete has no position, and is
   applied whatever the row's); markers (one key on every partition) keep their latest per partition; every bad
   record stays, on its own. After step 0 this rarely changes anything: ``reduce_records`` runs it
   (``latest_of_kept``) only where two kept records share a group, which one small aggregate checks.
3. ``decode_rows(latest, table, encoding, avro)``: the ``after`` of each row parsed and converted to
   typed columns (see ``decode``); a present value that does not convert makes the record ``bad``.
   JSON without the schema block: each Decimal at the scale of its table's version in force at the
   record's ``(commit LSN, ordinal)``, from the schema history (``schema_history``, ``cdc_views.history``).
   A column holding the connector's unchanged-TOAST placeholder is null there and named in
   ``_cdc_placeholders``; ``Changes.placeholders`` counts such records, which ``cdc_views.toast.resolve``
   then fills with the key's previous values (the jobs call it: ``jobs.fill_placeholders``).

``Changes.of(...)`` then persists the decoded records, takes the truncate markers (a marker at offset
o of partition p discards every record of p below o), collects bad records, and fails with
``UndecodableRecords`` (partition and offset of each, up to a limit, and the count) unless
``on_bad_record="skip"``, in which case they are left out, counted and logged. Superseded records
are not checked (step 0). ``Changes.unpersist()`` frees the decoded records.

Columns of the reduced rows: the table's columns, then the ``META`` columns:
``_cdc_key`` (key text), ``_cdc_partition``, ``_cdc_offset``, ``_cdc_lsn``, ``_cdc_commit_lsn``
(the commit LSN, or the event LSN when unknown), ``_cdc_op``, ``_cdc_ts_ms`` (commit time), and
``_cdc_action``: ``upsert``, ``delete`` or ``keep`` (a skipped bad record of a known key: the view
keeps what it has for that key).

Formats (``Encoding.format``): ``json`` (Debezium JSON, with or without the schema block) and
``avro`` (Confluent wire format: magic byte 0, 4-byte schema id, Avro body). For Avro,
``avro_schemas(raw, encoding, registry)`` first finds the schema ids in the records and fetches
their schemas (``cdc_views.avro.AvroSchemas``); step 1 decodes keys and envelopes with Spark's
``from_avro`` per writer schema, step 3 resolves the latest records' ``after`` to the topic's
latest value schema; step 2 and everything after are the same for both formats. A wrong magic
byte, an unknown schema id or a body that does not decode is a ``bad`` record; a registry that
does not answer is ``RegistryUnavailable``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import structlog
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from cdc_views.decode import decode, failed, row_schema
from cdc_views.envelope import envelopes as envelopes  # re-exported: step 1 of the reading
from cdc_views.history import SchemaHistory, TableVersions
from cdc_views.tables import Encoding, Kind, TableShape
from cdc_views.toast import PLACEHOLDERS, avro_placeholder, json_placeholder, placeholder_names

if TYPE_CHECKING:
    from cdc.sink.registry import RegistryClient
    from cdc_views.avro import AvroSchemas

log = structlog.get_logger("cdc_views.reader")

OnBadRecord = Literal["fail", "skip"]
META = ("_cdc_key", "_cdc_partition", "_cdc_offset", "_cdc_lsn", "_cdc_commit_lsn", "_cdc_op", "_cdc_ts_ms")
REPORTED_BAD_RECORDS = 20


class ReadError(RuntimeError):
    """A topic cannot be read as a change topic; the message names the problem and the fix."""


class TopicNotFound(ReadError):
    pass


class RegistryUnavailable(ReadError):
    """Format avro: the schema registry does not answer (or refuses); names the URL and the fix."""


@dataclass(frozen=True, slots=True)
class BadRecord:
    topic: str
    partition: int
    offset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.topic} partition {self.partition} offset {self.offset}: {self.reason}"


class UndecodableRecords(ReadError):
    def __init__(self, topic: str, count: int, examples: Sequence[BadRecord]) -> None:
        self.topic = topic
        self.count = count
        self.examples = list(examples)
        listed = "; ".join(str(b) for b in self.examples)
        more = f" (first {len(self.examples)} listed)" if count > len(self.examples) else ""
        super().__init__(
            f"{count} record(s) of topic {topic} do not decode{more}: {listed}. Fix what produced them, or run "
            "with on_bad_record='skip' (--on-bad-record skip) to leave them out; skipped records are counted and logged"
        )


@dataclass(frozen=True, slots=True)
class KafkaSource:
    """Where the topics are, and any extra consumer settings (``security.protocol``, ``sasl.*``...)."""

    bootstrap: str
    settings: Mapping[str, str] = field(default_factory=dict)

    def spark_options(self) -> dict[str, str]:
        options = {f"kafka.{k}": v for k, v in self.settings.items()}
        options["kafka.bootstrap.servers"] = self.bootstrap
        return options

    def existing_topics(self, timeout_s: float = 15.0) -> set[str]:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.settings})
        try:
            return set(admin.list_topics(timeout=timeout_s).topics)
        except KafkaException as exc:
            raise ReadError(f"cannot list the topics of Kafka at {self.bootstrap}: {exc}; is the broker up?") from exc


def check_topics(source: KafkaSource, topics: Sequence[str]) -> None:
    """``TopicNotFound`` naming every missing topic (Spark would otherwise wait or read nothing)."""
    existing = source.existing_topics()
    missing = [t for t in topics if t not in existing]
    if missing:
        prefixes = sorted({t.split(".", 1)[0] for t in existing if not t.startswith("__")})
        raise TopicNotFound(
            f"topic(s) {', '.join(missing)} do not exist on {source.bootstrap}: check the topic prefix and the table "
            "names, and that the connector captures these tables and has run (some topic prefixes there: "
            f"{prefixes[:10]})"
        )


def read_batch(spark: SparkSession, source: KafkaSource, topics: Sequence[str]) -> DataFrame:
    """Every record now in the topics, from the earliest offsets (one bounded batch read)."""
    check_topics(source, topics)
    return (
        spark.read.format("kafka")
        .options(**source.spark_options())
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "false")  # compaction removes offsets: that is not loss
        .load()
    )


def read_stream(
    spark: SparkSession, source: KafkaSource, topics: Sequence[str], max_offsets_per_trigger: int | None = None
) -> DataFrame:
    """The topics as a stream from the earliest offsets (a checkpoint, when there is one, wins)."""
    check_topics(source, topics)
    reader = (
        spark.readStream.format("kafka")
        .options(**source.spark_options())
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "false")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()


# --------------------------------------------------------------------------- step 0


def compacted(raw: DataFrame) -> DataFrame:
    """Kafka records -> the records Kafka's log compaction keeps, before any is parsed: per topic, partition and
    key (its bytes, as the log cleaner compares them) the last record. A record without a key stays on its own
    (``envelopes`` makes it ``bad``). A tombstone's delete event is superseded too, so a tombstone written
    without position headers has no position, as it has once the cleaner has run; a delete without a position
    is applied whatever the row's (``warehouse.NOT_OLDER``).

    So a rebuild parses what a compacted topic holds, not every superseded version of each key: the records
    ``latest`` reduces further, and ``Changes`` checks, are the same whether or not the cleaner has run (#39:
    the envelope's ``from_json`` of every record was half a rebuild's CPU). One sort-based aggregate, carrying
    only what the grouping does not give (a key lives in one partition, which one task reads, so its partial
    aggregate already keeps one record per key)."""
    carried = F.struct(*[c for c in ("offset", "value", "headers") if c in raw.columns])
    unkeyed = F.when(F.col("key").isNull(), F.col("offset"))  # null for a keyed record: grouped by its key
    last = raw.groupBy(
        F.xxhash64("key", "partition", unkeyed).alias("_hash"),  # a long first: its sort prefix tells groups apart
        "topic",
        "partition",
        "key",
        unkeyed.alias("_unkeyed"),
    ).agg(F.max_by(carried, F.col("offset")).alias("_last"))
    return last.select("topic", "partition", "key", "_last.*")


# --------------------------------------------------------------------------- step 1: cdc_views.envelope
# --------------------------------------------------------------------------- step 2


def latest(env: DataFrame) -> DataFrame:
    """The last record of each key (offset order); each bad record kept on its own. A last record without a
    position (a tombstone written without position headers) takes the key's last record with one among
    ``env``: its delete event, the record before it, when ``env`` holds it (not after ``compacted``)."""
    group = _latest_group()
    carried = [c for c in env.columns if c not in ("topic",)]
    positioned = F.when(F.col("lsn").isNotNull(), F.col("offset"))  # max_by skips a null ordering
    # max_by over a struct has no fixed-width buffer, so Spark aggregates by sorting every record on the
    # grouping columns. A hash of the group first makes that sort a radix sort on a long: the topic (the
    # same in every record) and the key text (``{"id":...``: the same first bytes) give its 8-byte sort
    # prefix nothing to tell records apart by, and every comparison then reads both strings (#39).
    reduced = (
        env.withColumn("_group", group)
        .groupBy(F.xxhash64("topic", "_group").alias("_hash"), "topic", "_group")
        .agg(
            F.max_by(F.struct(*carried), F.col("offset")).alias("last"),
            F.max_by(F.struct("lsn", "commit_lsn", "ordinal"), positioned).alias("_pos"),
        )
    )
    inherit = F.col("last.lsn").isNull() & (F.col("last.record") == "delete")
    position = {
        n: F.when(inherit, F.col(f"_pos.{n}")).otherwise(F.col(f"last.{n}")) for n in ("lsn", "commit_lsn", "ordinal")
    }
    return reduced.select("topic", *[position[c].alias(c) if c in position else F.col(f"last.{c}") for c in carried])


def _latest_group() -> Column:
    """What ``latest`` reduces by: the key text; a bad record's own partition and offset; a partition's markers."""
    return (
        F.when(
            F.col("record") == "bad",
            F.concat(
                F.lit("\u0000bad:"), F.col("partition").cast("string"), F.lit(":"), F.col("offset").cast("string")
            ),
        )
        # every partition's markers share one key: the latest marker of each partition counts
        .when(F.col("record") == "truncate", F.concat(F.lit("\u0000truncate:"), F.col("partition").cast("string")))
        .otherwise(F.col("key"))
    )


def latest_of_kept(env: DataFrame) -> DataFrame:
    """``latest(env)`` of the envelopes of ``compacted`` records, persisted (``unpersist()`` when done).

    ``compacted`` already kept one record per partition and key bytes, so ``latest`` changes nothing unless two
    kept records share its group: a key's text in two partitions (a topic whose partition count changed), two
    encodings of one key (Avro keys under two schema ids), a partition's truncate markers under two key shapes.
    One aggregate of the groups alone (no envelope carried) checks that; where none is shared the envelopes are
    the result, else ``latest`` runs over them (#39: its sort-based aggregate shuffled every kept envelope, its
    ``after`` text included, only to find each alone in its group). The same rows and columns either way."""
    env = env.persist(StorageLevel.MEMORY_AND_DISK)
    group = _latest_group()
    try:
        shared = (
            env.groupBy(F.xxhash64("topic", group).alias("_hash"), "topic", group.alias("_group"))
            .count()
            .where(F.col("count") > 1)
            .limit(1)
            .collect()
        )
    except BaseException:
        env.unpersist()  # the caller gets no frame to unpersist
        raise
    if not shared:
        return env
    try:
        reduced = latest(env).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            reduced.count()  # computed while ``env`` is still cached
        except BaseException:
            reduced.unpersist()
            raise
    finally:
        env.unpersist()
    return reduced


# --------------------------------------------------------------------------- step 3


@dataclass
class _Typed:
    """The typed columns of the latest records, before they are assembled: ``decode_rows``' one format's part."""

    parsed: DataFrame  # the reduced records with ``_row``, the parsed ``after``
    typed: list[Column] = field(default_factory=list)  # one per table column, aliased
    failures: list[tuple[Column, str | Column]] = field(default_factory=list)  # (fails, column or problem)
    flags: list[tuple[Column, str]] = field(default_factory=list)  # (is the placeholder, column): cdc_views.toast
    missing: str = ""  # the reason when ``after`` is not a row


def decode_rows(
    reduced: DataFrame,
    table: TableShape,
    encoding: Encoding,
    avro: AvroSchemas | None = None,
    *,
    topic: str = "",
    history: TableVersions | None = None,
) -> DataFrame:
    """Rows with typed columns; ``record`` becomes ``bad`` (with the column named) where a value fails.

    Avro: ``reduced`` holds ``topic`` only; its rows are resolved to the topic's latest value schema.
    ``history``: JSON without the schema block, each Decimal read at the scale of the table's version in
    force at the record's position (``cdc_views.history``); a Decimal no readable version covers fails.
    """
    if encoding.format == "avro":
        if avro is None:
            raise ValueError("format avro: decode_rows() needs the records' schemas (AvroSchemas.scan)")
        part = _avro_typed(reduced, table, encoding, avro, topic)
    else:
        part = _json_typed(reduced, table, encoding, history)
    row_ok = (F.col("record") == "row") & F.col("_row").isNotNull()
    reason: Column = F.lit(None).cast(StringType())
    for condition, name in reversed(part.failures):
        why = name if isinstance(name, Column) else F.lit(f"column {name!r}: value cannot be converted")
        reason = F.when(condition, why).otherwise(reason)
    reason = F.when(F.col("record") == "row", F.when(F.col("_row").isNull(), F.lit(part.missing)).otherwise(reason))
    decoded = part.parsed.select(
        "topic",
        "partition",
        "offset",
        "key",
        "record",
        "reason",
        "op",
        "lsn",
        "commit_lsn",
        "ts_ms",
        reason.alias("_decode_error"),
        *[F.when(row_ok, value) for value in part.typed],
        F.when(row_ok, placeholder_names(part.flags)),
    )
    decoded = decoded.toDF(*decoded.columns[:11], *[c.name for c in table.columns], PLACEHOLDERS)
    is_bad = F.col("_decode_error").isNotNull()
    return (
        decoded.withColumn("reason", F.when(is_bad, F.col("_decode_error")).otherwise(F.col("reason")))
        .withColumn("record", F.when(is_bad, F.lit("bad_row")).otherwise(F.col("record")))
        .drop("_decode_error")
    )


def _avro_typed(reduced: DataFrame, table: TableShape, encoding: Encoding, avro: AvroSchemas, topic: str) -> _Typed:
    """Avro: ``after`` (the value's bytes) resolved to the topic's latest value schema, then each column."""
    from cdc_views.avro import column_value

    after = avro.after(topic, F.col("after"))
    if after is None:  # no value was ever written: only deletes and markers
        parsed = reduced.withColumn("_row", F.lit(None).cast(StructType([])))
    else:
        parsed = reduced.withColumn("_row", F.when(F.col("record") == "row", after))
    row_type = parsed.schema["_row"].dataType
    assert isinstance(row_type, StructType)
    part = _Typed(
        parsed,
        missing=(
            "'after' is missing or does not decode with the topic's latest value schema (or a decimal"
            " written before a type change does not fit the latest precision)"
        ),
    )
    for column in table.columns:
        value, bad = column_value(F.col("_row"), row_type, column, encoding)
        placeholder = avro_placeholder(F.col("_row"), row_type, column, encoding.unavailable_value)
        if placeholder is not None:  # the placeholder is no value: null here, and no decode failure
            value, bad = F.when(~placeholder, value), bad & ~placeholder
            part.flags.append((placeholder, column.name))
        part.typed.append(value.alias(column.name))
        part.failures.append((bad, column.name))
    return part


def _json_typed(reduced: DataFrame, table: TableShape, encoding: Encoding, history: TableVersions | None) -> _Typed:
    """JSON: ``after`` (the row object's text) parsed to the table's row type, then each column, a Decimal at
    the scale its record's schema block or the schema history states."""
    parsed = reduced.withColumn("_row", F.from_json(F.col("after"), row_schema(table.columns)))
    versions = history if history is not None and any(c.kind is Kind.DECIMAL for c in table.columns) else None
    if versions is not None:
        parsed = parsed.withColumn("_version", versions.index(F.col("commit_lsn"), F.col("ordinal"), F.col("lsn")))
    part = _Typed(parsed, missing="'after' is not a JSON object")
    for column in table.columns:
        raw = F.col("_row").getField(column.name)
        scale = F.element_at(F.col("after_scales"), F.lit(column.name)) if encoding.schemas_enable else None
        placeholder = json_placeholder(raw, column, encoding.unavailable_value)
        mine: list[tuple[Column, str | Column]] = []
        if versions is not None and column.kind is Kind.DECIMAL:
            index = F.col("_version")
            problem = versions.problem(index, F.col("commit_lsn"), F.col("ordinal"), F.col("lsn"))
            value = F.when(problem.isNull(), decode(raw, column, encoding, scale=versions.scale(column.name, index)))
            mine.append((raw.isNotNull() & problem.isNotNull(), F.concat(F.lit(f"column {column.name!r}: "), problem)))
        else:
            value = decode(raw, column, encoding, scale=scale)
            if scale is not None and column.kind is Kind.DECIMAL and encoding.decimal_handling == "precise":
                no_scale = F.lit(f"column {column.name!r}: the record's schema block states no Decimal scale")
                mine.append((raw.isNotNull() & scale.isNull(), no_scale))
        mine.append((failed(raw, value, column), column.name))
        if placeholder is not None:  # the placeholder is no value: null here, and no decode failure
            value = F.when(~placeholder, value)
            mine = [(condition & ~placeholder, why) for condition, why in mine]
            part.flags.append((placeholder, column.name))
        part.typed.append(value.alias(column.name))
        part.failures.extend(mine)
    return part


# --------------------------------------------------------------------------- the whole read


@dataclass
class Changes:
    """What one read of a table's topic says: the latest row or deletion of each key, and markers."""

    table: TableShape
    rows: DataFrame  # table columns + META + _cdc_action, one row per key
    truncates: dict[int, int]  # partition -> offset of its latest truncate marker
    bad_count: int
    bad: list[BadRecord]
    decoded: DataFrame | None = None  # the persisted decoded records ``rows`` reads; see ``unpersist``
    placeholders: int = 0  # latest records holding the unchanged-TOAST placeholder (cdc_views.toast)
    placeholders_filled: int = 0  # of their column values, those filled with the key's previous value
    placeholders_unresolved: int = 0  # ... those skipped (written as null): on_bad_record='skip'
    also_persisted: list[DataFrame] = field(default_factory=list)  # further frames ``rows`` reads (toast.resolve)

    def unpersist(self) -> None:
        """Free the decoded records ``rows`` reads (call when the view is written)."""
        if self.decoded is not None:
            self.decoded.unpersist()
        for frame in self.also_persisted:
            frame.unpersist()

    @classmethod
    def of(
        cls,
        reduced: DataFrame,
        table: TableShape,
        encoding: Encoding,
        *,
        topic: str,
        on_bad_record: OnBadRecord = "fail",
        avro: AvroSchemas | None = None,
        history: SchemaHistory | None = None,
    ) -> Changes:
        """From one topic's reduced records (``latest``); persist ``reduced``: it is read twice."""
        return cls.of_topics(reduced, {topic: table}, encoding, on_bad_record, avro, history)[topic]

    @classmethod
    def of_topics(
        cls,
        reduced: DataFrame,
        tables: Mapping[str, TableShape],
        encoding: Encoding,
        on_bad_record: OnBadRecord = "fail",
        avro: AvroSchemas | None = None,
        history: SchemaHistory | None = None,
    ) -> dict[str, Changes]:
        """For each ``topic: table`` of ``reduced`` (several topics), checked in one Spark job.

        ``UndecodableRecords`` (for the first topic that has any) unless ``on_bad_record='skip'``.
        ``avro``: the schemas of the records ``reduced`` came from (format avro). ``history``: the schema
        history (``read_history``), which JSON without the schema block needs for Decimals.
        """
        # Persisted, each record is decoded once for the check and the rows; and a filter on ``record``
        # (a function of every decoded column) is not pushed below the decoding, where Spark would
        # inline the from_json/from_avro of ``after`` once per reference to it.
        decoded = {
            t: decode_rows(
                reduced.where(F.col("topic") == t),
                table,
                encoding,
                avro,
                topic=t,
                history=history.of(table.qualified) if history is not None else None,
            ).persist(StorageLevel.MEMORY_AND_DISK)
            for t, table in tables.items()
        }
        try:
            summaries = _summaries(list(decoded.values()))
            out: dict[str, Changes] = {}
            for topic, table in tables.items():
                truncates, bad_count, bad, placeholders = summaries.get(topic, ({}, 0, [], 0))
                if bad_count and on_bad_record == "fail":
                    raise UndecodableRecords(topic, bad_count, bad)
                if bad_count:
                    log.warning(
                        "reader.bad_records_skipped", topic=topic, count=bad_count, first=[str(b) for b in bad[:5]]
                    )
                rows = _rows(decoded[topic], table, truncates)
                out[topic] = cls(table, rows, truncates, bad_count, bad, decoded[topic], placeholders)
        except BaseException:
            for frame in decoded.values():
                frame.unpersist()
            raise
        return out


def _rows(decoded: DataFrame, table: TableShape, truncates: Mapping[int, int]) -> DataFrame:
    kept = decoded.where(F.col("record").isin("row", "delete", "bad_row") & ~_truncated(truncates))
    action = F.when(F.col("record") == "row", "upsert").when(F.col("record") == "delete", "delete").otherwise("keep")
    return kept.select(
        *[F.col(c.name) for c in table.columns],
        F.col("key").alias("_cdc_key"),
        F.col("partition").alias("_cdc_partition"),
        F.col("offset").alias("_cdc_offset"),
        F.col("lsn").alias("_cdc_lsn"),
        F.coalesce(F.col("commit_lsn"), F.col("lsn")).alias("_cdc_commit_lsn"),
        F.col("op").alias("_cdc_op"),
        F.col("ts_ms").alias("_cdc_ts_ms"),
        action.alias("_cdc_action"),
    )


Summary = tuple[dict[int, int], int, list[BadRecord], int]


def _summaries(decoded: Sequence[DataFrame]) -> dict[str, Summary]:
    """Per topic: truncate markers per partition, bad records (count, first few) and rows holding the
    unchanged-TOAST placeholder (count); one Spark job."""
    if not decoded:  # a micro-batch with no record, e.g. the first one over empty topics
        return {}
    columns = ["topic", "record", "partition", "offset", "reason"]
    holds = (F.col("record") == "row") & F.col(PLACEHOLDERS).isNotNull()
    special = functools.reduce(
        DataFrame.unionByName,
        [
            d.where(F.col("record").isin("truncate", "bad", "bad_row") | holds).select(
                *columns,
                F.when(holds, "placeholder")
                .when(F.col("record") == "truncate", "truncate")
                .otherwise("bad")
                .alias("kind"),
            )
            for d in decoded
        ],
    )
    first = F.when(F.col("kind") == "bad", F.struct("offset", "reason"))  # collect_list skips the nulls
    grouped = special.groupBy("topic", "kind", "partition").agg(
        F.count(F.lit(1)).alias("n"),
        F.max("offset").alias("last"),
        F.slice(F.sort_array(F.collect_list(first)), 1, REPORTED_BAD_RECORDS).alias("first"),
    )
    out: dict[str, Summary] = {}
    for row in grouped.collect():
        truncates, bad_count, bad, placeholders = out.setdefault(row["topic"], ({}, 0, [], 0))
        if row["kind"] == "truncate":
            truncates[int(row["partition"])] = int(row["last"])
        elif row["kind"] == "placeholder":
            out[row["topic"]] = (truncates, bad_count, bad, placeholders + int(row["n"]))
        else:
            bad += [
                BadRecord(row["topic"], int(row["partition"]), int(b["offset"]), str(b["reason"])) for b in row["first"]
            ]
            out[row["topic"]] = (truncates, bad_count + int(row["n"]), bad, placeholders)
    for topic, (truncates, bad_count, bad, placeholders) in out.items():
        bad.sort(key=lambda b: (b.partition, b.offset))
        out[topic] = (truncates, bad_count, bad[:REPORTED_BAD_RECORDS], placeholders)
    return out


def _truncated(truncates: Mapping[int, int]) -> Column:
    condition: Column = F.lit(False)
    for partition, offset in truncates.items():
        condition = condition | ((F.col("partition") == partition) & (F.col("offset") < offset))
    return condition


def avro_schemas(raw: DataFrame, encoding: Encoding, registry: RegistryClient | None) -> AvroSchemas | None:
    """The schemas of ``raw``'s records for format avro (one Spark job and registry look-ups), else None."""
    if encoding.format != "avro":
        return None
    if registry is None:
        raise ReadError(
            "format avro needs the schema registry: give --registry URL, or a --config with schema_registry.url"
        )
    from cdc_views.avro import AvroSchemaError, AvroSchemas

    try:
        return AvroSchemas.scan(raw, registry)
    except AvroSchemaError as exc:
        raise RegistryUnavailable(str(exc)) from None


def table_changes(
    spark: SparkSession,
    source: KafkaSource,
    table: TableShape,
    topic: str,
    encoding: Encoding,
    on_bad_record: OnBadRecord = "fail",
    registry: RegistryClient | None = None,
    history: SchemaHistory | None = None,
) -> Changes:
    """A batch read of one table's topic from offset 0, reduced to its latest state (``reduce_records``; the decoded
    records are persisted: ``Changes.unpersist()`` when done). Unchanged-TOAST
    placeholders are left null (``Changes.placeholders``); the jobs fill them (``jobs.fill_placeholders``).

    JSON without the schema block: give ``history`` (``schema_history(source, topic_prefix, encoding)``)."""
    reduced, avro = reduce_records(read_batch(spark, source, [topic]), encoding, registry)
    try:
        return Changes.of(
            reduced, table, encoding, topic=topic, on_bad_record=on_bad_record, avro=avro, history=history
        )
    finally:
        reduced.unpersist()  # the decoded records are persisted now (Changes.decoded): ``rows`` reads those


def schema_history(source: KafkaSource, topic_prefix: str, encoding: Encoding) -> SchemaHistory | None:
    """The schema history when ``encoding``'s records need it (``cdc_views.history.needed``), else None;
    read before the records, so that it covers every record read after it."""
    from cdc_views.history import needed, read_history

    if not needed(encoding):
        return None
    return read_history(source.bootstrap, source.settings, topic_prefix)


def reduce_topics(
    spark: SparkSession,
    source: KafkaSource,
    topics: Sequence[str],
    encoding: Encoding,
    registry: RegistryClient | None = None,
) -> tuple[DataFrame, AvroSchemas | None]:
    """One batch read of several topics from offset 0, reduced (``latest``) and persisted; and, for
    format avro, the records' schemas (``registry`` needed), which ``Changes.of_topics`` takes.

    Take a topic's part with ``.where(F.col("topic") == topic)``; ``unpersist()`` when done.
    """
    return reduce_records(read_batch(spark, source, topics), encoding, registry)


def reduce_records(
    raw: DataFrame, encoding: Encoding, registry: RegistryClient | None = None
) -> tuple[DataFrame, AvroSchemas | None]:
    """``compacted``, ``envelopes`` and ``latest`` of Kafka records (a batch read or a micro-batch), persisted;
    and, for format avro, the schemas of the records kept (``avro_schemas`` of those, not of every record: the
    superseded ones are neither decoded nor looked at). ``unpersist()`` when done."""
    kept = compacted(raw)
    if encoding.format != "avro":
        return latest_of_kept(envelopes(kept, encoding)), None
    kept = kept.persist(StorageLevel.MEMORY_AND_DISK)  # read twice: its schema ids, then its envelopes
    try:
        avro = avro_schemas(kept, encoding, registry)
        reduced = latest_of_kept(envelopes(kept, encoding, avro))  # computed while ``kept`` is still cached
    finally:
        kept.unpersist()
    return reduced, avro
