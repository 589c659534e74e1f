"""COPY's text format in, the typed rows of ``cdc.event`` out: the per-row path of every snapshot read.

``COPY (SELECT ...) TO STDOUT`` sends each row as one line: fields separated by a
tab, ``\\N`` for NULL, and the type's text output with backslash escapes for the
characters that would break the framing (``\\\\``, ``\\t``, ``\\n``, ``\\r``,
``\\b``, ``\\f``, ``\\v``). Once unescaped, a field is exactly the text pgoutput
sends for the same value, so it goes through the stream's converters
(``cdc.decoder.types.converter_for``) and becomes the same Python value.

``unescape`` also takes what COPY FROM accepts (``\\ooo`` octal, ``\\xhh`` hex,
a backslash before any other character), so a line written by another tool
decodes the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from cdc.decoder.types import ValueConversionError, converter_for
from cdc.event import Column, PgType, Row, TypeKind

__all__ = ["CopyFormatError", "NULL", "RowParser", "row_parser", "split_line", "unescape"]

NULL: Final = b"\\N"
_BACKSLASH: Final = b"\\"
_ESCAPE: Final = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.DOTALL)
_CONTROL: Final[dict[bytes, bytes]] = {
    b"b": b"\b",
    b"f": b"\f",
    b"n": b"\n",
    b"r": b"\r",
    b"t": b"\t",
    b"v": b"\v",
}

# Text outputs that never hold a backslash or a control character: COPY sends them as they are,
# so their fields skip the escape check (the common columns of a table: keys, numbers, times).
_PLAIN_TYPES: Final = frozenset(
    {
        "bool",
        "int2",
        "int4",
        "int8",
        "oid",
        "float4",
        "float8",
        "numeric",
        "money",
        "date",
        "time",
        "timetz",
        "timestamp",
        "timestamptz",
        "interval",
        "uuid",
        "inet",
        "cidr",
        "macaddr",
        "macaddr8",
        "bit",
        "varbit",
    }
)


class CopyFormatError(ValueError):
    """A COPY line that does not have the expected shape (field count, a dangling backslash)."""


def _replace(match: re.Match[bytes]) -> bytes:
    octal, hexa, other = match.groups()
    if octal is not None:
        return bytes((int(octal, 8) & 0xFF,))
    if hexa is not None:
        return bytes((int(hexa, 16),))
    return _CONTROL.get(other, other)


def unescape(field: bytes) -> bytes:
    """One field's escapes removed (the caller has already recognised ``\\N``)."""
    if _BACKSLASH not in field:
        return field
    if field.endswith(_BACKSLASH) and (len(field) - len(field.rstrip(_BACKSLASH))) % 2:
        raise CopyFormatError(f"a COPY field ends with a lone backslash: {field[:60]!r}")
    return _ESCAPE.sub(_replace, field)


def split_line(line: bytes) -> list[bytes | None]:
    """A COPY text line (with or without its newline) as unescaped fields, None for NULL."""
    if line.endswith(b"\n"):
        line = line[:-1]
    return [None if f == NULL else unescape(f) for f in line.split(b"\t")]


def _is_plain(pg_type: PgType) -> bool:
    t: PgType | None = pg_type
    for _ in range(32):  # domains over domains
        if t is None:
            return False
        if t.kind is TypeKind.DOMAIN:
            t = t.element
            continue
        return t.kind is TypeKind.BASE and t.schema == "pg_catalog" and t.name in _PLAIN_TYPES
    return False


RowParser = Callable[[bytes], Row]
"""A COPY line without its newline -> the row as the stream's decoder would give it."""


def row_parser(columns: Sequence[Column], *, where: str = "") -> RowParser:
    """The per-row function for a table's columns, generated once: one dict literal, no loop per field.

    A value that does not convert, or a line with the wrong number of fields,
    raises ``CopyFormatError`` naming the column (``where`` names the table).
    """
    names = [c.name for c in columns]
    converters = [converter_for(c.type, c.modifier) for c in columns]
    n = len(columns)
    env: dict[str, Any] = {"_NULL": NULL, "_BS": _BACKSLASH, "_unescape": unescape, "_n": n}
    items = []
    for i, column in enumerate(columns):
        env[f"_c{i}"] = converters[i]
        if _is_plain(column.type):
            expr = f"None if (v := f[{i}]) == _NULL else _c{i}(v)"
        else:
            expr = f"None if (v := f[{i}]) == _NULL else _c{i}(_unescape(v) if _BS in v else v)"
        items.append(f"    {names[i]!r}: ({expr}),")
    source = "\n".join(
        [
            "def parse(line):",
            "  f = line.split(b'\\t')",
            "  if len(f) != _n:",
            "    raise _mismatch(line, len(f))",
            "  return {",
            *items,
            "  }",
        ]
    )

    def mismatch(line: bytes, count: int) -> CopyFormatError:
        return CopyFormatError(f"{where or 'a table'}: a COPY line has {count} fields, expected {n}: {line[:80]!r}")

    env["_mismatch"] = mismatch
    exec(compile(source, f"<copy row parser {where}>", "exec"), env)  # generated from column positions only
    fast: RowParser = env["parse"]

    def parse(line: bytes) -> Row:
        try:
            return fast(line)
        except ValueConversionError:
            raise _locate(line, names, converters, where) from None

    return parse


def _locate(
    line: bytes, names: Sequence[str], converters: Sequence[Callable[[bytes], Any]], where: str
) -> CopyFormatError:
    """The slow path after a conversion error: which column it was, for the message."""
    for name, convert, raw in zip(names, converters, split_line(line), strict=False):
        if raw is None:
            continue
        try:
            convert(raw)
        except ValueConversionError as e:
            return CopyFormatError(f"column {name} of {where or 'a table'}: {e}")
    return CopyFormatError(f"{where or 'a table'}: a value does not convert")
