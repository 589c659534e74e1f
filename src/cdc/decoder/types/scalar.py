"""Parsers of the scalar types: text, booleans, numbers, money, bytea, uuid, bit strings, point.

Each is ``bytes -> value`` and raises ``ValueError`` (or a relative, see ``convert.PARSE_ERRORS``)
on text PostgreSQL would never send.
"""

from __future__ import annotations

import binascii
import re
from decimal import Decimal
from typing import Final
from uuid import UUID, SafeUUID

from cdc.values import Point

__all__ = [
    "parse_bits",
    "parse_bool",
    "parse_bytea",
    "parse_float",
    "parse_int",
    "parse_money",
    "parse_numeric",
    "parse_point",
    "parse_text",
    "parse_unknown_text",
    "parse_uuid",
]


def parse_text(data: bytes) -> str:
    return data.decode()


def parse_unknown_text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


_BOOLS: Final[dict[bytes, bool]] = {b"t": True, b"f": False}


def parse_bool(data: bytes) -> bool:
    return _BOOLS[data]


def parse_int(data: bytes) -> int:
    # int() alone would also take b" 1", b"+1", b"1_0": PostgreSQL never sends those.
    if data.isdigit() or (data[:1] == b"-" and data[1:].isdigit()):
        return int(data)
    raise ValueError(data)


def parse_float(data: bytes) -> float:
    return float(data)


_NUMERIC_SPECIALS: Final = frozenset({b"NaN", b"Infinity", b"-Infinity"})


_NUMERIC_CHARS: Final = b"0123456789.-"


def parse_numeric(data: bytes) -> Decimal:
    # Decimal() also takes " 1", "1_0", "1e5", "inf", "sNaN": PostgreSQL never sends those, so only
    # digits, '.' and '-' reach it (it rejects "1.2.3" and "1-" itself), or one of the specials.
    if not data.translate(None, _NUMERIC_CHARS) or data in _NUMERIC_SPECIALS:
        return Decimal(data.decode("ascii"))
    raise ValueError(data)


_MONEY_RE: Final = re.compile(r"(\()?(-)?\$?(-)?([0-9]{1,3}(?:,[0-9]{3})*|[0-9]+)(\.[0-9]+)?(-)?(\))?")


def parse_money(data: bytes) -> Decimal:
    """``$1,234.56``, ``-$1,234.56`` (lc_monetary C); also ``($1.00)`` and a trailing minus."""
    m = _MONEY_RE.fullmatch(data.decode("ascii").strip())
    if m is None or (m[1] is None) != (m[7] is None):
        raise ValueError(data)
    negative = m[1] is not None or m[2] is not None or m[3] is not None or m[6] is not None
    digits = m[4].replace(",", "") + (m[5] or "")
    return Decimal("-" + digits if negative else digits)


def parse_bytea(data: bytes) -> bytes:
    if data[:2] == b"\\x":
        return binascii.a2b_hex(data[2:])
    return _bytea_escape(data)


def _bytea_escape(data: bytes) -> bytes:
    """The legacy escape format: ``\\\\`` is a backslash, ``\\ooo`` an octal byte, the rest literal."""
    if b"\\" not in data:
        return data
    out = bytearray()
    pos = 0
    n = len(data)
    while pos < n:
        slash = data.find(b"\\", pos)
        if slash < 0:
            out += data[pos:]
            break
        out += data[pos:slash]
        if data[slash + 1 : slash + 2] == b"\\":
            out.append(0x5C)
            pos = slash + 2
            continue
        octal = data[slash + 1 : slash + 4]
        if len(octal) != 3 or not all(0x30 <= c <= 0x37 for c in octal) or octal[0] > 0x33:
            raise ValueError(data)
        out.append(int(octal, 8))
        pos = slash + 4
    return bytes(out)


_NEW: Final = object.__new__
_SET_UUID_INT: Final = UUID.__dict__["int"].__set__
_SET_UUID_SAFE: Final = UUID.__dict__["is_safe"].__set__


def parse_uuid(data: bytes) -> UUID:
    """``UUID(text)`` is several Python-level steps; this builds the same object from the hex digits."""
    if len(data) != 36 or data[8:24:5] != b"----":  # hyphens at 8, 13, 18, 23
        raise ValueError(data)
    digits = data.replace(b"-", b"")
    if len(digits) != 32:
        raise ValueError(data)
    value: UUID = _NEW(UUID)
    _SET_UUID_INT(value, int.from_bytes(binascii.a2b_hex(digits), "big"))
    _SET_UUID_SAFE(value, SafeUUID.unknown)
    return value


def parse_bits(data: bytes) -> str:
    if data.strip(b"01"):
        raise ValueError(data)
    return data.decode("ascii")


def parse_point(data: bytes) -> Point:
    if data[:1] != b"(" or data[-1:] != b")":
        raise ValueError(data)
    x, y = data[1:-1].split(b",")
    return Point(float(x), float(y))
