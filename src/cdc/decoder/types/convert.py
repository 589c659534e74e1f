"""Which parser each type gets: ``converter_for`` and ``parser_for``, and the conversion error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from cdc.decoder.types.composite import Parser, array_parser, parse_hstore
from cdc.decoder.types.oids import BOX_OID, BUILTIN_NAME
from cdc.decoder.types.scalar import (
    parse_bits,
    parse_bool,
    parse_bytea,
    parse_float,
    parse_int,
    parse_money,
    parse_numeric,
    parse_point,
    parse_text,
    parse_unknown_text,
    parse_uuid,
)
from cdc.decoder.types.temporal import (
    parse_date,
    parse_interval,
    parse_time,
    parse_timestamp,
    parse_timestamptz,
    parse_timetz,
)
from cdc.event import PgType, TypeKind

__all__ = [
    "EXTENSION_TYPE_NAMES",
    "PARSE_ERRORS",
    "Converter",
    "ValueConversionError",
    "converter_for",
    "parser_for",
]

Converter = Callable[[bytes], Any]
"""A column's text value (``bytes``) to its Python value."""


class ValueConversionError(ValueError):
    """The text of a value does not parse as its (known) type."""

    def __init__(self, type_name: str, data: bytes) -> None:
        self.type_name = type_name
        self.data = data
        super().__init__(f"malformed {type_name} value: {_short_repr(data)}")


def _short_repr(data: bytes, limit: int = 60) -> str:
    if len(data) <= limit:
        return repr(data)
    return f"{data[:limit]!r}... ({len(data)} bytes)"


PARSE_ERRORS: Final = (ValueError, ArithmeticError, IndexError, KeyError)
"""What a parser raises on malformed text (UnicodeDecodeError and binascii.Error are ValueErrors;
decimal.InvalidOperation is an ArithmeticError)."""


_TEXT_TYPES: Final = frozenset(
    {
        "text",
        "varchar",
        "bpchar",
        "name",
        "char",
        "json",
        "jsonb",
        "xml",
        "jsonpath",
        "inet",
        "cidr",
        "macaddr",
        "macaddr8",
        "lseg",
        "path",
        "box",
        "polygon",
        "line",
        "circle",
    }
)

_BUILTIN_PARSERS: Final[dict[str, Parser]] = {
    "bool": parse_bool,
    "int2": parse_int,
    "int4": parse_int,
    "int8": parse_int,
    "oid": parse_int,
    "float4": parse_float,
    "float8": parse_float,
    "numeric": parse_numeric,
    "money": parse_money,
    "bytea": parse_bytea,
    "uuid": parse_uuid,
    "date": parse_date,
    "time": parse_time,
    "timetz": parse_timetz,
    "timestamp": parse_timestamp,
    "timestamptz": parse_timestamptz,
    "interval": parse_interval,
    "bit": parse_bits,
    "varbit": parse_bits,
    "point": parse_point,
    **{name: parse_text for name in _TEXT_TYPES},
}

_EXTENSION_PARSERS: Final[dict[str, Parser]] = {
    # Extension types have no fixed OID: known by name.
    "hstore": parse_hstore,
    "citext": parse_text,
}

EXTENSION_TYPE_NAMES: Final = frozenset(_EXTENSION_PARSERS)
"""Extension types converted by name (their OIDs differ per database); any other non-built-in base type is text."""

_MAX_DOMAIN_DEPTH: Final = 32


def _base_of(pg_type: PgType) -> PgType | None:
    """A domain's base type (through domains over domains); None when the chain is broken."""
    t: PgType | None = pg_type
    for _ in range(_MAX_DOMAIN_DEPTH):
        if t is None or t.kind is not TypeKind.DOMAIN:
            return t
        t = t.element
    return None


def _resolve(pg_type: PgType) -> tuple[Parser, str]:
    """The parser for a type and the type name that errors should show."""
    kind = pg_type.kind
    if kind is TypeKind.DOMAIN:
        base = _base_of(pg_type)
        if base is None:
            return parse_unknown_text, pg_type.name
        parser, base_name = _resolve(base)
        return parser, f"{pg_type.name} ({base_name})"
    if kind is TypeKind.ARRAY:
        element = pg_type.element
        if element is None:
            return parse_unknown_text, pg_type.name
        element_parser, _ = _resolve(element)
        base = _base_of(element)
        delimiter = b";" if base is not None and base.oid == BOX_OID and base.kind is TypeKind.BASE else b","
        return array_parser(element_parser, delimiter), pg_type.name
    if kind is TypeKind.ENUM or kind is TypeKind.RANGE or kind is TypeKind.MULTIRANGE:
        return parse_text, pg_type.name
    if kind is TypeKind.BASE:
        builtin = BUILTIN_NAME.get(pg_type.oid)
        if builtin is not None:
            return _BUILTIN_PARSERS[builtin], builtin
        extension = _EXTENSION_PARSERS.get(pg_type.name)
        if extension is not None:
            return extension, pg_type.name
    return parse_unknown_text, pg_type.name


def parser_for(pg_type: PgType) -> Converter:
    """The bare parser behind ``converter_for``: faster, but its errors (``PARSE_ERRORS``) do not say
    which type failed. For generated fast paths that fall back to ``converter_for`` on any error."""
    return _resolve(pg_type)[0]


def converter_for(pg_type: PgType, modifier: int = -1) -> Converter:
    """The function that turns a column's text value into its Python value (see ``cdc.values``).

    Call it once per column (at Relation time); the returned function is the per-row path.
    ``modifier`` is the column's atttypmod; text values carry everything needed, so it only
    documents the column today.
    """
    del modifier  # the text form is self-describing
    parser, type_name = _resolve(pg_type)
    if parser is parse_unknown_text:
        return parse_unknown_text

    def convert(data: bytes) -> Any:
        try:
            return parser(data)
        except PARSE_ERRORS as exc:
            raise ValueConversionError(type_name, data) from exc

    return convert
