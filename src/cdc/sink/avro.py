"""Events to Kafka records in Avro: Confluent's wire format, Debezium's schemas.

``AvroSerializer(settings, partitions_of, registry).records(event)`` turns a ``ChangeEvent``,
``TruncateEvent`` or ``MessageEvent`` into records, like ``JsonSerializer`` and through the same
code (``cdc.sink.records.EventSerializer``): the same records in the same order, the same
headers, the same values per type (``cdc.sink.typemap`` describes them), written as Avro where
JSON writes text: bytes as bytes, decimals as two's-complement bytes, NaN as NaN.

Wire format
    Byte ``0x00``, the schema id (4 bytes, big-endian), then the Avro binary body
    (fastavro's ``schemaless_writer``; each schema is parsed once per table schema).

Subjects (TopicNameStrategy)
    ``<topic>-key`` and ``<topic>-value``; logical messages ``<prefix>.message-key``/``-value``.
    Schemas (``cdc.sink.avro_schema``) are registered when a table schema is first used; a ``Relation`` that changes the
    columns makes a new table schema, whose value schema registers as the subject's next
    version (the key schema, unchanged, keeps its id, so a row's key bytes stay the same).

Differences from Debezium, and why
    * Every non-key column is optional (``["null", T]``, default null) in the ``Value`` record,
      NOT NULL or not; Debezium makes NOT NULL columns required and gives them the column's
      default. pgoutput does not send column defaults, so a required field here could never
      have one, and adding a NOT NULL column would break BACKWARD compatibility. So adding or
      dropping any non-key column is BACKWARD (indeed FULL) compatible. Key columns stay
      required; a change of the key, or a type change Avro cannot promote (int -> long is
      fine, text -> int is not), is genuinely incompatible, and the registry's refusal stops
      the pipeline with ``IncompatibleSchemaError`` naming the subject, table and changed fields.
    * Truncate markers (one per partition, as in JSON) are keyed with a record
      ``<namespace>.TruncateKey``: the Key's fields, each ``["null", T]``, all null (a Key record
      cannot hold nulls, so no row has that key). It is registered under its own subject
      ``<topic>-<namespace>.TruncateKey`` (TopicRecordNameStrategy), so the row key subject keeps
      exactly one record type under any compatibility level. A consumer mapping key fields to
      columns (Debezium's JDBC sink) finds the same field names as in row keys. Consumers that
      read keys with a fixed reader schema (Flink, Spark's ``from_avro`` with a subject) should
      skip records with header ``cdc.truncate`` (or value ``op`` ``"t"``) before decoding keys.
    * A key column value must not be NULL (a configured key over a nullable column): the Key
      record's fields are required. Multi-dimensional arrays cannot be written (the schema
      has one array level). Both are ``SerializationError``s naming the column and the fix.
    * An unchanged TOASTed value becomes the placeholder where the Avro type can hold it (text
      types, bytea, arrays of text or of integers, as Debezium does); elsewhere it is an error
      that asks for REPLICA IDENTITY FULL (the decoder then fills the value from the old row).
"""

from __future__ import annotations

import functools
import io
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import fastavro
import fastavro.validation
import structlog

from cdc.compiled import CHOSEN
from cdc.event import AnyRow, MessageEvent, TableSchema, TransactionBlock
from cdc.sink.avro_schema import avro_field_name, avro_name, avro_schema
from cdc.sink.avro_write import COMPILED_ERRORS, Encoded, Unsupported, Write, compile_writer
from cdc.sink.connect import (
    MESSAGE_KEY_SCHEMA,
    MESSAGE_VALUE_SCHEMA,
    SOURCE_SCHEMA,
    ConnectSchema,
    Encoder,
    envelope_schema,
    truncate_key_schema,
)
from cdc.sink.envelopes import AvroEnvelope, avro_envelope, avro_records, envelope_writer
from cdc.sink.errors import AVRO_LONG_MAX, AVRO_LONG_MIN, SerializationError, clock_beyond_avro_long
from cdc.sink.record import Record
from cdc.sink.records import (
    EventSerializer,
    SourcePieces,
    column_where,
    position_headers,
    sequence_text,
    unchanged_toast_key,
)
from cdc.sink.registry import SchemaRegistry
from cdc.sink.rendering import RowRendering, encoded
from cdc.sink.rendering_avro import avro_row_rendering
from cdc.sink.settings import AvroSettings
from cdc.sink.typemap import column_schema
from cdc.values import UNCHANGED_TOAST

if TYPE_CHECKING:
    from cdc.sink._envelope import AvroRecords

__all__ = ["AvroSerializer", "AvroSettings", "AvroTablePlan", "decode_wire"]

log = structlog.get_logger("cdc.sink.avro")

MAGIC_BYTE: Final = 0
_ENCODE_ERRORS: Final = (TypeError, ValueError, AttributeError, OverflowError)
_COMPILED_ENVELOPE: Final[type[AvroRecords] | None] = CHOSEN.compiled("envelope", "AvroRecords")


# ---------------------------------------------------------------------------
# Per-table plans
# ---------------------------------------------------------------------------

_NO_PLACEHOLDER: Final = object()

_KeyHeaderField = tuple[str, Encoder | None, Any]  # (column, JSON key encoder, unused)
_AvroKeyField = tuple[str, str, Encoder | None]  # (column, Avro field, encoder)
_AvroField = tuple[str, str, Encoder | None, Any]  # (column, Avro field, encoder, unchanged-TOAST placeholder)


@dataclass(frozen=True, slots=True)
class _Writer:
    """One registered Avro schema: the wire prefix (magic byte + id) and the parsed schema."""

    schema: Any  # as registered
    parsed: Any  # fastavro.parse_schema(schema)
    prefix: bytes
    subject: str
    schema_id: int
    write: Write | None  # compiled (cdc.sink.avro_write); None: fastavro only
    fields: Mapping[str, Mapping[str, Write]]  # each record's compiled field writers, by full name


@dataclass(frozen=True, slots=True)
class AvroTablePlan:
    """Everything per table schema that does not change per row: topic, fields, registered schemas. The
    compiled envelope (``cdc.sink._envelope.AvroRecords``) writes a row change of rendered rows from
    ``envelope`` (None: the reference takes the table's events)."""

    table: TableSchema
    topic: str
    key_fields: tuple[_KeyHeaderField, ...]  # JSON key encoders: the key headers of a key change
    avro_key_fields: tuple[_AvroKeyField, ...]
    value_fields: tuple[_AvroField, ...]
    value_record: str  # full name of the Value record: the union branch of before/after
    key: _Writer | None  # None when the table has no key columns (its events are refused)
    value: _Writer
    # (before, after, source, op, now_ns) -> the change event's record, field writers called in a row
    # instead of through a dict and the generic record writer; None: the generic path only
    write_envelope: Callable[[Any, Any, Any, str, int, TransactionBlock | None], bytes] | None = None
    envelope: AvroEnvelope | None = None  # the constant pieces of its change records, for the compiled envelope
    truncate_key: ConnectSchema | None = None  # the truncate markers' key: the Key's fields, optional
    truncate_datum: dict[str, None] | None = None  # ... all null


def _placeholder(spec: ConnectSchema, text: str) -> Any:
    """What an unchanged TOASTed value becomes, where the Avro type can hold Debezium's placeholder."""
    if spec.type == "string":
        return text
    if spec.type == "bytes" and spec.name is None:  # bytea, not Decimal or Bits
        return text.encode()
    if spec.type == "array" and spec.items is not None and spec.items.name is None:
        if spec.items.type == "string":
            return [text]
        if spec.items.type in ("int16", "int32", "int64"):
            return list(text.encode())
    return _NO_PLACEHOLDER


class AvroSerializer(EventSerializer[AvroTablePlan]):
    """Events -> records in Avro with a schema registry. One per sink; not thread-safe."""

    def __init__(
        self,
        settings: AvroSettings,
        partitions_of: Callable[[str], int],
        registry: SchemaRegistry,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        envelope: type[AvroRecords] | None = _COMPILED_ENVELOPE,
    ) -> None:
        """``envelope``: the compiled envelope (``cdc.compiled`` chose it), or None for the reference alone."""
        super().__init__(settings, partitions_of, clock_ns=clock_ns)
        self._settings = settings
        self._registry = registry
        self._truncate_keys: dict[str, _Writer] = {}
        self._side_writers: dict[tuple[str, str], _Writer] = {}  # (topic, "key"/"value") of side topics
        self._message_key: _Writer | None = None
        self._message_value: _Writer | None = None
        # The envelope's source block per transaction and table, encoded around its two per-event fields.
        try:
            self._source_fields: list[tuple[str, Write]] | None = compile_writer(avro_schema(SOURCE_SCHEMA))[1][
                avro_name(SOURCE_SCHEMA.name or "")
            ]
        except Unsupported:
            self._source_fields = None
        # As in JsonSerializer: compiled, a row change of rendered rows is one call, every other event goes to
        # the reference (reference_records).
        self.records = avro_records(self, envelope, clock_ns=clock_ns, source_fields=self.source_fields)

    @property
    def settings(self) -> AvroSettings:
        return self._settings

    @property
    def source_fields(self) -> dict[str, Write] | None:
        """The compiled writers of the envelope's source record's fields; None: fastavro writes the block."""
        return None if self._source_fields is None else dict(self._source_fields)

    def schemas(self, table: TableSchema) -> tuple[Any, Any]:
        """(key schema, value schema) of a table schema, as registered (the key is None without key columns)."""
        plan = self.plan(table)
        return (plan.key.schema if plan.key is not None else None), plan.value.schema

    # --- plans and schemas ------------------------------------------------------

    def _build_plan(self, table: TableSchema) -> AvroTablePlan:
        topic = self.topic_name(table.schema, table.name)
        opts = self._opts
        field_owner: dict[str, str] = {}
        value_fields: list[_AvroField] = []
        value_members: list[tuple[str, ConnectSchema, bool]] = []
        key_fields: list[_KeyHeaderField] = []
        avro_key_fields: list[_AvroKeyField] = []
        key_members: list[tuple[str, ConnectSchema, bool]] = []
        for column in table.columns:
            where = column_where(table, column)
            name = avro_field_name(column.name)
            owner = field_owner.setdefault(name, column.name)
            if owner != column.name:
                raise SerializationError(
                    f"table {table.qualified!r}: columns {owner!r} and {column.name!r} both become Avro field "
                    f"{name!r} (characters outside [A-Za-z0-9_] and a leading digit become '_'); "
                    "rename one of them, or use format json for this table"
                )
            spec = column_schema(column.type, column.modifier, opts, False, where)
            value_fields.append((column.name, name, spec.avro, _placeholder(spec, self._placeholder)))
            value_members.append((name, spec, not column.key))  # see the module docstring: non-key -> optional
            if column.key:
                key_spec = column_schema(column.type, column.modifier, opts, True, where)
                key_fields.append((column.name, key_spec.encode, None))
                avro_key_fields.append((column.name, name, key_spec.avro))
                key_members.append((name, key_spec, False))
        source = f"table {table.qualified}"
        key: _Writer | None = None
        if key_members:
            key_schema = avro_schema(ConnectSchema("struct", None, name=f"{topic}.Key", fields=tuple(key_members)))
            key = self._register(f"{topic}-key", key_schema, source)
        row = ConnectSchema("struct", None, name=f"{topic}.Value", fields=tuple(value_members))
        value = self._register(f"{topic}-value", avro_schema(envelope_schema(topic, row)), source)
        log.info(
            "avro.table_schemas",
            table=table.qualified,
            topic=topic,
            key_schema_id=key.schema_id if key is not None else None,
            value_schema_id=value.schema_id,
        )
        envelope_name = avro_name(f"{topic}.Envelope")
        fields = value.fields.get(envelope_name) if value.write is not None else None
        write_envelope = envelope_writer(value.prefix, fields)
        envelope = None
        if key is not None and key_fields and write_envelope is not None:
            envelope = avro_envelope(table, topic, key.prefix, value.prefix, fields)
        return AvroTablePlan(
            table=table,
            topic=topic,
            key_fields=tuple(key_fields),
            avro_key_fields=tuple(avro_key_fields),
            value_fields=tuple(value_fields),
            value_record=avro_name(f"{topic}.Value"),
            key=key,
            value=value,
            write_envelope=write_envelope,
            envelope=envelope,
            truncate_key=truncate_key_schema(topic, key_members),
            truncate_datum=dict.fromkeys(name for name, _, _ in key_members),
        )

    def _source(
        self,
        table: TableSchema,
        commit_ts_us: int,
        commit_lsn: int | None,
        lsn: int,
        xid: int | None,
        snapshot: bool,
    ) -> Any:
        """The source block, encoded once per transaction and table but for ``sequence`` and ``lsn``."""
        pieces = self.source_pieces(table, commit_ts_us, commit_lsn, xid, snapshot)
        if pieces is None or pieces.write_sequence is None or pieces.write_lsn is None:
            return super()._source(table, commit_ts_us, commit_lsn, lsn, xid, snapshot)
        sequence = pieces.write_sequence(sequence_text(commit_lsn, lsn))
        data = pieces.head + sequence + pieces.middle + pieces.write_lsn(int(lsn)) + pieces.tail
        # The dict only if fastavro has to write the envelope (a datum the compiled writer refused).
        make = functools.partial(EventSerializer._source, self, table, commit_ts_us, commit_lsn, lsn, xid, snapshot)
        return Encoded(data, make=make)

    def _build_source_pieces(
        self, table: TableSchema, commit_ts_us: int, commit_lsn: int | None, xid: int | None, snapshot: bool
    ) -> SourcePieces | None:
        if self._source_fields is None:
            return None
        value = super()._source(table, commit_ts_us, commit_lsn, 0, xid, snapshot)  # the LSN is not among the pieces
        pieces: list[bytes] = []
        writers: list[Write] = []
        current: list[bytes] = []
        for name, write in self._source_fields:
            if name in ("sequence", "lsn"):
                pieces.append(b"".join(current))
                writers.append(write)
                current = []
            else:
                current.append(write(value[name]))
        pieces.append(b"".join(current))
        assert len(writers) == 2, "the source block has a sequence and an lsn"
        return SourcePieces(table, pieces[0], pieces[1], pieces[2], write_sequence=writers[0], write_lsn=writers[1])

    def _register(self, subject: str, schema: Any, source: str) -> _Writer:
        try:
            parsed = fastavro.parse_schema(schema)
        except (fastavro.schema.SchemaParseException, ValueError, TypeError, KeyError) as exc:
            raise SerializationError(f"{source}: the Avro schema for subject {subject!r} is invalid: {exc}") from exc
        schema_id = self._registry.register(subject, schema, source=source)
        if not 0 <= schema_id < 2**32:
            raise SerializationError(
                f"{source}: the registry gave subject {subject!r} schema id {schema_id}, which does not fit the "
                "4 bytes of the Confluent wire format; use a registry that issues 32-bit ids "
                "(Apicurio: its ccompat API's legacy id mode)"
            )
        prefix = bytes((MAGIC_BYTE,)) + schema_id.to_bytes(4, "big")
        write: Write | None = None
        fields: dict[str, dict[str, Write]] = {}
        try:
            write, by_record = compile_writer(schema)
            fields = {record: dict(writers) for record, writers in by_record.items()}
        except Unsupported:
            pass
        return _Writer(
            schema=schema,
            parsed=parsed,
            prefix=prefix,
            subject=subject,
            schema_id=schema_id,
            write=write,
            fields=fields,
        )

    def _truncate_writer(self, plan: AvroTablePlan) -> _Writer:
        writer = self._truncate_keys.get(plan.topic)
        if writer is None:
            assert plan.truncate_key is not None
            schema = avro_schema(plan.truncate_key)
            subject = f"{plan.topic}-{schema['namespace']}.{schema['name']}"  # TopicRecordNameStrategy
            writer = self._register(subject, schema, f"truncate markers of table {plan.table.qualified}")
            self._truncate_keys[plan.topic] = writer
        return writer

    def _message_writers(self) -> tuple[_Writer, _Writer]:
        if self._message_key is None or self._message_value is None:
            topic = self._message_topic
            self._message_key = self._register(f"{topic}-key", avro_schema(MESSAGE_KEY_SCHEMA), "logical messages")
            self._message_value = self._register(
                f"{topic}-value", avro_schema(MESSAGE_VALUE_SCHEMA), "logical messages"
            )
        return self._message_key, self._message_value

    # --- bytes ------------------------------------------------------------------

    def row_rendering(self, table: TableSchema) -> RowRendering | None:
        """Rows of ``table`` written by the decoder straight as the binary of its Value record (and its Key
        record), the columns of the direct types from their text; None when a schema is not compiled."""
        try:
            plan = self.plan(table)
        except SerializationError:
            return None
        if plan.key is None or plan.value.write is None or plan.key.write is None or not plan.avro_key_fields:
            return None
        value_writers = plan.value.fields.get(plan.value_record)
        key_writers = plan.key.fields.get(avro_name(f"{plan.topic}.Key"))
        if value_writers is None or key_writers is None:
            return None
        return avro_row_rendering(
            table, plan.value_fields, value_writers, plan.avro_key_fields, key_writers, self._opts
        )

    def _row(self, plan: AvroTablePlan, row: AnyRow | None, which: str) -> Any:
        rendered = encoded(row)
        if rendered is not None:
            return Encoded(rendered.data, _RENDERED)
        if row is None:
            raise SerializationError(f"table {plan.table.qualified!r}: the event has no {which} row")
        out: dict[str, Any] = {}
        toast = UNCHANGED_TOAST
        column = ""
        try:
            for column, name, encode, placeholder in plan.value_fields:
                value = row.get(column)
                if value is None:
                    out[name] = None
                elif value is toast:
                    if placeholder is _NO_PLACEHOLDER:
                        raise self._no_placeholder(plan, column)
                    out[name] = placeholder
                elif encode is None:
                    out[name] = value
                else:
                    out[name] = encode(value)
        except _ENCODE_ERRORS as exc:
            raise _column_error(plan.table, column, row.get(column), exc) from exc
        return out

    def _row_and_key(self, plan: AvroTablePlan, row: AnyRow | None, which: str) -> tuple[Any, bytes]:
        rendered = encoded(row)
        if rendered is None or plan.key is None:
            return self._row(plan, row, which), self._key(plan, row)
        return Encoded(rendered.data, _RENDERED), plan.key.prefix + rendered.key_data

    def _key(self, plan: AvroTablePlan, row: AnyRow | None) -> bytes:
        rendered = encoded(row)
        if rendered is not None and plan.key is not None:
            return plan.key.prefix + rendered.key_data
        if row is None:
            raise SerializationError(f"table {plan.table.qualified!r}: the event has no row to take the key from")
        assert plan.key is not None, "events of tables without key columns are refused before their keys"
        out: dict[str, Any] = {}
        column = ""
        try:
            for column, name, encode in plan.avro_key_fields:
                value = row.get(column)
                if value is None:
                    raise SerializationError(
                        f"key column {column!r} of table {plan.table.qualified!r} is NULL, and Avro key fields are "
                        "required; choose NOT NULL key columns for the table (tables[].key), or use format json"
                    )
                if value is UNCHANGED_TOAST:
                    raise unchanged_toast_key(plan.table, column)
                out[name] = value if encode is None else encode(value)
        except _ENCODE_ERRORS as exc:
            raise _column_error(plan.table, column, row.get(column), exc) from exc
        return _write(plan.key, out, f"the key of table {plan.table.qualified!r}")

    def _envelope(
        self,
        plan: AvroTablePlan,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        source: dict[str, Any],
        op: str,
        now_ns: int,
        transaction: TransactionBlock | None = None,
    ) -> bytes:
        fast = plan.write_envelope
        if fast is not None:
            try:
                return fast(before, after, source, op, now_ns, transaction)
            except COMPILED_ERRORS:
                pass  # the generic path below names what does not fit (through fastavro)
        if not AVRO_LONG_MIN <= now_ns <= AVRO_LONG_MAX:
            raise clock_beyond_avro_long(now_ns)
        record = plan.value_record
        payload = {
            # (name, value): fastavro's tuple notation picks the union branch without validating the row
            "before": None if before is None else (record, before),
            "after": None if after is None else (record, after),
            "source": source,
            "transaction": None if transaction is None else transaction.as_dict(),
            "op": op,
            "ts_ms": now_ns // 1_000_000,
            "ts_us": now_ns // 1000,
            "ts_ns": now_ns,
        }
        return _write(plan.value, payload, f"a change event of table {plan.table.qualified!r}")

    def _truncate_key(self, plan: AvroTablePlan, partition: int) -> bytes:
        return _write(self._truncate_writer(plan), dict(plan.truncate_datum or {}), "a truncate marker's key")

    def _message(self, event: MessageEvent) -> list[Record]:
        key_writer, value_writer = self._message_writers()
        now = self._clock_ns()
        value = {
            "op": "m",
            "ts_ms": now // 1_000_000,
            "source": self._message_source(event, now),
            "message": {"prefix": event.prefix, "content": event.content},
        }
        key = _write(key_writer, {"prefix": event.prefix}, "a logical message's key")
        body = _write(value_writer, value, f"logical message {event.prefix!r}")
        headers = position_headers(event.lsn, event.commit_lsn, event.xid, event.ordinal, enabled=self.position_headers)
        return [Record(self._message_topic, key, body, headers)]

    def side_record(
        self,
        topic: str,
        key_schema: ConnectSchema,
        key: dict[str, Any],
        value_schema: ConnectSchema,
        value: dict[str, Any],
    ) -> Record:
        writers = self._side_writers
        out: list[bytes] = []
        for part, spec, datum in (("key", key_schema, key), ("value", value_schema, value)):
            writer = writers.get((topic, part))
            if writer is None:
                writer = writers[(topic, part)] = self._register(f"{topic}-{part}", avro_schema(spec), f"topic {topic}")
            out.append(_write(writer, datum, f"a record of {topic}"))
        return Record(topic, out[0], out[1])

    def _no_placeholder(self, plan: AvroTablePlan, column: str) -> SerializationError:
        return SerializationError(
            f"column {column!r} of table {plan.table.qualified!r}: an unchanged TOASTed value (the UPDATE did not "
            "change it, so the server did not send it) has no placeholder in this column's Avro type; "
            "set REPLICA IDENTITY FULL on the table so the old row fills it, or use format json"
        )


_RENDERED: Final = object()  # the datum of a row the decoder rendered: there is no typed one for fastavro


def _write(writer: _Writer, datum: dict[str, Any], what: str) -> bytes:
    """Confluent wire format: magic byte, schema id, Avro binary.

    The compiled writer first; when it raises (a datum that does not fit, or a shape it is stricter
    about), fastavro writes the datum or names what does not fit."""
    if writer.write is not None:
        try:
            return writer.prefix + writer.write(datum)
        except COMPILED_ERRORS:
            pass
    datum = {k: _plain(v, what) for k, v in datum.items()}
    buffer = io.BytesIO()
    buffer.write(writer.prefix)
    try:
        fastavro.schemaless_writer(buffer, writer.parsed, datum)
    except (*_ENCODE_ERRORS, KeyError) as exc:
        raise _invalid(writer, datum, what, exc) from exc
    return buffer.getvalue()


def _plain(value: Any, what: str) -> Any:
    """A top-level field's datum for fastavro: spliced values (also inside the ``(name, value)`` notation)
    as the data they encode. A row the decoder rendered has none: that is an error, never a null."""
    if type(value) is tuple and len(value) == 2:
        return (value[0], _plain(value[1], what))
    if type(value) is not Encoded:
        return value
    datum = value.datum()
    if datum is _RENDERED:
        raise SerializationError(
            f"{what}: a row rendered by the decoder did not fit its Avro schema (a bug; please report it)"
        )
    return datum


def _invalid(writer: _Writer, datum: dict[str, Any], what: str, exc: Exception) -> SerializationError:
    """Say which field does not fit (the slow path after a failure)."""
    detail = str(exc)
    try:
        fastavro.validation.validate(datum, writer.parsed, raise_errors=True)
    except fastavro.validation.ValidationError as validation:
        detail = "; ".join(str(e) for e in validation.errors) or str(validation)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
        pass  # the validator itself tripped on the datum: the writer's own message (detail) is still there
    return SerializationError(
        f"{what} does not fit its Avro schema (subject {writer.subject!r}, id {writer.schema_id}): {detail}"
    )


def _column_error(table: TableSchema, column: str, value: Any, exc: Exception) -> SerializationError:
    return SerializationError(
        f"column {column!r} of table {table.qualified!r}: cannot encode {type(value).__name__} "
        f"value {value!r:.80} for Avro: {exc}"
    )


def decode_wire(data: bytes) -> tuple[int, bytes]:
    """(schema id, Avro body) of a Confluent wire-format message; ValueError if it is not one."""
    if len(data) < 5 or data[0] != MAGIC_BYTE:
        raise ValueError(f"not Confluent wire format (magic byte 0, 4-byte schema id): {data[:8]!r}")
    return int.from_bytes(data[1:5], "big"), data[5:]
