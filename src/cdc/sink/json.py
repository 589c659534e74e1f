"""Events to Kafka records in Debezium's JSON shape (JsonConverter, optionally with schemas).

``JsonSerializer.records(event)`` turns a ``ChangeEvent``, ``TruncateEvent`` or
``MessageEvent`` into the records to produce, in order. The wire shapes follow
the Debezium 3.x PostgreSQL connector with its default settings; values by type are in
``cdc.sink.typemap``, records and keys in ``cdc.sink.records``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from cdc.compiled import CHOSEN
from cdc.event import AnyRow, MessageEvent, Op, TableSchema, TransactionBlock
from cdc.sink.connect import (
    MESSAGE_KEY_SCHEMA,
    MESSAGE_VALUE_SCHEMA,
    ColumnField,
    ConnectSchema,
    envelope_schema,
    schema_prefix,
    truncate_key_schema,
)
from cdc.sink.encode import b64
from cdc.sink.envelopes import json_records
from cdc.sink.errors import SerializationError
from cdc.sink.fallback import json_fallback
from cdc.sink.record import Record
from cdc.sink.records import EventSerializer, SourcePieces, column_where, position_headers, value_error
from cdc.sink.rendering import RowRendering, encoded
from cdc.sink.rendering_json import json_row_rendering
from cdc.sink.settings import JsonSettings
from cdc.sink.typemap import column_schema, toast_placeholder
from cdc.values import UNCHANGED_TOAST

if TYPE_CHECKING:
    from cdc.sink._envelope import JsonRecords

__all__ = ["JsonSerializer", "JsonSettings", "JsonTablePlan", "ReadParts"]

_COMPILED_ENVELOPE: Final[type[JsonRecords] | None] = CHOSEN.compiled("envelope", "JsonRecords")


@dataclass(frozen=True, slots=True)
class JsonTablePlan:
    """Everything per table schema that does not change per row. The compiled envelope
    (``cdc.sink._envelope.JsonRecords``) writes a row change of rendered rows from ``topic``, ``key_prefix``
    and ``value_prefix`` (none when ``key_fields`` is empty: the reference raises that error)."""

    table: TableSchema
    topic: str
    fields: tuple[ColumnField, ...]
    key_fields: tuple[ColumnField, ...]
    key_prefix: bytes  # b'{"schema":<key schema>,"payload":' or b''
    value_prefix: bytes  # the same for the envelope
    truncate_key: bytes  # the truncate markers' key: the key fields, all null
    encode_row: Callable[[dict[str, Any]], dict[str, Any]]  # row_encoder(fields)
    null_texts: tuple[bytes, ...] = ()  # per column: what a missing value renders as (null, or the fallback)


# The JSON envelope with its parts as text (before, after, source, ts_ms, ts_us, ts_ns), by op: the key
# order and spacing orjson writes for JsonSerializer._envelope's dict.
_ENVELOPE_TEMPLATES: Final[dict[str, bytes]] = {
    op.value: b'{"before":%b,"after":%b,"source":%b,"transaction":null,"op":"'
    + op.value.encode()
    + b'","ts_ms":%d,"ts_us":%d,"ts_ns":%d}'
    for op in Op
}

# The same with the transaction block (transaction_metadata: true) as a fifth part, before the times.
_TX_ENVELOPE_TEMPLATES: Final[dict[str, bytes]] = {
    op: template.replace(b'"transaction":null', b'"transaction":%b') for op, template in _ENVELOPE_TEMPLATES.items()
}


def _fragment(part: Any) -> Any:
    """A part of a JSON envelope for orjson: JSON text (bytes) as a Fragment, anything else as it is."""
    return orjson.Fragment(part) if type(part) is bytes else part


def _json_text(part: Any) -> bytes:
    """A part of a JSON envelope as JSON text."""
    return part if type(part) is bytes else orjson.dumps(part)


@dataclass(frozen=True, slots=True)
class ReadParts:
    """A snapshot read's JSON records in pieces: key = key_head + <key object> + key_end; value = value_head +
    <after object> + value_middle + ``times(now_ns)`` + value_end, byte for byte what ``records`` makes of the
    same row (the unit tests check it)."""

    topic: str
    columns: tuple[str, ...]  # the after object's members, in order
    key_columns: tuple[str, ...]  # the key object's members, in order
    key_head: bytes
    key_end: bytes
    value_head: bytes
    value_middle: bytes
    value_end: bytes

    @staticmethod
    def times(now_ns: int) -> bytes:
        """The envelope's processing-time members."""
        return b'"ts_ms":%d,"ts_us":%d,"ts_ns":%d' % (now_ns // 1_000_000, now_ns // 1000, now_ns)


class JsonSerializer(EventSerializer[JsonTablePlan]):
    """Events -> records in Debezium's JSON shape. One per sink; not thread-safe."""

    def __init__(
        self,
        settings: JsonSettings,
        partitions_of: Callable[[str], int],
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        envelope: type[JsonRecords] | None = _COMPILED_ENVELOPE,
    ) -> None:
        """``envelope``: the compiled envelope (``cdc.compiled`` chose it), or None for the reference alone."""
        super().__init__(settings, partitions_of, clock_ns=clock_ns)
        self._settings = settings
        self._schemas = settings.schemas_enable
        self._message_key_prefix = b""
        self._message_value_prefix = b""
        self._side_prefixes: dict[ConnectSchema, bytes] = {}
        if self._schemas:
            self._message_key_prefix = schema_prefix(MESSAGE_KEY_SCHEMA.node(False))
            self._message_value_prefix = schema_prefix(MESSAGE_VALUE_SCHEMA.node(False))
        # Compiled, a row change of rendered rows is one call (plan, source block, key, envelope, headers,
        # records) and every other event goes to the reference, reference_records.
        self.records = json_records(self, envelope, schemas=self._schemas, clock_ns=clock_ns)

    @property
    def settings(self) -> JsonSettings:
        return self._settings

    # ``source`` as JSON text made once per transaction and table: only the event's LSN changes
    # within one (it appears twice, in ``sequence`` and ``lsn``); the rest is spliced around it.
    _LSN_SENTINEL: Final = 7_777_777_777_777_777_777

    def _source(
        self,
        table: TableSchema,
        commit_ts_us: int,
        commit_lsn: int | None,
        lsn: int,
        xid: int | None,
        snapshot: bool,
    ) -> Any:
        pieces = self.source_pieces(table, commit_ts_us, commit_lsn, xid, snapshot)
        if pieces is None:  # the sentinel's digits occur elsewhere too (a database named so): no splicing
            return super()._source(table, commit_ts_us, commit_lsn, lsn, xid, snapshot)
        text = b"%d" % lsn
        # JSON text as bytes: _envelope splices it (orjson.Fragment when the envelope goes through orjson)
        return pieces.head + text + pieces.middle + text + pieces.tail

    def _build_source_pieces(
        self, table: TableSchema, commit_ts_us: int, commit_lsn: int | None, xid: int | None, snapshot: bool
    ) -> SourcePieces | None:
        template = orjson.dumps(super()._source(table, commit_ts_us, commit_lsn, self._LSN_SENTINEL, xid, snapshot))
        pieces = template.split(b"%d" % self._LSN_SENTINEL)
        return SourcePieces(table, pieces[0], pieces[1], pieces[2]) if len(pieces) == 3 else None

    def _build_plan(self, table: TableSchema) -> JsonTablePlan:
        topic = self.topic_name(table.schema, table.name)
        opts = self._opts
        fields: list[ColumnField] = []
        value_members: list[tuple[str, ConnectSchema, bool]] = []
        key_fields: list[ColumnField] = []
        key_members: list[tuple[str, ConnectSchema, bool]] = []
        fallbacks: list[Any] = []
        for column in table.columns:
            where = column_where(table, column)
            spec = column_schema(column.type, column.modifier, opts, False, where)
            fields.append((column.name, spec.encode, toast_placeholder(column.type, spec, self._placeholder)))
            optional = column.nullable and not column.key
            value_members.append((column.name, spec, optional))
            fallbacks.append(NO_FALLBACK if optional else json_fallback(column.type, column.modifier, spec))
            if column.key:
                key_spec = column_schema(column.type, column.modifier, opts, True, where)
                key_fields.append((column.name, key_spec.encode, None))  # no placeholder: see _encode_key
                key_members.append((column.name, key_spec, False))
        key_prefix = value_prefix = b""
        truncate_key = orjson.dumps(dict.fromkeys(name for name, _, _ in key_fields))
        if self._schemas:
            row = ConnectSchema("struct", None, name=f"{topic}.Value", fields=tuple(value_members))
            envelope = envelope_schema(topic, row)
            value_prefix = schema_prefix(envelope.node(False))
            key = ConnectSchema("struct", None, name=f"{topic}.Key", fields=tuple(key_members))
            key_prefix = schema_prefix(key.node(False))
            truncate_key = schema_prefix(truncate_key_schema(topic, key_members).node(False)) + truncate_key + b"}"
        return JsonTablePlan(
            table=table,
            topic=topic,
            fields=tuple(fields),
            key_fields=tuple(key_fields),
            key_prefix=key_prefix,
            value_prefix=value_prefix,
            truncate_key=truncate_key,
            encode_row=row_encoder(fields, fallbacks),
            null_texts=tuple(b"null" if f is NO_FALLBACK else orjson.dumps(f) for f in fallbacks),
        )

    def read_parts(self, table: TableSchema, commit_ts_us: int, lsn: int, xid: int | None) -> ReadParts:
        """The constant parts of the records of snapshot reads of ``table`` at ``lsn``, for a writer that has
        each row's ``after`` object and key object as JSON text already (the snapshot's server-built rows)."""
        plan = self.plan(table)
        source = _json_text(self._source(table, commit_ts_us, lsn, lsn, xid, True))
        return ReadParts(
            topic=plan.topic,
            columns=tuple(name for name, _, _ in plan.fields),
            key_columns=tuple(name for name, _, _ in plan.key_fields),
            key_head=plan.key_prefix,
            key_end=b"}" if self._schemas else b"",
            value_head=plan.value_prefix + b'{"before":null,"after":',
            value_middle=b',"source":' + source + b',"transaction":null,"op":"r",',
            value_end=b"}}" if self._schemas else b"}",
        )

    def row_rendering(self, table: TableSchema) -> RowRendering | None:
        """How the decoder may write ``table``'s rows as JSON text (``RenderedRow``), skipping typed
        values where a column's text maps straight to its JSON; None: the table cannot be keyed (the
        typed path raises that error at its first row)."""
        try:
            plan = self.plan(table)
        except SerializationError:
            return None
        if not plan.key_fields:
            return None
        if any(c.key and c.nullable for c in table.columns):
            return None  # a key column that may be NULL: the typed path checks every key (_encode_key)
        return json_row_rendering(table, plan.fields, plan.key_fields, self._opts, plan.null_texts)

    def _truncate_key(self, plan: JsonTablePlan, partition: int) -> bytes:
        return plan.truncate_key

    def side_record(
        self,
        topic: str,
        key_schema: ConnectSchema,
        key: dict[str, Any],
        value_schema: ConnectSchema,
        value: dict[str, Any],
    ) -> Record:
        key_bytes, value_bytes = orjson.dumps(key), orjson.dumps(value)
        if self._schemas:
            key_bytes = self._side_prefix(key_schema) + key_bytes + b"}"
            value_bytes = self._side_prefix(value_schema) + value_bytes + b"}"
        return Record(topic, key_bytes, value_bytes)

    def _side_prefix(self, schema: ConnectSchema) -> bytes:
        prefix = self._side_prefixes.get(schema)
        if prefix is None:
            prefix = self._side_prefixes[schema] = schema_prefix(schema.node(False))
        return prefix

    def _message(self, event: MessageEvent) -> list[Record]:
        now = self._clock_ns()
        value = orjson.dumps(
            {
                "op": "m",
                "ts_ms": now // 1_000_000,
                "source": self._message_source(event, now),
                "message": {"prefix": event.prefix, "content": b64(event.content)},
            }
        )
        key = orjson.dumps({"prefix": event.prefix})
        if self._schemas:
            key = self._message_key_prefix + key + b"}"
            value = self._message_value_prefix + value + b"}"
        headers = position_headers(event.lsn, event.commit_lsn, event.xid, event.ordinal, enabled=self.position_headers)
        return [Record(self._message_topic, key, value, headers)]

    def _envelope(
        self,
        plan: JsonTablePlan,
        before: Any,  # None, a dict, or JSON text (bytes); so are after and source
        after: Any,
        source: Any,
        op: str,
        now_ns: int,
        transaction: TransactionBlock | None = None,
    ) -> bytes:
        # Rows the decoder rendered and the spliced source block are JSON text already (bytes): the
        # envelope is then one formatting of a template, the bytes orjson would write for the dict below.
        template = _ENVELOPE_TEMPLATES.get(op) if transaction is None else _TX_ENVELOPE_TEMPLATES.get(op)
        if (
            template is not None
            and type(source) is bytes
            and (before is None or type(before) is bytes)
            and (after is None or type(after) is bytes)
        ):
            if transaction is None:
                body = template % (
                    b"null" if before is None else before,
                    b"null" if after is None else after,
                    source,
                    now_ns // 1_000_000,
                    now_ns // 1000,
                    now_ns,
                )
            else:
                body = template % (
                    b"null" if before is None else before,
                    b"null" if after is None else after,
                    source,
                    orjson.dumps(transaction.as_dict()),
                    now_ns // 1_000_000,
                    now_ns // 1000,
                    now_ns,
                )
            return plan.value_prefix + body + b"}" if self._schemas else body
        payload = {
            "before": _fragment(before),
            "after": _fragment(after),
            "source": _fragment(source),
            "transaction": None if transaction is None else transaction.as_dict(),
            "op": op,
            "ts_ms": now_ns // 1_000_000,
            "ts_us": now_ns // 1000,
            "ts_ns": now_ns,
        }
        try:
            body = orjson.dumps(payload)
        except orjson.JSONEncodeError as exc:
            raise SerializationError(
                f"table {plan.table.qualified!r}: a value cannot be written as JSON: {exc}"
            ) from exc
        if self._schemas:
            return plan.value_prefix + body + b"}"
        return body

    def _row(self, plan: JsonTablePlan, row: AnyRow | None, which: str) -> Any:
        rendered = encoded(row)
        if rendered is not None:
            return rendered.data  # JSON text: see _envelope
        if row is None:
            raise SerializationError(f"table {plan.table.qualified!r}: the event has no {which} row")
        try:
            return plan.encode_row(row)  # type: ignore[arg-type]  # not rendered (above): a typed row, a dict
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise value_error(plan.table, plan.fields, row, exc) from exc

    def _key_payload(self, plan: JsonTablePlan, row: AnyRow | None) -> bytes:
        rendered = encoded(row)
        if rendered is not None:
            return rendered.key_data
        return super()._key_payload(plan, row)

    def _key(self, plan: JsonTablePlan, row: AnyRow | None) -> bytes:
        rendered = encoded(row)  # _key_payload's work inline: this runs once or twice per row
        payload = rendered.key_data if rendered is not None else super()._key_payload(plan, row)
        if self._schemas:
            return plan.key_prefix + payload + b"}"
        return payload

    def _row_and_key(self, plan: JsonTablePlan, row: AnyRow | None, which: str) -> tuple[Any, bytes]:
        rendered = encoded(row)
        if rendered is None:
            return self._row(plan, row, which), self._key(plan, row)
        if self._schemas:
            return rendered.data, plan.key_prefix + rendered.key_data + b"}"
        return rendered.data, rendered.key_data


NO_FALLBACK: Final = object()
"""``row_encoder``'s fallback of an optional field: a missing value stays null."""


def row_encoder(
    fields: Sequence[ColumnField], fallbacks: Sequence[Any] | None = None
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A function encoding one row of the plan's fields, generated with the column loop unrolled (it runs
    per row): NULL stays None, an unchanged TOASTed value becomes the field's placeholder, any other value
    goes through the field's encoder (or as it is when there is none). Encoders' errors propagate.

    ``fallbacks`` (aligned with ``fields``): for a required field, the encoded value a missing or NULL
    column becomes (``cdc.sink.fallback``: a delete's key-only old tuple), so the row stays valid against
    its schema; ``NO_FALLBACK`` for an optional one."""
    lines = ["def encode(row, toast=toast):"]
    names: dict[str, Any] = {"toast": UNCHANGED_TOAST}
    for i, (name, encode, placeholder) in enumerate(fields):
        names[f"e{i}"] = encode
        names[f"p{i}"] = placeholder
        fallback = NO_FALLBACK if fallbacks is None else fallbacks[i]
        names[f"f{i}"] = fallback
        lines.append(f"    v{i} = row.get({name!r})")
        if encode is None:
            lines.append(f"    if v{i} is toast: v{i} = p{i}")
            if fallback is not NO_FALLBACK:
                lines.append(f"    elif v{i} is None: v{i} = f{i}")
        else:
            lines.append(f"    if v{i} is not None: v{i} = p{i} if v{i} is toast else e{i}(v{i})")
            if fallback is not NO_FALLBACK:
                lines.append(f"    else: v{i} = f{i}")
    lines.append("    return {" + ", ".join(f"{name!r}: v{i}" for i, (name, _, _) in enumerate(fields)) + "}")
    lines[0] = (
        "def encode(row, toast=toast" + "".join(f", e{i}=e{i}, p{i}=p{i}, f{i}=f{i}" for i in range(len(fields))) + "):"
    )
    exec("\n".join(lines), names)
    encoder: Callable[[dict[str, Any]], dict[str, Any]] = names["encode"]
    return encoder
