"""The serializers' compiled envelopes (``cdc.sink._envelope``), built around their reference.

A serializer is handed, when it is built, the compiled envelope class that ``cdc.compiled`` chose (or None:
the reference). ``json_records`` and ``avro_records`` make its ``records`` of it: a row change of rendered
rows in one call, every other event handed to ``EventSerializer.reference_records``, which writes the same
bytes (tests/unit/test_envelope_codec.py, tests/unit/test_avro_envelope_codec.py). The compiled envelope
reads the serializer through public, typed contracts only: its table plan (``EventSerializer.plan``: the
JSON plan's topic and prefixes, the Avro plan's ``AvroEnvelope``), the source block's ``SourcePieces``
(``EventSerializer.source_pieces``) and ``position_headers``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from cdc.event import ChangeEvent, Op, TableSchema, TransactionBlock
from cdc.sink.avro_write import COMPILED_ERRORS, Encoded, Write, write_long
from cdc.sink.errors import clock_beyond_avro_long
from cdc.sink.record import Record
from cdc.sink.records import EventSerializer, Records, position_headers
from cdc.sink.rendering import RenderedRow
from cdc.sink.wire import COMMIT_LSN_HEADER, LSN_HEADER, ORDINAL_HEADER, TXID_HEADER

if TYPE_CHECKING:
    from cdc.sink._envelope import AvroRecords, JsonRecords

__all__ = ["AvroEnvelope", "avro_envelope", "avro_records", "envelope_writer", "json_records", "source_prefixes"]


@dataclass(frozen=True, slots=True)
class AvroEnvelope:
    """The constant pieces of one table's Avro change records, taken from its plan's compiled field writers
    (``avro_envelope``): the Confluent wire format of the key and of the value, each union's branch bytes,
    the transaction field, the ops and the clock fields before their varints. ``cdc.sink._envelope.AvroRecords``
    writes a row change of rendered rows between them."""

    table: TableSchema
    topic: str
    key_prefix: bytes  # magic byte and the key schema's id
    value_prefix: bytes  # magic byte and the value schema's id
    before_null: bytes
    before_branch: bytes  # before the row's binary
    after_null: bytes
    after_branch: bytes
    no_transaction: bytes
    write_transaction: Write  # a transaction block's dict -> the field's bytes
    op_create: bytes
    op_read: bytes
    op_update: bytes
    op_delete: bytes
    ts_ms_prefix: bytes
    ts_us_prefix: bytes
    ts_ns_prefix: bytes


_AVRO_ENVELOPE_FIELDS: Final = ("before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns")
_LONG_SAMPLES: Final = (0, 1, -1, 63, 64, 2**31, 2**40 + 12345, 2**62 + 7, 2**63 - 1, -(2**63))


def avro_envelope(
    table: TableSchema, topic: str, key_prefix: bytes, value_prefix: bytes, fields: Mapping[str, Write] | None
) -> AvroEnvelope | None:
    """The ``AvroEnvelope`` of a table whose Envelope record's compiled field writers are ``fields``; None
    (the reference takes the table's events) when they are not compiled, or a field is not written as a
    prefix and the varint that ``AvroRecords`` writes."""
    if fields is None or tuple(fields) != _AVRO_ENVELOPE_FIELDS:
        return None
    before, after, op = fields["before"], fields["after"], fields["op"]
    try:
        ms, us, ns = (_long_prefix(fields[name]) for name in ("ts_ms", "ts_us", "ts_ns"))
        if ms is None or us is None or ns is None:
            return None
        return AvroEnvelope(
            table=table,
            topic=topic,
            key_prefix=key_prefix,
            value_prefix=value_prefix,
            before_null=before(None),
            before_branch=before(Encoded(b"")),
            after_null=after(None),
            after_branch=after(Encoded(b"")),
            no_transaction=fields["transaction"](None),
            write_transaction=fields["transaction"],
            op_create=op("c"),
            op_read=op("r"),
            op_update=op("u"),
            op_delete=op("d"),
            ts_ms_prefix=ms,
            ts_us_prefix=us,
            ts_ns_prefix=ns,
        )
    except COMPILED_ERRORS:
        return None


EnvelopeWriter = Callable[[Any, Any, Any, str, int, TransactionBlock | None], bytes]
"""``(before, after, source, op, now_ns, transaction)`` -> an Avro change record's value."""


def envelope_writer(prefix: bytes, fields: Mapping[str, Write] | None) -> EnvelopeWriter | None:
    """The reference's writer of a change record's value: the wire ``prefix``, then the Envelope record's eight
    fields' compiled writers (``fields``) called in schema order; None when the schema was not compiled or its
    envelope has other fields. The bytes are the generic writer's (tests/unit/test_avro_write.py compares
    them); the caller falls back to it when this raises."""
    if fields is None or tuple(fields) != _AVRO_ENVELOPE_FIELDS:
        return None
    before_w, after_w, source_w, transaction_w, op_w, ms_w, us_w, ns_w = fields.values()
    try:
        no_transaction = transaction_w(None)  # the envelope's transaction block, unless metadata is on
    except COMPILED_ERRORS:
        return None

    def write(
        before: Any, after: Any, source: Any, op: str, now_ns: int, transaction: TransactionBlock | None = None
    ) -> bytes:
        return b"".join(
            (
                prefix,
                before_w(before),
                after_w(after),
                source.data if type(source) is Encoded else source_w(source),
                no_transaction if transaction is None else transaction_w(transaction.as_dict()),
                op_w(op),
                ms_w(now_ns // 1_000_000),
                us_w(now_ns // 1000),
                ns_w(now_ns),
            )
        )

    return write


def _long_prefix(write: Callable[[Any], bytes]) -> bytes | None:
    """What ``write`` (a long field's writer, or a union's) puts before the long's varint; None when it is not
    that for every sample."""
    prefix = write(0)[:-1]
    if any(write(n) != prefix + write_long(n) for n in _LONG_SAMPLES):
        return None
    return prefix


def _string_prefix(write: Callable[[Any], bytes]) -> bytes | None:
    """What ``write`` (a string field's writer, or a union's) puts before the string's length and text."""
    prefix = write("")[:-1]
    if any(write(t) != prefix + write_long(len(t.encode())) + t.encode() for t in ("", '[null,"0"]', "x" * 200)):
        return None
    return prefix


def source_prefixes(source_fields: Mapping[str, Write] | None) -> tuple[bytes, bytes] | None:
    """What the Avro source block's ``sequence`` and ``lsn`` writers put before the values ``AvroRecords``
    writes; None when they are not compiled or not that."""
    if source_fields is None:
        return None
    try:
        sequence = _string_prefix(source_fields["sequence"])
        lsn = _long_prefix(source_fields["lsn"])
    except (*COMPILED_ERRORS, KeyError):
        return None
    if sequence is None or lsn is None:
        return None
    return sequence, lsn


_OPS: Final = (Op.CREATE, Op.READ, Op.UPDATE, Op.DELETE)
_HEADER_NAMES: Final = (LSN_HEADER, COMMIT_LSN_HEADER, TXID_HEADER, ORDINAL_HEADER)


def json_records(
    serializer: EventSerializer[Any],
    envelope: type[JsonRecords] | None,
    *,
    schemas: bool,
    clock_ns: Callable[[], int],
    reference: Records | None = None,
) -> Records:
    """The ``records`` of a JSON serializer: ``envelope`` (``_envelope.JsonRecords``) around its reference
    (``reference``, by default ``serializer.reference_records``), or the reference itself when ``envelope``
    is None."""
    reference = serializer.reference_records if reference is None else reference
    if envelope is None:
        return reference
    records: Records = envelope(
        serializer,
        reference,
        ChangeEvent,
        RenderedRow,
        Record,
        _OPS,
        position_headers,
        _HEADER_NAMES,
        schemas,
        clock_ns,
        orjson.dumps,
    )
    return records


def avro_records(
    serializer: EventSerializer[Any],
    envelope: type[AvroRecords] | None,
    *,
    clock_ns: Callable[[], int],
    source_fields: Mapping[str, Write] | None,
    reference: Records | None = None,
) -> Records:
    """The ``records`` of an Avro serializer: ``envelope`` (``_envelope.AvroRecords``) around its reference
    (as in ``json_records``), or the reference itself when ``envelope`` is None or the source block is not
    compiled (``source_fields``: the writers of the source record's fields)."""
    reference = serializer.reference_records if reference is None else reference
    prefixes = source_prefixes(source_fields)
    if envelope is None or prefixes is None:
        return reference
    records: Records = envelope(
        serializer,
        reference,
        ChangeEvent,
        RenderedRow,
        Record,
        _OPS,
        position_headers,
        _HEADER_NAMES,
        clock_ns,
        clock_beyond_avro_long,
        *prefixes,
    )
    return records
