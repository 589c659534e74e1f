"""The schema history topic (``cdc.schema_history``), for JSON without the schema block.

Such a record does not say its Decimal's scale: after ``ALTER COLUMN ... TYPE numeric(14,3)`` the records
written before hold their values at the old scale. The connector publishes each table's column types as
they change to ``<topic_prefix>.__cdc_schema``, with the position ``(commit LSN, ordinal)`` from which
they hold. ``read_history`` reads that topic (in the driver, before the records); ``TableVersions``
turns it into Spark expressions: the index of the version in force at each record's position (from its
``cdc.commit_lsn``/``cdc.ordinal`` headers; without them, the envelope's commit LSN and LSN, compared with
each version's ``after_lsn``: ``cdc.schema_history``), a Decimal column's scale in that version, and the reason a
record cannot be read exactly (no version covers it, or its version's record cannot be read), which
``cdc_views.reader.decode_rows`` reports naming topic, partition, offset and column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import orjson
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType

from cdc.schema_history import SchemaHistoryError, SchemaVersion, decode, topic_for
from cdc_views.tables import Encoding

log = structlog.get_logger("cdc_views.history")

Position = tuple[int, int]


def needed(encoding: Encoding) -> bool:
    """Whether records of this encoding need the history to be read exactly: JSON without the schema
    block, Decimals as Kafka Connect Decimals (the scale is not in the value)."""
    return encoding.format == "json" and not encoding.schemas_enable and encoding.decimal_handling == "precise"


@dataclass(frozen=True, slots=True)
class Entry:
    """One record of the topic: a version, or why the version at its position cannot be read."""

    position: Position
    offset: int
    version: SchemaVersion | None
    error: str | None = None


@dataclass
class TableVersions:
    """The versions of one table, oldest first, as Spark expressions."""

    topic: str  # the schema history topic
    table: str
    entries: list[Entry] = field(default_factory=list)

    def index(self, commit_lsn: Column, ordinal: Column, lsn: Column) -> Column:
        """The index in ``entries`` of the version in force at each record's position; -1 before the first.

        Within the version's own commit a record is placed by its ordinal (``cdc.ordinal``) or, without one,
        by its LSN: above the version's ``after_lsn``. A version written before versions recorded their LSN, met
        by a record without an ordinal in its own commit, is taken as in force: such a version holds from its
        table's first change in that commit unless the table was altered between two of its changes there."""
        found: Column = F.lit(-1)
        for i, entry in enumerate(self.entries):
            commit_from, ordinal_from = entry.position
            after_lsn = entry.version.after_lsn if entry.version is not None else None
            if ordinal_from == 0 or after_lsn == 0:
                within: Column = F.lit(True)
            elif after_lsn is None:
                within = F.coalesce(ordinal >= F.lit(ordinal_from), F.lit(True))
            else:
                within = F.when(ordinal.isNotNull(), ordinal >= F.lit(ordinal_from)).otherwise(lsn > F.lit(after_lsn))
            at_or_after = (commit_lsn > F.lit(commit_from)) | ((commit_lsn == F.lit(commit_from)) & within)
            found = F.when(at_or_after, F.lit(i)).otherwise(found)
        return found

    def scale(self, column: str, index: Column) -> Column:
        """``column``'s numeric scale in the version at ``index`` (null where it states none)."""
        scales: list[Column] = []
        for entry in self.entries:
            value = None
            if entry.version is not None:
                value = next((c.scale for c in entry.version.columns if c.name == column), None)
            scales.append(F.lit(value).cast(IntegerType()))
        if not scales:
            return F.lit(None).cast(IntegerType())
        return F.when(index >= 0, F.element_at(F.array(*scales), index + 1))

    def problem(self, index: Column, commit_lsn: Column, ordinal: Column, lsn: Column) -> Column:
        """Why a Decimal of the record cannot be read exactly (null: it can)."""
        within = F.when(ordinal.isNotNull(), F.concat(F.lit(", ordinal "), ordinal.cast(StringType()))).otherwise(
            F.concat(F.lit(", LSN "), F.coalesce(lsn.cast(StringType()), F.lit("unknown")))
        )
        where = F.concat(F.lit("commit LSN "), F.coalesce(commit_lsn.cast(StringType()), F.lit("unknown")), within)
        missing = F.concat(
            F.lit(f"no version of {self.table} in the schema history topic {self.topic} covers this record ("),
            where,
            F.lit(
                "), so the scale it wrote its Decimal at is unknown. Fix: run a connector that publishes the schema "
                "history (it writes every captured table's version at start-up), then re-snapshot the table so that "
                "its topic holds only records the history covers; or read with json.schemas_enable: true or format avro"
            ),
        )
        reason: Column = F.when(index < 0, missing)
        for i, entry in enumerate(self.entries):
            if entry.error is not None:
                unreadable = (
                    f"its version in the schema history topic {self.topic} (partition 0, offset {entry.offset}) "
                    "cannot be "
                    f"read: {entry.error}. Fix: upgrade the jobs to the connector's version, or remove what wrote "
                    "that record"
                )
                reason = F.when(index == i, F.lit(unreadable)).otherwise(reason)
        return reason


@dataclass
class SchemaHistory:
    topic: str
    tables: dict[str, list[Entry]] = field(default_factory=dict)

    def of(self, table: str) -> TableVersions:
        return TableVersions(self.topic, table, self.tables.get(table, []))

    @classmethod
    def of_records(cls, topic: str, records: Sequence[tuple[int, bytes | None, bytes | None]]) -> SchemaHistory:
        """From ``(offset, key, value)`` in offset order; the last record of a key wins (compaction's rule)."""
        latest: dict[tuple[str, Position], Entry] = {}
        for offset, key, value in records:
            table, position = _key(topic, offset, key)
            if value is None:
                latest.pop((table, position), None)
                continue
            try:
                version = decode(key, value)
                entry = Entry(position, offset, version)
            except SchemaHistoryError as e:
                entry = Entry(position, offset, None, str(e))
            latest[(table, position)] = entry
        history = cls(topic)
        for (table, _), entry in sorted(latest.items(), key=lambda item: (item[0][0], item[1].position)):
            history.tables.setdefault(table, []).append(entry)
        return history


def _key(topic: str, offset: int, key: bytes | None) -> tuple[str, Position]:
    try:
        data = orjson.loads(key or b"")
        table, lsn, ordinal = data["table"], data["commit_lsn"], data["ordinal"]
        if not (isinstance(table, str) and type(lsn) is int and type(ordinal) is int):
            raise TypeError("a field has the wrong type")
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise SchemaHistoryReadError(
            f"record at offset {offset} of the schema history topic {topic} has a key that is not a table and position "
            f"({type(e).__name__}: {e}). Fix: remove what wrote it (only the connector writes this topic)"
        ) from None
    return table, (lsn, ordinal)


class SchemaHistoryReadError(RuntimeError):
    """The schema history topic cannot be read; the message names the problem and the fix."""


def read_history(
    bootstrap: str, settings: Mapping[str, str], topic_prefix: str, timeout_s: float = 60.0
) -> SchemaHistory:
    """Every record of ``<topic_prefix>.__cdc_schema`` now there (read_committed), in the driver. A missing
    topic has no versions (records with Decimals are then reported, not guessed)."""
    topic = topic_for(topic_prefix)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **settings,
            "group.id": f"cdc-views-schema-history-{topic_prefix}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    records: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            log.warning("history.topic_missing", topic=topic)
            return SchemaHistory(topic)
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout_s)
        if high > low:
            consumer.assign([TopicPartition(topic, 0, low)])
            while True:
                msg = consumer.poll(timeout_s)
                if msg is None:
                    raise SchemaHistoryReadError(f"reading the schema history topic {topic} took over {timeout_s:.0f}s")
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        break
                    raise SchemaHistoryReadError(f"cannot read the schema history topic {topic}: {err}")
                offset = msg.offset()
                assert offset is not None
                records.append((offset, msg.key(), msg.value()))
                if offset + 1 >= high:
                    break
    except KafkaException as e:
        raise SchemaHistoryReadError(
            f"cannot read the schema history topic {topic} on {bootstrap}: {e}; is the broker up?"
        ) from e
    finally:
        consumer.close()
    history = SchemaHistory.of_records(topic, records)
    log.info("history.read", topic=topic, records=len(records), tables=len(history.tables))
    return history
