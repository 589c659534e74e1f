"""What every format's row rendering shares: checks of pgoutput's column text, numeric text to two's
complement, timestamptz text to ZonedTimestamp text, which types render straight from their text, and
the renderer of a column's typed value.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Final

from cdc.event import PgType, TypeKind
from cdc.sink.connect import Encoder
from cdc.sink.encode import twos_complement
from cdc.sink.errors import SerializationError
from cdc.sink.typemap import TypeOptions, numeric_typmod, time_precision


class RenderDeclined(ValueError):
    """A column's typed value could not be encoded: the typed path will raise the real error."""


def check_int_text(raw: bytes) -> bytes:
    """An integer's text as PostgreSQL prints it (also its JSON); ValueError otherwise."""
    if raw.isdigit() or (raw[:1] == b"-" and raw[1:].isdigit()):
        return raw
    raise ValueError(raw)


def check_uuid_text(raw: bytes) -> bytes:
    """Canonical lower-case uuid text, as PostgreSQL prints it; ValueError otherwise (cheaper than a regex)."""
    if len(raw) != 36 or raw[8:24:5] != b"----" or raw.translate(None, b"0123456789abcdef") != b"----":
        raise ValueError(raw)
    return raw


@functools.lru_cache(maxsize=64)
def fixed_numeric_bytes(scale: int) -> Callable[[bytes], bytes]:
    """numeric(p, scale) text -> the unscaled value's minimal two's complement. PostgreSQL prints exactly
    ``scale`` fraction digits; NaN, Infinity or another scale raise ValueError (the typed path then
    raises the precise error)."""

    def unscaled(raw: bytes) -> bytes:
        if scale:
            if len(raw) <= scale or raw[-scale - 1] != 0x2E:  # '.'
                raise ValueError(raw)
            raw = raw[: -scale - 1] + raw[-scale:]
        return twos_complement(int(check_int_text(raw)))

    return unscaled


_TIMESTAMPTZ_UTC: Final = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.(\d{1,6}))?\+00").fullmatch


@functools.lru_cache(maxsize=16)
def zoned_timestamp_text(width: int, quote: bytes = b"") -> Callable[[bytes], bytes]:
    """timestamptz as ZonedTimestamp's text between ``quote``s (JSON: ``"``; Avro: none), from the text a
    UTC session prints: years 1-9999 (AD) only."""
    zeros = b"0" * 6
    # The last text and its rendering, swapped as one tuple: now() is the same for every row of a
    # transaction, so consecutive rows often repeat a timestamp.
    last = [(b"", b"")]

    def render(raw: bytes) -> bytes:
        previous = last[0]
        if previous[0] == raw:
            return previous[1]
        match = _TIMESTAMPTZ_UTC(raw)
        if match is None:
            raise ValueError(raw)  # BC, years past 9999, infinity, another offset
        if width == 0:
            out = quote + raw[:10] + b"T" + raw[11:19] + b"Z" + quote
        else:
            fraction = (match.group(1) or b"") + zeros
            out = quote + raw[:10] + b"T" + raw[11:19] + b"." + fraction[:width] + b"Z" + quote
        last[0] = (raw, out)
        return out

    return render


def direct_type(pg_type: PgType, modifier: int, opts: TypeOptions) -> str | None:
    """Which direct renderer a column's type has (the same in every format), or None."""
    if pg_type.kind is not TypeKind.BASE or pg_type.schema != "pg_catalog":
        return None  # domains, enums, arrays, extension types: the typed path
    name = pg_type.name
    if name in ("int2", "int4", "int8", "oid"):
        return "int"
    if name in ("text", "varchar", "bpchar", "name", "json", "jsonb", "xml"):
        return "text"
    if name in ("bool", "uuid", "timestamptz"):
        return name
    if name == "numeric" and opts.decimal_handling == "precise":
        typmod = numeric_typmod(modifier)
        if typmod is not None and typmod[1] >= 0:
            return "numeric"
    return None


def direct_kind(pg_type: PgType, modifier: int, opts: TypeOptions) -> tuple[str, int] | None:
    """The direct type of a column and its parameter (timestamptz: the precision; numeric: the scale), for
    a compiled codec writing what a format's direct renderer would (``RowRendering.direct``)."""
    kind = direct_type(pg_type, modifier, opts)
    if kind is None:
        return None
    if kind == "timestamptz":
        return kind, time_precision(modifier)
    if kind == "numeric":
        typmod = numeric_typmod(modifier)
        assert typmod is not None
        return kind, typmod[1]
    return kind, 0


def typed_renderer(write: Callable[[Any], bytes], encode: Encoder | None) -> Callable[[Any], bytes]:
    """A column's typed value in a format's bytes: the format's ``encode``, then ``write`` (JSON: orjson,
    as it writes the value inside the row object; Avro: the field's compiled writer). A value either
    refuses declines the row to the typed path, which raises the real error."""

    def render(value: Any) -> bytes:
        try:
            return write(value if encode is None else encode(value))
        except (SerializationError, TypeError, ValueError, AttributeError, OverflowError, LookupError) as exc:
            raise RenderDeclined(str(exc)) from exc

    return render
