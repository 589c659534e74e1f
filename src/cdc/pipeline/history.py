"""Publishing the schema history (``cdc.schema_history``): what a reader needs to read every record exactly.

1. Start-up (``SchemaHistory.load``): the versions already in ``<topic_prefix>.__cdc_schema`` are read, as
   read_committed consumers see them.
2. Start-up and reload (``publish_catalog``), before any record of a table is written (the initial
   snapshot included): a table with no version gets the catalog's at position ``0/0:0``; one whose
   catalog types are not those of its version in force gets them at the server's current WAL position
   (they changed while no daemon streamed). Produced and acknowledged before the daemon goes on.
3. Streaming (``SchemaHistoryStage``): the decoder announces each Relation message of a captured table
   (``RelationEvent``: the columns hold from the next change of its transaction). When the types differ
   from the version in force at that position, the new version is sent with ``Delivery.send`` inside
   the source transaction, before the change that uses it: the same Kafka transaction in exactly-once
   mode; in at-least-once mode the transaction's end LSN is confirmed only once it is acknowledged too.
   Row changes never pass through the stage (``sees_rows`` is False): the row path gains nothing.
4. DBLog chunks (``observe``, per released chunk): rows read with the catalog at the chunk's read are
   emitted at the high watermark; if an ALTER committed before the read but no change of the table
   followed (no Relation message yet), their types are not the version in force there, and one is
   published at the chunk's first row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg
import structlog
from confluent_kafka import KafkaError, Producer

from cdc.event import Event, PgType, RelationEvent, TableInfo, TableSchema
from cdc.lsn import Lsn
from cdc.pipeline.stages import Stage
from cdc.schema_history import (
    BEGINNING,
    TOPIC_SUFFIX,
    History,
    Position,
    SchemaHistoryError,
    SchemaVersion,
    decode,
    topic_for,
)
from cdc.sink.delivery import Delivery, RetryableSinkError
from cdc.sink.kafka import SinkError, read_to_end
from cdc.sink.record import Record
from cdc.snapshot.plan import describe_table

log = structlog.get_logger("cdc.pipeline.history")

_WHAT = "schema history"


WriteNow = Callable[[Sequence[Record]], None]
"""Produces records and returns once Kafka acknowledged them all (raises ``SinkError`` otherwise)."""


def acknowledged_writer(producer_config: Mapping[str, Any], timeout: float = 30.0) -> WriteNow:
    """A ``WriteNow`` over its own idempotent, non-transactional producer, made at its first use."""
    made: list[Producer] = []

    def write_now(records: Sequence[Record]) -> None:
        if not made:
            made.append(Producer({k: v for k, v in producer_config.items() if k != "transactional.id"}))
        producer = made[0]
        errors: list[str] = []

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for record in records:
            producer.produce(
                record.topic, record.value, record.key, partition=record.partition or 0, on_delivery=delivered
            )
        left = producer.flush(timeout)
        if left or errors:
            topics = sorted({r.topic for r in records})
            raise RetryableSinkError(
                f"Kafka did not acknowledge {len(records)} schema history record(s) for {', '.join(topics)} within "
                f"{timeout:.0f}s ({'; '.join(errors[:3]) or f'{left} unacknowledged'}). Fix: check that the broker is "
                "up and that this daemon may write the topic"
            )

    return write_now


class SchemaHistory:
    """The versions published so far, and the producing of new ones.

    ``write_now``: where versions are made durable at once (start-up versions; and a new version before
    the records that use it are produced, so that no consumer sees such a record before its version,
    whatever partition is acknowledged first). None: only through the delivery (tests)."""

    def __init__(self, topic: str, history: History | None = None, write_now: WriteNow | None = None) -> None:
        self.topic = topic
        self.history = history if history is not None else History()
        self.write_now = write_now

    @classmethod
    def load(
        cls,
        topic_prefix: str,
        bootstrap: str,
        extra: Mapping[str, Any],
        timeout: float = 60.0,
        write_now: WriteNow | None = None,
    ) -> SchemaHistory:
        topic = topic_for(topic_prefix)
        history = History()
        count = 0

        def record(key: bytes | None, value: bytes | None) -> None:
            nonlocal count
            try:
                version = decode(key, value)
            except SchemaHistoryError as e:
                raise SinkError(
                    f"a record of the schema history topic {topic} cannot be read: {e}. Fix: remove what wrote it "
                    "(only the daemon writes this topic)"
                ) from None
            if version is not None:
                history.add(version)
                count += 1

        read_to_end(
            bootstrap,
            extra,
            topic,
            group_id=f"cdc-schema-history-{topic_prefix}",
            what="the schema history topic",
            on_record=record,
            timeout=timeout,
        )
        log.info("schema_history_loaded", topic=topic, versions=count, tables=len(history.tables()))
        return cls(topic, history, write_now)

    def refresh(self, bootstrap: str, extra: Mapping[str, Any], timeout: float = 60.0) -> None:
        """The versions as Kafka holds them now (a new replication session starts from the acknowledged
        position; what the last one produced without an acknowledgement must be published again)."""
        prefix = self.topic[: -len(TOPIC_SUFFIX) - 1]
        self.history = SchemaHistory.load(prefix, bootstrap, extra, timeout).history

    def record(self, version: SchemaVersion) -> Record:
        return Record(self.topic, version.key(), version.value(), partition=0)

    def differs(
        self, table: TableSchema, position: Position, *, replayable: bool = False, after_lsn: int | None = None
    ) -> SchemaVersion | None:
        """The version to publish for ``table``'s columns from ``position``, or None when the one in force
        there has the same types. ``replayable`` (the stream): compared with the version before
        ``position``, so that a source transaction sent again publishes its version again, at the same
        key, and produces the same records as the first time (exactly once resumes inside a split
        transaction by counting them). ``after_lsn``: ``SchemaVersion.after_lsn``."""
        version = SchemaVersion.of(table, position, after_lsn)
        if replayable:
            current = self.history.before(table.qualified, position)
        else:
            current = self.history.in_force(table.qualified, position)
        if current is not None and current.shape == version.shape:
            return None
        return version

    def publish_catalog(
        self,
        conn: psycopg.Connection[Any],
        tables: Iterable[TableInfo],
        types: Mapping[int, PgType],
    ) -> list[SchemaVersion]:
        """The catalog's columns of each table where they are not the version in force now, produced and
        acknowledged before this returns (start-up, and tables a reload adds; before any of their records).

        A table without any version gets it at ``0/0:0`` (it covers the records already in its topic). One
        whose types changed while no daemon streamed gets it at the server's WAL position read first: a
        snapshot starting now reads those types, at a later position. Records the stream replays from before
        that position come with Relation messages of their own types, which the stage compares with the
        version in force at their positions. Raises ``SinkError`` when Kafka does not acknowledge them."""
        row = conn.execute(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text"
        ).fetchone()
        now: Position = (int(Lsn.parse(str(row[0]))), 0) if row is not None and row[0] is not None else BEGINNING
        versions = []
        for info in tables:
            schema = describe_table(conn, info, types).schema
            position = now if self.history.versions(info.qualified) else BEGINNING
            version = self.differs(schema, position, after_lsn=0)  # from the first change of whatever commits there
            if version is not None:
                versions.append(version)
        return self._publish_now(versions, "schema_history_from_catalog")

    def publish_snapshot(self, tables: Iterable[TableSchema], point: Lsn) -> list[SchemaVersion]:
        """The columns an initial snapshot reads its rows with (the catalog in its exported snapshot),
        where they are not the version in force at its rows' position ``(point, ordinal >= 1)``: published
        at ``(point, 0)``, acknowledged before any row is read. They differ only when an ALTER committed
        between the start-up's catalog read (``publish_catalog``) and the snapshot's export."""
        position: Position = (int(point), 0)
        versions = [v for v in (self.differs(t, position, after_lsn=0) for t in tables) if v is not None]
        return self._publish_now(versions, "schema_history_from_snapshot")

    def _publish_now(self, versions: list[SchemaVersion], event: str) -> list[SchemaVersion]:
        """``versions`` produced and acknowledged (``write_now``), then in force here; logged as ``event``."""
        if not versions:
            return []
        if self.write_now is None:
            raise SinkError(f"the schema history has no writer for {event} (wiring error)")
        self.write_now([self.record(v) for v in versions])
        for version in versions:
            self.history.add(version)
            log.info(event, table=version.table, position=_position_text(version.position))
        return versions


class SchemaHistoryStage(Stage):
    """Consumes the decoder's ``RelationEvent``s, publishing a version where the types changed."""

    def __init__(self, history: SchemaHistory, delivery: Delivery) -> None:
        self._history = history
        self._send = delivery.send

    def sees_rows(self, table: str) -> bool:
        return False

    def process(self, event: Event) -> Event | None:
        if type(event) is RelationEvent:
            self.observe(event.table, (int(event.commit_lsn), event.ordinal), event.after_lsn)
            return None
        return event

    def observe(self, table: TableSchema, position: Position, after_lsn: int) -> None:
        """``table``'s columns hold from ``position``, i.e. for the changes of its transaction with an LSN
        above ``after_lsn`` (inside the open source transaction): published when they differ from the
        version in force there."""
        version = self._history.differs(table, position, replayable=True, after_lsn=after_lsn)
        if version is None:
            return
        record = self._history.record(version)
        if self._history.write_now is not None:
            self._history.write_now([record])
        self._send(record, _WHAT)
        self._history.history.add(version)
        log.info(
            "schema_version_published",
            table=version.table,
            position=_position_text(position),
            columns=len(version.columns),
        )


def _position_text(position: Position) -> str:
    return f"{Lsn(position[0])}:{position[1]}"
