"""Row rendering in Avro: pgoutput's column text straight to the binary of a row's Value and Key records,
for the types ``direct_type`` names; other columns through their compiled field writers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cdc.event import PgType, TableSchema
from cdc.sink.avro_write import COMPILED_ERRORS, Write, write_long
from cdc.sink.connect import Encoder
from cdc.sink.rendering import RowRendering
from cdc.sink.rendering_text import (
    check_int_text,
    check_uuid_text,
    direct_kind,
    direct_type,
    fixed_numeric_bytes,
    typed_renderer,
    zoned_timestamp_text,
)
from cdc.sink.typemap import TypeOptions, numeric_typmod, time_precision


def _try_null(write: Write) -> bytes | None:
    """A field's encoding of NULL, or None when the field is required."""
    try:
        return write(None)
    except COMPILED_ERRORS:
        return None


def _tagged(base: Callable[[bytes], bytes] | None, tag: bytes) -> Callable[[bytes], bytes] | None:
    """A renderer of a nullable field: its union branch's index, then the value."""
    if base is None or not tag:
        return base

    def render(raw: bytes) -> bytes:
        return tag + base(raw)

    return render


def _avro_string(raw: bytes) -> bytes:
    if not raw.isascii():
        raw.decode()  # valid UTF-8, or ValueError (the typed path names the column)
    return write_long(len(raw)) + raw


def _avro_long(raw: bytes) -> bytes:
    return write_long(int(check_int_text(raw)))


def _avro_bool(raw: bytes) -> bytes:
    if raw == b"t":
        return b"\x01"
    if raw == b"f":
        return b"\x00"
    raise ValueError(raw)


def _avro_uuid(raw: bytes) -> bytes:
    return b"\x48" + check_uuid_text(raw)  # 36 bytes: the length's zig-zag varint is 0x48


def _avro_direct(pg_type: PgType, modifier: int, opts: TypeOptions) -> Callable[[bytes], bytes] | None:
    """The Avro renderer (no union index) of a column's text, for the types ``direct_type`` names."""
    kind = direct_type(pg_type, modifier, opts)
    if kind == "int":
        return _avro_long  # int and long are the same varint
    if kind == "text":
        return _avro_string
    if kind == "bool":
        return _avro_bool
    if kind == "uuid":
        return _avro_uuid
    if kind == "timestamptz":
        text = zoned_timestamp_text(time_precision(modifier))  # unquoted: the Avro string

        def zoned(raw: bytes) -> bytes:
            value = text(raw)
            return write_long(len(value)) + value

        return zoned
    if kind == "numeric":
        typmod = numeric_typmod(modifier)
        assert typmod is not None
        unscaled = fixed_numeric_bytes(typmod[1])

        def decimal(raw: bytes) -> bytes:
            data = unscaled(raw)
            return write_long(len(data)) + data

        return decimal
    return None


def avro_row_rendering(
    table: TableSchema,
    value_fields: Sequence[tuple[str, str, Encoder | None, Any]],
    value_writers: Mapping[str, Write],
    key_fields: Sequence[tuple[str, str, Encoder | None]],
    key_writers: Mapping[str, Write],
    opts: TypeOptions,
) -> RowRendering:
    """Rows of ``table`` written by the decoder straight as the binary of its Value record (and its Key
    record), the columns of the direct types from their text. ``value_fields``/``key_fields``: the Avro
    plan's (column, Avro field, encoder[, placeholder]); ``*_writers``: the records' compiled field writers."""
    render: list[Callable[[bytes], bytes] | None] = []
    typed: list[Callable[[Any], bytes]] = []
    nulls: list[bytes | None] = []
    direct: list[tuple[str, int] | None] = []
    tags: list[bytes] = []
    for column, (_name, field, encode, _) in zip(table.columns, value_fields, strict=True):
        write = value_writers[field]
        null = _try_null(write)
        nulls.append(null)
        tag = b"" if null is None else (b"\x02" if null == b"\x00" else b"\x00")
        render.append(_tagged(_avro_direct(column.type, column.modifier, opts), tag))
        typed.append(typed_renderer(write, encode))
        direct.append(direct_kind(column.type, column.modifier, opts))
        tags.append(tag)
    names = tuple(c.name for c in table.columns)
    key_index = tuple(names.index(key_column) for key_column, _, _ in key_fields)
    key_typed: list[Callable[[Any], bytes]] = []
    key_nulls: list[bytes | None] = []
    for _, field, encode in key_fields:
        write = key_writers[field]
        key_nulls.append(_try_null(write))
        key_typed.append(typed_renderer(write, encode))
    return RowRendering(
        names=names,
        render=tuple(render),
        typed=tuple(typed),
        null=tuple(nulls),
        row_format=b"%b" * len(names),
        key_index=key_index,
        key_typed=tuple(key_typed),
        key_null=tuple(key_nulls),
        key_format=b"%b" * len(key_index),
        format="avro",
        direct=tuple(direct),
        prefix=tuple(tags),
    )
