"""Format-neutral record planning: which records an event becomes, their keys' rules, the source block
and the position headers, decided once for every format (``EventSerializer``); a format supplies the bytes.

Records
    * ``c``/``r``/``u``: one record. ``d``: the delete event, then a tombstone (same key,
      value None). An update whose key changed: a ``d`` under the old key (header
      ``__debezium.newkey``), its tombstone, and a ``c`` under the new key (header
      ``__debezium.oldkey``); the header values are the key payloads, e.g. ``{"id":1}``.
    * Truncate: one marker per partition of each table's topic, on that partition, valued
      with the table's envelope, ``op`` ``"t"``, header ``cdc.truncate: 1``, and keyed with
      the table's key fields all null (``{"id":null}``; schema ``<topic>.TruncateKey``, the
      Key's fields made optional). Debezium sends a null key, which a compacted topic cannot
      hold; a key with fields of their own would become a column in Debezium's JDBC sink.
      No row has that key (key columns are never all NULL: a row whose configured key
      columns are all NULL is an error). Compaction keeps the latest marker of each
      partition; a consumer recognises a marker by ``op`` ``"t"`` (or the header).
    * Logical message: topic ``<prefix>.message``, Debezium's MessageKey/MessageValue.
    * With ``position_headers`` (``kafka.position_headers``), every record carries ``cdc.lsn``,
      ``cdc.commit_lsn``, ``cdc.txid`` (when known) and ``cdc.ordinal`` headers, decimal ASCII (the
      names: ``cdc.sink.wire``). They repeat the envelope's ``source.lsn``, ``source.sequence``
      (``["<commit lsn>","<lsn>"]``) and ``source.txId``; readers take the position from there when
      they are absent (``cdc.sink.position``). Without them a tombstone carries no position: it
      follows its delete event, whose envelope has it.

Keys
    A JSON object of the key columns in column order, serialized the same way for every
    event of a row. Keys are injective: where Debezium's value encoding can map two
    different values to one (interval as MicroDuration, numeric/money as double, timetz
    normalized to UTC), a key column uses an exact encoding instead (interval as an ISO
    string, numeric as a plain decimal string, timetz with its own offset). A change of
    the key's bytes, not of Python equality, makes the update a delete plus create.
    A table without key columns is an error: its rows cannot live on a compacted topic.

Envelope ``ts_ms``/``ts_us``/``ts_ns`` are the serializer's clock when the event is
serialized; ``source.ts_*`` are the commit time.
"""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

import orjson
import structlog

from cdc.event import (
    AnyRow,
    ChangeEvent,
    Column,
    MessageEvent,
    Op,
    TableSchema,
    TransactionBlock,
    TruncateEvent,
)
from cdc.sink.connect import ColumnField, ConnectSchema
from cdc.sink.errors import SerializationError
from cdc.sink.record import Record
from cdc.sink.rendering import RowRendering
from cdc.sink.typemap import TypeOptions
from cdc.sink.wire import (
    COMMIT_LSN_HEADER,
    LSN_HEADER,
    NEW_KEY_HEADER,
    OLD_KEY_HEADER,
    ORDINAL_HEADER,
    TRUNCATE_HEADER,
    TXID_HEADER,
)
from cdc.values import UNCHANGED_TOAST

_log = structlog.get_logger(__name__)


class TablePlan(Protocol):
    """What the shared event logic needs from a format's plan of one table schema."""

    @property
    def table(self) -> TableSchema: ...

    @property
    def topic(self) -> str: ...

    @property
    def key_fields(self) -> tuple[ColumnField, ...]:
        """The key columns with their JSON key encoders (key header payloads are JSON in every format)."""
        ...


PlanT = TypeVar("PlanT", bound=TablePlan)


class FormatSettings(Protocol):
    """The settings every format has (``JsonSettings``; ``cdc.sink.avro.AvroSettings``)."""

    @property
    def topic_prefix(self) -> str: ...

    @property
    def database(self) -> str: ...

    @property
    def decimal_handling(self) -> str: ...

    @property
    def time_precision(self) -> str: ...

    @property
    def interval_handling(self) -> str: ...

    @property
    def unavailable_value(self) -> str: ...

    @property
    def connector_version(self) -> str: ...


_TOPIC_CHARS: Final = re.compile(r"[^a-zA-Z0-9._-]")
_OPS: Final[dict[Op, str]] = {op: op.value for op in Op}


_MAX_PLANS: Final = 4096

Records = Callable[[ChangeEvent | TruncateEvent | MessageEvent], list[Record]]
"""A serializer's ``records``: an event -> its records, in the order they must be produced."""


@dataclass(frozen=True, slots=True)
class SourcePieces:
    """The envelope's ``source`` block of one transaction and table, in a format's bytes, around its two
    per-event fields (``sequence`` and ``lsn``, the only ones that change within a transaction and table):
    ``head + <sequence> + middle + <lsn> + tail``. JSON writes both as the event's LSN in decimal digits
    (``sequence`` is spliced inside its text, so the pieces end and start inside it); Avro writes them with
    ``write_sequence`` and ``write_lsn``. The reference serializer and the compiled envelopes
    (``cdc.sink._envelope``) splice the same pieces."""

    table: TableSchema
    head: bytes
    middle: bytes
    tail: bytes
    write_sequence: Callable[[Any], bytes] | None = None  # Avro: the sequence field's writer
    write_lsn: Callable[[Any], bytes] | None = None  # Avro: the lsn field's writer


def column_where(table: TableSchema, column: Column) -> str:
    return f"column {column.name!r} of table {table.qualified!r}"


class EventSerializer(abc.ABC, Generic[PlanT]):
    """What every format shares: topics, a plan per table schema, and the records each event becomes.

    The record set (delete + tombstone, key change as delete/tombstone/create with key
    headers, truncate markers on every partition) and the headers are decided here, once;
    a format supplies the plan of a table and the bytes (``_build_plan``, ``_row``,
    ``_key``, ``_envelope``, ``_truncate_key``, ``_message``). One per sink; not thread-safe.
    """

    records: Records
    """The records of one event, in the order they must be produced: ``reference_records``, or the compiled
    envelope a format was handed when it was built (``cdc.sink.envelopes``), which writes a row change of
    rendered rows itself and hands every other event to ``reference_records``. An attribute, so that callers
    binding ``serializer.records`` once (the chain) call the chosen one directly."""

    def __init__(
        self,
        settings: FormatSettings,
        partitions_of: Callable[[str], int],
        *,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._partitions_of = partitions_of
        self._clock_ns = clock_ns
        # Tables whose truncates write no marker (tables[].truncate: skip); None: every table gets markers.
        self.skip_truncate: Callable[[TableSchema], bool] | None = None
        # The cdc.* position headers on every record (else the envelope alone says it). On for a serializer
        # made directly; the daemon's (make_serializer) follows kafka.position_headers, off by default.
        self.position_headers = True
        self._opts = TypeOptions(settings.decimal_handling, settings.time_precision, settings.interval_handling)
        self._prefix = settings.topic_prefix
        self._version = settings.connector_version
        self._database = settings.database
        self._placeholder = settings.unavailable_value
        self._plans_by_id: dict[int, tuple[TableSchema, PlanT]] = {}
        # The source block's pieces per transaction and table (a format's _build_source_pieces), made once.
        self._source_parts: dict[
            tuple[int, int | None, int | None, int, bool], tuple[TableSchema, SourcePieces | None]
        ] = {}
        self._plans: dict[TableSchema, PlanT] = {}
        self._topic_owner: dict[str, tuple[str, str]] = {}
        self._message_topic = _TOPIC_CHARS.sub("_", f"{self._prefix}.message")
        # The headers that stay the same through a transaction, made once per transaction.
        self._tx_headers: tuple[int | None, int | None, tuple[str, bytes], tuple[str, bytes]] = (
            None,
            None,
            (COMMIT_LSN_HEADER, b""),
            (TXID_HEADER, b""),
        )
        self.records = self.reference_records

    # --- topics and plans ---------------------------------------------------

    def topic_for(self, table: TableSchema) -> str:
        """``<prefix>.<schema>.<table>``; characters outside ``[a-zA-Z0-9._-]`` become ``_``."""
        return self.plan(table).topic

    def topic_name(self, schema: str, table: str) -> str:
        """The topic of table ``schema.table`` (for start-up, before a TableSchema exists).

        Raises ``SerializationError`` when two captured tables would share a topic.
        """
        topic = _TOPIC_CHARS.sub("_", f"{self._prefix}.{schema}.{table}")
        owner = self._topic_owner.setdefault(topic, (schema, table))
        if owner != (schema, table):
            raise SerializationError(
                f"tables {owner[0]}.{owner[1]} and {schema}.{table} both map to topic {topic!r} "
                "(characters outside [a-zA-Z0-9._-] become '_'), where their keys could collide: "
                "rename one or leave one out of the capture"
            )
        return topic

    def plan(self, table: TableSchema) -> PlanT:
        """The format's plan of ``table`` (built once per table schema): what its records need that does not
        change per row; the compiled envelopes read it too (``cdc.sink._envelope``)."""
        # By identity first: hashing a TableSchema walks all its columns. The entry holds the schema
        # object itself (not the plan's, which may be an equal one from before a reconnect), so an id
        # is never taken for another object's.
        entry = self._plans_by_id.get(id(table))
        if entry is not None and entry[0] is table:
            return entry[1]
        plan = self._plans.get(table)
        if plan is None:
            plan = self._build_plan(table)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[table] = plan
        if len(self._plans_by_id) >= _MAX_PLANS:
            self._plans_by_id.clear()
        self._plans_by_id[id(table)] = (table, plan)
        return plan

    @abc.abstractmethod
    def _build_plan(self, table: TableSchema) -> PlanT:
        """Everything per table schema that does not change per row: topic, encoders, schemas."""

    def row_rendering(self, table: TableSchema) -> RowRendering | None:
        """How the decoder may write ``table``'s rows straight in this format (``RenderedRow``); None: as
        typed values only."""
        return None

    # --- events -------------------------------------------------------------

    def reference_records(self, event: ChangeEvent | TruncateEvent | MessageEvent) -> list[Record]:
        """The records for one event, in the order they must be produced, in Python (see ``records``)."""
        if type(event) is ChangeEvent:
            return self._change(event)
        if type(event) is TruncateEvent:
            return self._truncate(event)
        if type(event) is MessageEvent:
            return self._message(event)
        raise TypeError(f"cannot serialize {type(event).__name__}")

    def _change(self, event: ChangeEvent) -> list[Record]:
        plan = self.plan(event.table)
        if not plan.key_fields:
            raise SerializationError(
                f"table {event.table.qualified!r} has no key columns: its rows cannot be keyed on a "
                "compacted topic; give it a primary key (or replica identity index) or configure its key columns"
            )
        op = event.op
        commit_lsn, xid = event.commit_lsn, event.xid
        tx = self._tx_headers
        headers: tuple[tuple[str, bytes], ...]
        if not self.position_headers:
            headers = ()
        elif tx[0] == commit_lsn and tx[1] == xid and xid is not None:
            headers = ((LSN_HEADER, b"%d" % event.lsn), tx[2], tx[3], (ORDINAL_HEADER, b"%d" % event.ordinal))
        else:
            headers = position_headers(event.lsn, commit_lsn, xid, event.ordinal)
            if len(headers) == 4:
                self._tx_headers = (commit_lsn, xid, headers[1], headers[2])
        source = self._source(event.table, event.commit_ts_us, event.commit_lsn, event.lsn, event.xid, event.snapshot)
        now = self._clock_ns()
        topic = plan.topic
        if op is Op.CREATE or op is Op.READ:
            after, key = self._row_and_key(plan, event.after, "after")
            return [
                Record(topic, key, self._envelope(plan, None, after, source, _OPS[op], now, event.transaction), headers)
            ]
        if op is Op.DELETE:
            before, key = self._row_and_key(plan, event.before, "before")
            value = self._envelope(plan, before, None, source, "d", now, event.transaction)
            return [Record(topic, key, value, headers), Record(topic, key, None, headers)]
        if op is Op.UPDATE:
            old_row = self._row(plan, event.before, "before") if event.before is not None else None
            new_row, key = self._row_and_key(plan, event.after, "after")
            if event.before is not None:
                old_key = self._key(plan, event.before)
                if old_key != key:
                    new_payload = self._key_payload(plan, event.after)
                    old_payload = self._key_payload(plan, event.before)
                    delete_headers = (*headers, (NEW_KEY_HEADER, new_payload))
                    create_headers = (*headers, (OLD_KEY_HEADER, old_payload))
                    return [
                        Record(
                            topic,
                            old_key,
                            self._envelope(plan, old_row, None, source, "d", now, event.transaction),
                            delete_headers,
                        ),
                        Record(topic, old_key, None, delete_headers),
                        Record(
                            topic,
                            key,
                            self._envelope(plan, None, new_row, source, "c", now, event.transaction),
                            create_headers,
                        ),
                    ]
            return [
                Record(topic, key, self._envelope(plan, old_row, new_row, source, "u", now, event.transaction), headers)
            ]
        raise SerializationError(
            f"a ChangeEvent cannot have op {op.value!r} (truncates and messages have their own events)"
        )

    def _truncate(self, event: TruncateEvent) -> list[Record]:
        position = position_headers(
            event.lsn, event.commit_lsn, event.xid, event.ordinal, enabled=self.position_headers
        )
        headers = (*position, (TRUNCATE_HEADER, b"1"))
        now = self._clock_ns()
        records: list[Record] = []
        for table in event.tables:
            if self.skip_truncate is not None and self.skip_truncate(table):
                _log.info(
                    "truncate_skipped", table=table.qualified, lsn=int(event.lsn), setting="tables[].truncate: skip"
                )
                continue
            plan = self.plan(table)
            source = self._source(table, event.commit_ts_us, event.commit_lsn, event.lsn, event.xid, False)
            value = self._envelope(plan, None, None, source, "t", now)
            partitions = self._partitions_of(plan.topic)
            if partitions < 1:
                raise SerializationError(
                    f"topic {plan.topic!r} has {partitions} partitions: nowhere to put truncate markers"
                )
            for partition in range(partitions):
                records.append(
                    Record(plan.topic, self._truncate_key(plan, partition), value, headers, partition=partition)
                )
        return records

    @abc.abstractmethod
    def _message(self, event: MessageEvent) -> list[Record]:
        """The record of a logical decoding message (topic ``<prefix>.message``)."""

    @abc.abstractmethod
    def side_record(
        self,
        topic: str,
        key_schema: ConnectSchema,
        key: dict[str, Any],
        value_schema: ConnectSchema,
        value: dict[str, Any],
    ) -> Record:
        """A record of a side topic (heartbeats, transaction metadata: ``cdc.sink.metadata``) in this format,
        key and value each valid against its Connect schema."""

    # --- pieces -------------------------------------------------------------

    def _source(
        self,
        table: TableSchema,
        commit_ts_us: int,
        commit_lsn: int | None,
        lsn: int,
        xid: int | None,
        snapshot: bool,
    ) -> Any:  # a dict; the JSON format gives its JSON text (bytes) when it can splice it
        return {
            "version": self._version,
            "connector": "postgresql",
            "name": self._prefix,
            "ts_ms": commit_ts_us // 1000,
            "snapshot": "true" if snapshot else "false",
            "db": self._database,
            "sequence": sequence_text(commit_lsn, lsn),
            "ts_us": commit_ts_us,
            "ts_ns": commit_ts_us * 1000,
            "schema": table.schema,
            "table": table.name,
            "txId": xid,
            "lsn": int(lsn),
            "xmin": None,
            "origin": None,
            "origin_lsn": None,
        }

    def _message_source(self, event: MessageEvent, now_ns: int) -> dict[str, Any]:
        """A message's ``source``: no table; no commit time (non-transactional): the serializer's clock."""
        commit_ts_us = event.commit_ts_us if event.commit_ts_us is not None else now_ns // 1000
        return {
            "version": self._version,
            "connector": "postgresql",
            "name": self._prefix,
            "ts_ms": commit_ts_us // 1000,
            "snapshot": "false",
            "db": self._database,
            "sequence": sequence_text(event.commit_lsn, event.lsn),
            "ts_us": commit_ts_us,
            "ts_ns": commit_ts_us * 1000,
            "schema": "",
            "table": "",
            "txId": event.xid,
            "lsn": int(event.lsn),
            "xmin": None,
            "origin": None,
            "origin_lsn": None,
        }

    def source_pieces(
        self, table: TableSchema, commit_ts_us: int, commit_lsn: int | None, xid: int | None, snapshot: bool
    ) -> SourcePieces | None:
        """The source block's pieces of a transaction and table (None: this format cannot splice it, the block is
        written whole per event), made once per transaction and table."""
        key = (id(table), commit_lsn, xid, commit_ts_us, snapshot)
        entry = self._source_parts.get(key)
        if entry is None or entry[0] is not table:
            entry = (table, self._build_source_pieces(table, commit_ts_us, commit_lsn, xid, snapshot))
            if len(self._source_parts) >= 256:
                self._source_parts.clear()
            self._source_parts[key] = entry
        return entry[1]

    def _build_source_pieces(
        self, table: TableSchema, commit_ts_us: int, commit_lsn: int | None, xid: int | None, snapshot: bool
    ) -> SourcePieces | None:
        """A format's source block around its per-event parts (see ``source_pieces``); None: not spliced."""
        return None

    def _key_payload(self, plan: PlanT, row: AnyRow | None) -> bytes:
        """The key as JSON text (``{"id":1}``): the JSON format's key payload, and every format's key headers."""
        if row is None:
            raise SerializationError(f"table {plan.table.qualified!r}: the event has no row to take the key from")
        try:
            return orjson.dumps(_encode_key(plan.table, plan.key_fields, row))
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise value_error(plan.table, plan.key_fields, row, exc) from exc

    @abc.abstractmethod
    def _row(self, plan: PlanT, row: AnyRow | None, which: str) -> Any:
        """A row's columns encoded for the envelope's ``before``/``after``."""

    @abc.abstractmethod
    def _key(self, plan: PlanT, row: AnyRow | None) -> bytes:
        """The record key of a row: the same bytes for every event of the row."""

    def _row_and_key(self, plan: PlanT, row: AnyRow | None, which: str) -> tuple[Any, bytes]:
        """``_row`` and ``_key`` of the same row; a format overrides it to look at the row once (it runs per row)."""
        return self._row(plan, row, which), self._key(plan, row)

    @abc.abstractmethod
    def _envelope(
        self,
        plan: PlanT,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        source: dict[str, Any],
        op: str,
        now_ns: int,
        transaction: TransactionBlock | None = None,
    ) -> bytes:
        """The record value: Debezium's envelope."""

    @abc.abstractmethod
    def _truncate_key(self, plan: PlanT, partition: int) -> bytes:
        """The key of the truncate marker on ``partition``: never a row's key."""


def _encode_key(table: TableSchema, key_fields: Sequence[ColumnField], row: AnyRow) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, encode, _ in key_fields:
        value = row.get(name)
        if value is UNCHANGED_TOAST:
            raise unchanged_toast_key(table, name)
        out[name] = value if value is None or encode is None else encode(value)
    if all(v is None for v in out.values()):
        raise SerializationError(
            f"table {table.qualified!r}: every key column ({', '.join(out)}) is NULL in this row; such a key "
            "cannot tell rows apart (and is the truncate markers' key); choose key columns that are never all NULL"
        )
    return out


def unchanged_toast_key(table: TableSchema, column: str) -> SerializationError:
    return SerializationError(
        f"key column {column!r} of table {table.qualified!r} is an unchanged TOASTed value: "
        "the key is unknown; fill unchanged TOAST values before serializing (replica identity full or re-read)"
    )


def value_error(table: TableSchema, fields: Sequence[ColumnField], row: AnyRow, exc: Exception) -> Exception:
    """Name the column whose value failed to encode (the slow path after a failure)."""
    if isinstance(exc, SerializationError):
        return exc
    for name, encode, _ in fields:
        value = row.get(name)
        if value is None or value is UNCHANGED_TOAST or encode is None:
            continue
        try:
            encode(value)
        except (TypeError, ValueError, AttributeError, OverflowError) as column_exc:
            return SerializationError(
                f"column {name!r} of table {table.qualified!r}: cannot encode {type(value).__name__} "
                f"value {value!r:.80}: {column_exc}"
            )
    return SerializationError(f"table {table.qualified!r}: cannot encode a row: {exc}")


def sequence_text(commit_lsn: int | None, lsn: int) -> str:
    """``source.sequence``: ``["<commit lsn>","<lsn>"]`` (the first null outside a transaction)."""
    first = "null" if commit_lsn is None else f'"{int(commit_lsn)}"'
    return f'[{first},"{int(lsn)}"]'


def position_headers(
    lsn: int, commit_lsn: int | None, xid: int | None, ordinal: int, *, enabled: bool = True
) -> tuple[tuple[str, bytes], ...]:
    """The ``cdc.*`` position headers of a record (none when not ``enabled``: ``kafka.position_headers``).
    Every writer of them builds them here."""
    if not enabled:
        return ()
    if commit_lsn is not None and xid is not None:
        return (
            (LSN_HEADER, b"%d" % lsn),
            (COMMIT_LSN_HEADER, b"%d" % commit_lsn),
            (TXID_HEADER, b"%d" % xid),
            (ORDINAL_HEADER, b"%d" % ordinal),
        )
    headers: list[tuple[str, bytes]] = [(LSN_HEADER, b"%d" % lsn)]
    if commit_lsn is not None:
        headers.append((COMMIT_LSN_HEADER, b"%d" % commit_lsn))
    if xid is not None:
        headers.append((TXID_HEADER, b"%d" % xid))
    headers.append((ORDINAL_HEADER, b"%d" % ordinal))
    return tuple(headers)
