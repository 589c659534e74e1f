"""Row rendering in JSON: pgoutput's column text straight to the JSON value (the streaming fast path).

Each renderer returns exactly the bytes orjson writes for the encoder's value of the same text
(tests/unit/test_render.py compares them value by value) and raises ValueError for any text it does
not cover, which sends the row down the typed path.
"""

from __future__ import annotations

import binascii
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import orjson

from cdc.event import PgType, TableSchema
from cdc.sink.connect import ColumnField
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

_JSON_SPECIAL: Final = re.compile(rb'["\\\x00-\x1f]').search  # what orjson escapes in a string


def _render_text(raw: bytes) -> bytes:
    if raw.isascii() and _JSON_SPECIAL(raw) is None:
        return b'"' + raw + b'"'
    return orjson.dumps(raw.decode())  # UnicodeDecodeError is a ValueError: the typed path names it


def _render_bool(raw: bytes) -> bytes:
    if raw == b"t":
        return b"true"
    if raw == b"f":
        return b"false"
    raise ValueError(raw)


def _render_uuid(raw: bytes) -> bytes:
    return b'"' + check_uuid_text(raw) + b'"'


@functools.lru_cache(maxsize=64)
def _render_fixed_numeric(scale: int) -> Callable[[bytes], bytes]:
    """numeric(p, scale) under ``precise``: base64 of the two's complement, as a JSON string."""
    b64 = binascii.b2a_base64
    unscaled = fixed_numeric_bytes(scale)

    def render(raw: bytes) -> bytes:
        return b'"' + b64(unscaled(raw), newline=False) + b'"'

    return render


def _direct_renderer(pg_type: PgType, modifier: int, opts: TypeOptions) -> Callable[[bytes], bytes] | None:
    """The JSON renderer of a column's text, for the built-in types whose text maps to JSON cheaply.

    Only types whose key encoding is their value encoding (``column_schema(..., key=True)``
    differs for doubles, timetz and intervals, none of them here): keys are rendered by the same
    function."""
    kind = direct_type(pg_type, modifier, opts)
    if kind == "int":
        return check_int_text
    if kind == "text":
        return _render_text
    if kind == "bool":
        return _render_bool
    if kind == "uuid":
        return _render_uuid
    if kind == "timestamptz":
        return zoned_timestamp_text(time_precision(modifier), b'"')
    if kind == "numeric":
        typmod = numeric_typmod(modifier)
        assert typmod is not None
        return _render_fixed_numeric(typmod[1])
    return None


def _object_format(names: Sequence[str]) -> bytes:
    """``{"a":%b,"b":%b}``: a JSON object of these members, for bytes formatting (``%`` in names doubled)."""
    return b"{" + b",".join(orjson.dumps(name).replace(b"%", b"%%") + b":%b" for name in names) + b"}"


def json_row_rendering(
    table: TableSchema,
    fields: Sequence[ColumnField],
    key_fields: Sequence[ColumnField],
    opts: TypeOptions,
    null_texts: Sequence[bytes],
) -> RowRendering:
    """How the decoder writes ``table``'s rows as JSON text (``RenderedRow``): a column whose text maps
    straight to its JSON from its text, any other from its typed value through the field's encoder.
    ``fields``/``key_fields``: the JSON plan's (column name, encoder, placeholder) per column and key column;
    ``null_texts``: per column, what a NULL (or a value the old tuple lacks) is written as."""
    render: list[Callable[[bytes], bytes] | None] = []
    typed: list[Callable[[Any], bytes]] = []
    direct: list[tuple[str, int] | None] = []
    for column, (_, encode, _) in zip(table.columns, fields, strict=True):
        render.append(_direct_renderer(column.type, column.modifier, opts))
        typed.append(typed_renderer(orjson.dumps, encode))
        direct.append(direct_kind(column.type, column.modifier, opts))
    names = tuple(c.name for c in table.columns)
    key_index = tuple(names.index(name) for name, _, _ in key_fields)
    return RowRendering(
        names=names,
        render=tuple(render),
        typed=tuple(typed),
        null=tuple(null_texts),
        row_format=_object_format(names),
        key_index=key_index,
        key_typed=tuple(typed_renderer(orjson.dumps, encode) for _, encode, _ in key_fields),
        key_null=(b"null",) * len(key_index),
        key_format=_object_format(tuple(names[i] for i in key_index)),
        format="json",
        direct=tuple(direct),
    )
