"""Outbox rows and logical messages to Kafka records: a pure transform, values in, records out.

``OutboxRouter.from_row(table, event)`` and ``OutboxRouter.from_message(event)`` read an
outbox event out of a row INSERT or a logical message, or say why it is malformed;
``OutboxRouter.record(event)`` builds its record, ``OutboxRouter.dead_letter(bad, topic)`` the
dead-letter record of a malformed one. Nothing here talks to Postgres or Kafka; the pipeline
creates topics, produces, and decides between failing and dead-lettering.

Records
    * Topic: ``outbox.topic`` with ``{aggregate_type}`` (and ``{topic_prefix}``) filled in;
      by default ``outbox.event.<aggregate type>``, Debezium's outbox event router convention.
      These topics are not compacted: an aggregate's events are a stream, and compaction
      would keep only its last one.
    * Key: the aggregate id as plain UTF-8 text (what Debezium's router gives with a string
      converter), in both formats, so the default ``murmur2_random`` partitioner puts every
      event of one aggregate on one partition, and JVM producers of the same key agree.
      Records are produced in decoding order, which is commit order, so one aggregate's
      events are in commit order on its partition.
    * Value, JSON: the payload exactly as stored (the server's text of the jsonb/json/text
      column; the message route writes its ``payload`` member back as compact JSON). With
      extra columns placed in the envelope, the value is ``{"payload": <payload>, <field>:
      <value>, ...}`` instead.
    * Value, Avro: a record ``cdc.outbox.Event`` (``id``, ``type``, ``aggregate_type``,
      ``aggregate_id``, ``payload``, then the envelope fields as optional strings) in the
      Confluent wire format, registered under ``<topic>-value``. The payload travels as a JSON
      string: an Avro schema per event type would need one the application does not have.
    * Headers: ``id`` (the event id), ``eventType``, ``aggregateType``, extra columns placed
      as headers (their text), and the usual ``cdc.lsn``/``cdc.commit_lsn``/``cdc.txid``/
      ``cdc.ordinal``.

Malformed events
    A NULL or empty aggregate id, aggregate type, event type or event id; a NULL payload or
    one that is not JSON (a text or json column; jsonb cannot hold anything else); an aggregate
    type outside ``outbox.aggregate_types`` or one that cannot be part of a topic name; a
    message whose content is not a JSON object with those members; a non-transactional
    message with the outbox prefix (it would be published even if its transaction rolled
    back). Each becomes a ``Malformed`` naming the reason, never nothing. Its dead-letter
    record carries the whole row or message, so nothing vanishes.
"""

from __future__ import annotations

import base64
import io
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Final, Protocol, cast

import fastavro
import orjson

from cdc.event import ChangeEvent, MessageEvent, Op, Row
from cdc.lsn import Lsn
from cdc.outbox.config import TOPIC_CHARS, OutboxConfig, OutboxTable
from cdc.sink.record import Record
from cdc.sink.records import position_headers
from cdc.sink.wire import DEAD_LETTER_REASON_HEADER

ROUTE_TABLE: Final = "table"
ROUTE_MESSAGE: Final = "message"
# Message route: events without an "id" get one derived from their LSN, the same on every delivery.
_MESSAGE_ID_NAMESPACE: Final = uuid.UUID("7d3c1c64-3a57-4c38-9a43-6f0c6d1f5a10")
_JSON_TYPES: Final = frozenset({"json", "jsonb"})
_MAX_TOPIC: Final = 249


class OutboxError(Exception):
    """A malformed outbox event with ``outbox.on_error: fail``; the message names it and the fix."""


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """One application event, read from an outbox row or a logical message."""

    id: str
    aggregate_type: str
    aggregate_id: str
    type: str
    payload: bytes  # JSON text
    headers: tuple[tuple[str, bytes], ...]  # extra columns placed as headers
    envelope: tuple[tuple[str, Any], ...]  # extra columns placed in the value
    route: str  # ROUTE_TABLE or ROUTE_MESSAGE
    source: str  # "public.outbox" or "message cdc.outbox": for logs and errors
    lsn: Lsn
    commit_lsn: Lsn | None
    xid: int | None
    ordinal: int


class MalformedReason(StrEnum):
    """Why an outbox row or message cannot become an event: ``Malformed.reason``. Set once, by
    ``OutboxRouter.from_row`` (rows) or ``from_message`` (messages), never changed; it persists in the
    dead-letter record (its ``reason`` and the ``cdc.dead_letter.reason`` header) and labels the
    ``cdc_outbox_dead_letters`` metric. The values are those strings."""

    MISSING_AGGREGATE_ID = "missing_aggregate_id"  # NULL/empty column, or member missing/empty/not a string
    MISSING_AGGREGATE_TYPE = "missing_aggregate_type"
    MISSING_TYPE = "missing_type"
    MISSING_ID = "missing_id"
    MISSING_PAYLOAD = "missing_payload"  # NULL column, or member missing or null
    PAYLOAD_NOT_JSON = "payload_not_json"  # rows: not UTF-8, not text, or not JSON
    AGGREGATE_TYPE_NOT_ALLOWED = "aggregate_type_not_allowed"  # outside outbox.aggregate_types
    AGGREGATE_TYPE_NOT_A_TOPIC = "aggregate_type_not_a_topic"  # cannot be part of a topic name
    NOT_TRANSACTIONAL = "not_transactional"  # messages: emitted outside a transaction
    MESSAGE_NOT_JSON_OBJECT = "message_not_json_object"  # messages: content not a JSON object
    BAD_HEADERS = "bad_headers"  # messages: headers not an object of strings, or reserved names


_MISSING: Final = {
    "aggregate_id": MalformedReason.MISSING_AGGREGATE_ID,
    "aggregate_type": MalformedReason.MISSING_AGGREGATE_TYPE,
    "type": MalformedReason.MISSING_TYPE,
    "id": MalformedReason.MISSING_ID,
}


@dataclass(frozen=True, slots=True)
class Malformed:
    """An outbox row or message that cannot become an event, and why."""

    reason: MalformedReason
    detail: str  # a sentence for people
    route: str
    source: str
    key: bytes  # the aggregate id when there is one, else the source: a dead letter needs a key
    content: Mapping[str, Any]  # the row (values as JSON-friendly text) or the message
    lsn: Lsn
    commit_lsn: Lsn | None
    xid: int | None
    ordinal: int

    def describe(self) -> str:
        where = f"at LSN {self.lsn}" + (f" (transaction {self.xid})" if self.xid is not None else "")
        return f"outbox {self.source} {where}: {self.detail}"


class SchemaRegistration(Protocol):
    def register(self, subject: str, schema: Mapping[str, Any] | str, *, source: str | None = None) -> int: ...


class OutboxRouter:
    """Reads outbox events and builds their records. One per pipeline; not thread-safe."""

    def __init__(
        self, settings: OutboxConfig, topic_prefix: str, *, registry: SchemaRegistration | None = None
    ) -> None:
        self._settings = settings
        self._topic_prefix = topic_prefix
        self._allowed = frozenset(settings.aggregate_types) if settings.aggregate_types is not None else None
        self._tables = {t.name: t for t in settings.tables}
        self._registry = registry  # set: Avro values
        self._writers: dict[tuple[str, tuple[str, ...]], tuple[Any, bytes]] = {}
        self._topics: dict[str, str] = {}

    @property
    def tables(self) -> Mapping[str, OutboxTable]:
        return self._tables

    @property
    def message_prefix(self) -> str | None:
        return self._settings.message_prefix

    def topic(self, aggregate_type: str) -> str:
        topic = self._topics.get(aggregate_type)
        if topic is None:
            topic = self._topics[aggregate_type] = self._settings.topic_for(aggregate_type, self._topic_prefix)
        return topic

    def startup_topics(self) -> list[str]:
        """Topics known before any event: those of the allowed aggregate types."""
        return [self.topic(t) for t in self._settings.aggregate_types or ()]

    # -- reading -----------------------------------------------------------------------------

    def from_row(self, table: OutboxTable, event: ChangeEvent) -> OutboxEvent | Malformed | None:
        """An INSERT's event; None for UPDATE, DELETE and snapshot reads, which the outbox ignores."""
        if event.op is not Op.CREATE or event.after is None:
            return None
        row = cast(Row, event.after)  # typed: the chain never renders an outbox table's rows
        cols = table.columns
        source = table.name
        content = _printable_row(row)
        aggregate_id = _text(row.get(cols.aggregate_id))
        key = aggregate_id.encode() if aggregate_id else source.encode()

        def bad(reason: MalformedReason, detail: str) -> Malformed:
            return Malformed(
                reason, detail, ROUTE_TABLE, source, key, content, event.lsn, event.commit_lsn, event.xid, event.ordinal
            )

        for role, column in (
            ("aggregate_id", cols.aggregate_id),
            ("aggregate_type", cols.aggregate_type),
            ("type", cols.type),
            ("id", cols.id),
        ):
            if not _text(row.get(column)):
                return bad(_MISSING[role], f"column {column} ({role}) is NULL or empty")
        aggregate_type = _text(row[cols.aggregate_type])
        problem = self._check_type(aggregate_type)
        if problem is not None:
            return bad(*problem)
        raw = row.get(cols.payload)
        if raw is None:
            return bad(MalformedReason.MISSING_PAYLOAD, f"column {cols.payload} (payload) is NULL")
        payload_type = next((c.type.name for c in event.table.columns if c.name == cols.payload), "")
        if isinstance(raw, bytes | bytearray):
            try:
                raw = bytes(raw).decode()
            except UnicodeDecodeError:
                return bad(MalformedReason.PAYLOAD_NOT_JSON, f"column {cols.payload} (payload) is not UTF-8 text")
        if not isinstance(raw, str):
            return bad(
                MalformedReason.PAYLOAD_NOT_JSON,
                f"column {cols.payload} (payload) holds a {payload_type or type(raw).__name__}, not JSON text",
            )
        payload = raw.encode()
        if payload_type != "jsonb":  # jsonb holds nothing else; json and text may hold anything
            try:
                orjson.loads(payload)
            except orjson.JSONDecodeError as e:
                return bad(MalformedReason.PAYLOAD_NOT_JSON, f"column {cols.payload} (payload) is not JSON: {e}")
        headers = []
        envelope = []
        for extra in table.extra:
            value = row.get(extra.column)
            if extra.placement == "header":
                if value is not None:
                    headers.append((extra.target, _header_bytes(value)))
            else:
                envelope.append((extra.target, _json_friendly(value)))
        return OutboxEvent(
            id=_text(row[cols.id]),
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            type=_text(row[cols.type]),
            payload=payload,
            headers=tuple(headers),
            envelope=tuple(envelope),
            route=ROUTE_TABLE,
            source=source,
            lsn=event.lsn,
            commit_lsn=event.commit_lsn,
            xid=event.xid,
            ordinal=event.ordinal,
        )

    def from_message(self, event: MessageEvent) -> OutboxEvent | Malformed:
        """A logical message with the outbox prefix: its event, or why it is not one."""
        source = f"message {event.prefix}"
        try:
            text = event.content.decode()
        except UnicodeDecodeError:
            text = None
        content: dict[str, Any] = (
            {"prefix": event.prefix, "content": text}
            if text is not None
            else {"prefix": event.prefix, "content_base64": base64.b64encode(event.content).decode()}
        )
        data: Any = None
        if text is not None:
            try:
                data = orjson.loads(text)
            except orjson.JSONDecodeError:
                data = None
        aggregate_id = _text(data.get("aggregate_id")) if isinstance(data, dict) else ""
        key = aggregate_id.encode() if aggregate_id else source.encode()

        def bad(reason: MalformedReason, detail: str) -> Malformed:
            return Malformed(
                reason,
                detail,
                ROUTE_MESSAGE,
                source,
                key,
                content,
                event.lsn,
                event.commit_lsn,
                event.xid,
                event.ordinal,
            )

        if not event.transactional:
            return bad(
                MalformedReason.NOT_TRANSACTIONAL,
                "a non-transactional message (pg_logical_emit_message(false, ...)) is published even when its "
                "transaction rolls back, so the outbox refuses it; emit it with transactional = true",
            )
        if not isinstance(data, dict):
            return bad(MalformedReason.MESSAGE_NOT_JSON_OBJECT, "the content is not a JSON object")
        for member in ("aggregate_id", "aggregate_type", "type"):
            value = data.get(member)
            if not isinstance(value, str | int) or isinstance(value, bool) or not _text(value):
                return bad(_MISSING[member], f"member {member} is missing, empty or not a string")
        if "payload" not in data or data["payload"] is None:
            return bad(MalformedReason.MISSING_PAYLOAD, "member payload is missing or null")
        aggregate_type = _text(data["aggregate_type"])
        problem = self._check_type(aggregate_type)
        if problem is not None:
            return bad(*problem)
        event_id = data.get("id")
        if event_id is None:
            event_id = str(uuid.uuid5(_MESSAGE_ID_NAMESPACE, str(int(event.lsn))))
        elif not isinstance(event_id, str) or not event_id:
            return bad(MalformedReason.MISSING_ID, "member id is not a non-empty string")
        extra = data.get("headers") or {}
        if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
            return bad(MalformedReason.BAD_HEADERS, "member headers is not an object of strings")
        reserved = sorted(set(extra) & {"id", "eventType", "aggregateType"})
        if reserved:
            return bad(MalformedReason.BAD_HEADERS, f"member headers names reserved headers: {', '.join(reserved)}")
        return OutboxEvent(
            id=event_id,
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            type=_text(data["type"]),
            payload=orjson.dumps(data["payload"]),
            headers=tuple((k, v.encode()) for k, v in extra.items()),
            envelope=(),
            route=ROUTE_MESSAGE,
            source=source,
            lsn=event.lsn,
            commit_lsn=event.commit_lsn,
            xid=event.xid,
            ordinal=event.ordinal,
        )

    def _check_type(self, aggregate_type: str) -> tuple[MalformedReason, str] | None:
        if self._allowed is not None and aggregate_type not in self._allowed:
            return (
                MalformedReason.AGGREGATE_TYPE_NOT_ALLOWED,
                f"aggregate type {aggregate_type!r} is not in outbox.aggregate_types "
                f"({', '.join(sorted(self._allowed))})",
            )
        topic = self.topic(aggregate_type) if TOPIC_CHARS.fullmatch(aggregate_type) else None
        if topic is None or len(topic) > _MAX_TOPIC or topic in (".", ".."):
            return (
                MalformedReason.AGGREGATE_TYPE_NOT_A_TOPIC,
                f"aggregate type {aggregate_type[:100]!r} cannot be part of a topic name (letters, digits, '.', '_', "
                f"'-'; the topic at most {_MAX_TOPIC} characters)",
            )
        return None

    # -- writing -----------------------------------------------------------------------------

    def record(self, event: OutboxEvent) -> Record:
        topic = self.topic(event.aggregate_type)
        headers = (
            ("id", event.id.encode()),
            ("eventType", event.type.encode()),
            ("aggregateType", event.aggregate_type.encode()),
            *event.headers,
            *position_headers(event.lsn, event.commit_lsn, event.xid, event.ordinal),
        )
        value = self._avro_value(topic, event) if self._registry is not None else _json_value(event)
        return Record(topic, event.aggregate_id.encode(), value, headers)

    def dead_letter(self, bad: Malformed, topic: str) -> Record:
        value = {
            "reason": bad.reason,
            "detail": bad.detail,
            "source": "outbox",
            "route": bad.route,
            "from": bad.source,
            "lsn": int(bad.lsn),
            "commit_lsn": int(bad.commit_lsn) if bad.commit_lsn is not None else None,
            "txid": bad.xid,
            ("row" if bad.route == ROUTE_TABLE else "message"): dict(bad.content),
        }
        headers = (
            (DEAD_LETTER_REASON_HEADER, bad.reason.encode()),
            *position_headers(bad.lsn, bad.commit_lsn, bad.xid, bad.ordinal),
        )
        return Record(topic, bad.key, orjson.dumps(value), headers)

    def _avro_value(self, topic: str, event: OutboxEvent) -> bytes:
        assert self._registry is not None
        names = tuple(name for name, _ in event.envelope)
        writer = self._writers.get((topic, names))
        if writer is None:
            schema = avro_event_schema(names)
            parsed = fastavro.parse_schema(schema)
            schema_id = self._registry.register(f"{topic}-value", schema, source=f"outbox events on {topic}")
            writer = self._writers[(topic, names)] = (parsed, b"\x00" + schema_id.to_bytes(4, "big"))
        parsed, prefix = writer
        datum: dict[str, Any] = {
            "id": event.id,
            "type": event.type,
            "aggregate_type": event.aggregate_type,
            "aggregate_id": event.aggregate_id,
            "payload": event.payload.decode(),
        }
        for name, value in event.envelope:
            datum[_avro_field(name)] = (
                None if value is None else (value if isinstance(value, str) else orjson.dumps(value).decode())
            )
        buffer = io.BytesIO()
        buffer.write(prefix)
        fastavro.schemaless_writer(buffer, parsed, datum)
        return buffer.getvalue()


def avro_event_schema(envelope_fields: Iterable[str]) -> dict[str, Any]:
    """The Avro value schema of outbox events: the event, payload as a JSON string, extras as optional strings."""
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "string"},
        {"name": "type", "type": "string"},
        {"name": "aggregate_type", "type": "string"},
        {"name": "aggregate_id", "type": "string"},
        {"name": "payload", "type": "string", "doc": "the event's JSON, as text"},
    ]
    for name in envelope_fields:
        fields.append({"name": _avro_field(name), "type": ["null", "string"], "default": None})
    return {"type": "record", "name": "Event", "namespace": "cdc.outbox", "fields": fields}


def _avro_field(name: str) -> str:
    out = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
    return f"_{out}" if not out or out[0].isdigit() else out


def _json_value(event: OutboxEvent) -> bytes:
    if not event.envelope:
        return event.payload
    body = orjson.dumps({name: value for name, value in event.envelope})
    # {"payload": <as stored>, ...}: splice the stored text in rather than re-encode it.
    return b'{"payload":' + event.payload + (b"," + body[1:] if len(body) > 2 else b"}")


def _text(value: Any) -> str:
    """A key-like value as text ('' for NULL): text as is, uuid/int/... as their text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode(errors="replace")
    return str(value)


def _header_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, str | int | float | Decimal | uuid.UUID):
        return str(value).encode()
    return orjson.dumps(_json_friendly(value))


def _json_friendly(value: Any) -> Any:
    """Column values as JSON can hold them: numbers and strings as they are, everything else as text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, list | tuple):
        return [_json_friendly(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_friendly(v) for k, v in value.items()}
    if isinstance(value, Decimal | uuid.UUID | date | datetime):
        return str(value)
    return str(value)


def _printable_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _json_friendly(value) for name, value in row.items()}
