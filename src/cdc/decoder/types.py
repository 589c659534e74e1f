"""PostgreSQL text-format values (as pgoutput sends them) to the Python values of ``cdc.values``.

``converter_for(pg_type, modifier)`` is called once per column when a Relation
message arrives and returns a function ``bytes -> value`` for the per-row path.
The value each type becomes is the contract table in ``cdc.values``; this
module follows it exactly.

Assumptions about the server (its defaults): ``DateStyle`` is ISO,
``IntervalStyle`` is postgres, ``bytea_output`` is hex (escape is accepted too),
``lc_monetary`` is C, and text arrives as UTF-8.

A known type whose text does not parse raises ``ValueConversionError``, naming
the type and a short repr of the input. A type this module does not know
(``TypeKind.UNKNOWN``, composites, extension types other than hstore and
citext, catalog types such as ``tsvector``) becomes its text as ``str``: never
dropped, never an error (undecodable UTF-8 there is kept as ``\\xNN`` escapes).

Infinite intervals (PostgreSQL 17) have no place in ``Interval`` of their own;
they become PostgreSQL's internal encoding, ``INTERVAL_INFINITY`` and
``INTERVAL_NEG_INFINITY`` below.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Final
from uuid import UUID, SafeUUID

from cdc.event import PgType, TypeKind
from cdc.values import Infinity, Interval, Point, TimeTz

__all__ = [
    "BUILTIN_TYPES",
    "CATALOG_TEXT_TYPES",
    "EXTENSION_TYPE_NAMES",
    "INTERVAL_INFINITY",
    "INTERVAL_NEG_INFINITY",
    "Converter",
    "ValueConversionError",
    "converter_for",
]

Converter = Callable[[bytes], Any]

INTERVAL_INFINITY: Final = Interval(months=2**31 - 1, days=2**31 - 1, microseconds=2**63 - 1)
"""``'infinity'::interval`` (PostgreSQL 17+), as PostgreSQL stores it."""
INTERVAL_NEG_INFINITY: Final = Interval(months=-(2**31), days=-(2**31), microseconds=-(2**63))
"""``'-infinity'::interval`` (PostgreSQL 17+), as PostgreSQL stores it."""


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


# ---------------------------------------------------------------------------
# The built-in types: OID -> PgType, in one place (values from pg_type.dat).
# ---------------------------------------------------------------------------

_BASE_OIDS: Final[tuple[tuple[str, int, int], ...]] = (
    # (typname, oid, array oid)
    ("bool", 16, 1000),
    ("bytea", 17, 1001),
    ("char", 18, 1002),
    ("name", 19, 1003),
    ("int8", 20, 1016),
    ("int2", 21, 1005),
    ("int4", 23, 1007),
    ("text", 25, 1009),
    ("oid", 26, 1028),
    ("json", 114, 199),
    ("xml", 142, 143),
    ("point", 600, 1017),
    ("lseg", 601, 1018),
    ("path", 602, 1019),
    ("box", 603, 1020),
    ("polygon", 604, 1027),
    ("line", 628, 629),
    ("cidr", 650, 651),
    ("float4", 700, 1021),
    ("float8", 701, 1022),
    ("circle", 718, 719),
    ("macaddr8", 774, 775),
    ("money", 790, 791),
    ("macaddr", 829, 1040),
    ("inet", 869, 1041),
    ("bpchar", 1042, 1014),
    ("varchar", 1043, 1015),
    ("date", 1082, 1182),
    ("time", 1083, 1183),
    ("timestamp", 1114, 1115),
    ("timestamptz", 1184, 1185),
    ("interval", 1186, 1187),
    ("timetz", 1266, 1270),
    ("bit", 1560, 1561),
    ("varbit", 1562, 1563),
    ("numeric", 1700, 1231),
    ("uuid", 2950, 2951),
    ("jsonb", 3802, 3807),
    ("jsonpath", 4072, 4073),
)

_RANGE_OIDS: Final[tuple[tuple[str, int, int, str], ...]] = (
    # (typname, oid, array oid, subtype)
    ("int4range", 3904, 3905, "int4"),
    ("numrange", 3906, 3907, "numeric"),
    ("tsrange", 3908, 3909, "timestamp"),
    ("tstzrange", 3910, 3911, "timestamptz"),
    ("daterange", 3912, 3913, "date"),
    ("int8range", 3926, 3927, "int8"),
)

_MULTIRANGE_OIDS: Final[tuple[tuple[str, int, int, str], ...]] = (
    # (typname, oid, array oid, range type)
    ("int4multirange", 4451, 6150, "int4range"),
    ("nummultirange", 4532, 6151, "numrange"),
    ("tsmultirange", 4533, 6152, "tsrange"),
    ("tstzmultirange", 4534, 6153, "tstzrange"),
    ("datemultirange", 4535, 6155, "daterange"),
    ("int8multirange", 4536, 6157, "int8range"),
)


def _builtin_types() -> dict[int, PgType]:
    types: dict[int, PgType] = {}
    by_name: dict[str, PgType] = {}

    def add(t: PgType, array_oid: int) -> None:
        types[t.oid] = t
        by_name[t.name] = t
        types[array_oid] = PgType(array_oid, "_" + t.name, TypeKind.ARRAY, element=t)

    for name, oid, array_oid in _BASE_OIDS:
        add(PgType(oid, name), array_oid)
    for name, oid, array_oid, subtype in _RANGE_OIDS:
        add(PgType(oid, name, TypeKind.RANGE, element=by_name[subtype]), array_oid)
    for name, oid, array_oid, range_name in _MULTIRANGE_OIDS:
        add(PgType(oid, name, TypeKind.MULTIRANGE, element=by_name[range_name]), array_oid)
    return types


BUILTIN_TYPES: Final[dict[int, PgType]] = _builtin_types()
"""Every pg_catalog type this module converts, and its array type, by OID."""

_CATALOG_TEXT_OIDS: Final[tuple[tuple[str, int, int], ...]] = (
    # (typname, oid, array oid): pg_catalog types with no parser here, whose text travels as str.
    ("regproc", 24, 1008),
    ("tid", 27, 1010),
    ("xid", 28, 1011),
    ("cid", 29, 1012),
    ("aclitem", 1033, 1034),
    ("refcursor", 1790, 2201),
    ("regprocedure", 2202, 2207),
    ("regoper", 2203, 2208),
    ("regoperator", 2204, 2209),
    ("regclass", 2205, 2210),
    ("regtype", 2206, 2211),
    ("txid_snapshot", 2970, 2949),
    ("pg_lsn", 3220, 3221),
    ("tsvector", 3614, 3643),
    ("tsquery", 3615, 3645),
    ("regconfig", 3734, 3735),
    ("regdictionary", 3769, 3770),
    ("regnamespace", 4089, 4090),
    ("regrole", 4096, 4097),
    ("regcollation", 4191, 4192),
    ("pg_snapshot", 5038, 5039),
    ("xid8", 5069, 271),
)


def _catalog_text_types() -> dict[int, PgType]:
    types: dict[int, PgType] = {}
    for name, oid, array_oid in _CATALOG_TEXT_OIDS:
        t = PgType(oid, name)
        types[oid] = t
        types[array_oid] = PgType(array_oid, "_" + name, TypeKind.ARRAY, element=t)
    return types


CATALOG_TEXT_TYPES: Final[dict[int, PgType]] = _catalog_text_types()
"""pg_catalog types without a converter of their own, by OID, as ``cdc.catalog.load_types`` resolves them.

The server sends no Type message for catalog types, so a column of one added after start-up would
otherwise be known by its OID alone; with these its values travel as text under the type's name.
"""

_BUILTIN_NAME: Final[dict[int, str]] = {oid: t.name for oid, t in BUILTIN_TYPES.items() if t.kind is TypeKind.BASE}


# ---------------------------------------------------------------------------
# Parsers: bytes -> value; they raise ValueError (or a relative) on bad input.
# ---------------------------------------------------------------------------

_PARSE_ERRORS: Final = (ValueError, ArithmeticError, IndexError, KeyError)
"""What a parser raises on malformed text (UnicodeDecodeError and binascii.Error are ValueErrors;
decimal.InvalidOperation is an ArithmeticError)."""

_Parser = Callable[[bytes], Any]


def _text(data: bytes) -> str:
    return data.decode()


def _unknown_text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


_BOOLS: Final[dict[bytes, bool]] = {b"t": True, b"f": False}


def _bool(data: bytes) -> bool:
    return _BOOLS[data]


def _int(data: bytes) -> int:
    # int() alone would also take b" 1", b"+1", b"1_0": PostgreSQL never sends those.
    if data.isdigit() or (data[:1] == b"-" and data[1:].isdigit()):
        return int(data)
    raise ValueError(data)


_SIGNED_INT_RE: Final = re.compile(rb"[+-]?[0-9]+")


def _float(data: bytes) -> float:
    return float(data)


_NUMERIC_SPECIALS: Final = frozenset({b"NaN", b"Infinity", b"-Infinity"})


_NUMERIC_CHARS: Final = b"0123456789.-"


def _numeric(data: bytes) -> Decimal:
    # Decimal() also takes " 1", "1_0", "1e5", "inf", "sNaN": PostgreSQL never sends those, so only
    # digits, '.' and '-' reach it (it rejects "1.2.3" and "1-" itself), or one of the specials.
    if not data.translate(None, _NUMERIC_CHARS) or data in _NUMERIC_SPECIALS:
        return Decimal(data.decode("ascii"))
    raise ValueError(data)


_MONEY_RE: Final = re.compile(r"(\()?(-)?\$?(-)?([0-9]{1,3}(?:,[0-9]{3})*|[0-9]+)(\.[0-9]+)?(-)?(\))?")


def _money(data: bytes) -> Decimal:
    """``$1,234.56``, ``-$1,234.56`` (lc_monetary C); also ``($1.00)`` and a trailing minus."""
    m = _MONEY_RE.fullmatch(data.decode("ascii").strip())
    if m is None or (m[1] is None) != (m[7] is None):
        raise ValueError(data)
    negative = m[1] is not None or m[2] is not None or m[3] is not None or m[6] is not None
    digits = m[4].replace(",", "") + (m[5] or "")
    return Decimal("-" + digits if negative else digits)


def _bytea(data: bytes) -> bytes:
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


def _uuid(data: bytes) -> UUID:
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


def _bits(data: bytes) -> str:
    if data.strip(b"01"):
        raise ValueError(data)
    return data.decode("ascii")


def _point(data: bytes) -> Point:
    if data[:1] != b"(" or data[-1:] != b")":
        raise ValueError(data)
    x, y = data[1:-1].split(b",")
    return Point(float(x), float(y))


# --- dates and times --------------------------------------------------------

_DAYS_IN_MONTH: Final = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is 0)."""
    if not 1 <= month <= 12 or not 1 <= day <= _DAYS_IN_MONTH[month]:
        raise ValueError(f"no such date: {year}-{month}-{day}")
    if month == 2 and day == 29 and not (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)):
        raise ValueError(f"no such date: {year}-{month}-{day}")
    # Howard Hinnant's days_from_civil, with Python's floor division.
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


_FRACTION_SCALE: Final = (1, 100000, 10000, 1000, 100, 10, 1)
_US_PER_DAY: Final = 86_400_000_000

_DATE_RE: Final = re.compile(rb"([0-9]{4,})-([0-9]{2})-([0-9]{2})( BC)?")
_TIME = rb"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
_OFFSET = rb"([+-])([0-9]{2})(?::([0-9]{2}))?(?::([0-9]{2}))?"
_TIME_RE: Final = re.compile(_TIME)
_TIMETZ_RE: Final = re.compile(_TIME + _OFFSET)
_TIMESTAMP_RE: Final = re.compile(rb"([0-9]{4,})-([0-9]{2})-([0-9]{2}) " + _TIME + rb"( BC)?")
_TIMESTAMPTZ_RE: Final = re.compile(rb"([0-9]{4,})-([0-9]{2})-([0-9]{2}) " + _TIME + _OFFSET + rb"( BC)?")


def _infinity(data: bytes) -> Infinity:
    if data == b"infinity":
        return Infinity.POSITIVE
    if data == b"-infinity":
        return Infinity.NEGATIVE
    raise ValueError(data)


def _time_of_day(hour: bytes, minute: bytes, second: bytes, fraction: bytes | None) -> int:
    h, m, s = int(hour), int(minute), int(second)
    us = int(fraction) * _FRACTION_SCALE[len(fraction)] if fraction else 0
    if m > 59 or s > 59 or (h > 23 and not (h == 24 and m == 0 and s == 0 and us == 0)):
        raise ValueError(f"no such time: {h}:{m}:{s}")
    return ((h * 60 + m) * 60 + s) * 1_000_000 + us


def _offset_seconds(sign: bytes, hours: bytes, minutes: bytes | None, seconds: bytes | None) -> int:
    """Seconds east of UTC: ``+05:30`` is 19800."""
    m = int(minutes) if minutes else 0
    s = int(seconds) if seconds else 0
    if m > 59 or s > 59:
        raise ValueError("bad UTC offset")
    total = int(hours) * 3600 + m * 60 + s
    return -total if sign == b"-" else total


def _year(digits: bytes, bc: bytes | None) -> int:
    year = int(digits)
    if year == 0:
        raise ValueError("year 0")
    return 1 - year if bc else year


_EPOCH_ORDINAL: Final = 719163  # date(1970, 1, 1).toordinal()
_EPOCH: Final = datetime(1970, 1, 1)
_EPOCH_UTC: Final = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_US: Final = timedelta(microseconds=1)
_DOT: Final = 0x2E


_DIGITS_TO_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_COMMON_PREFIX: Final = b"0000-00-00 00:00:00"


def _common_shape(data: bytes) -> bool:
    """``YYYY-MM-DD HH:MM:SS...`` in years 1000-9999 AD: ``datetime`` parses those in C."""
    return (
        data[:19].translate(_DIGITS_TO_ZERO) == _COMMON_PREFIX
        and data[0] != 0x30
        and not data.endswith(b" BC")
    )


def _date(data: bytes) -> int | Infinity:
    if len(data) == 10 and data.translate(_DIGITS_TO_ZERO) == b"0000-00-00" and data[0] != 0x30:
        return date.fromisoformat(data.decode("ascii")).toordinal() - _EPOCH_ORDINAL
    m = _DATE_RE.fullmatch(data)
    if m is None:
        return _infinity(data)
    return _days_from_civil(_year(m[1], m[4]), int(m[2]), int(m[3]))


def _time(data: bytes) -> int:
    m = _TIME_RE.fullmatch(data)
    if m is None:
        raise ValueError(data)
    return _time_of_day(m[1], m[2], m[3], m[4])


def _timetz(data: bytes) -> TimeTz:
    m = _TIMETZ_RE.fullmatch(data)
    if m is None:
        raise ValueError(data)
    return TimeTz(_time_of_day(m[1], m[2], m[3], m[4]), _offset_seconds(m[5], m[6], m[7], m[8]))


def _timestamp(data: bytes) -> int | Infinity:
    n = len(data)
    if _common_shape(data) and (n == 19 or (data[19] == _DOT and 21 <= n <= 26)):
        parsed = datetime.fromisoformat(data.decode("ascii"))
        if parsed.tzinfo is not None:
            raise ValueError(data)
        return (parsed - _EPOCH) // _ONE_US
    m = _TIMESTAMP_RE.fullmatch(data)
    if m is None:
        return _infinity(data)
    days = _days_from_civil(_year(m[1], m[8]), int(m[2]), int(m[3]))
    tod = _time_of_day(m[4], m[5], m[6], m[7])
    if tod >= _US_PER_DAY:
        raise ValueError(data)
    return days * _US_PER_DAY + tod


def _offset_at(data: bytes) -> int:
    """Where a timestamptz's offset starts after ``...:SS[.f{1,6}]`` (0 when the shape is not that)."""
    at = data.find(b"+", 19)
    if at < 0:
        at = data.find(b"-", 19)
    if at == 19 or (21 <= at <= 26 and data[19] == _DOT):
        return at  # datetime.fromisoformat checks the fraction's digits
    return 0


_COLON: Final = 0x3A
_SECONDS_US: Final[dict[bytes, int]] = {b"%02d" % s: s * 1_000_000 for s in range(60)}
_MINUTES_UTC: dict[bytes, int] = {}  # b"YYYY-MM-DD HH:MM" -> microseconds since the epoch, UTC
_MINUTES_UTC_MAX: Final = 65_536
_MINUTE_SHAPE: Final = b"0000-00-00 00:00"


def _minute_utc(prefix: bytes) -> int | None:
    """``YYYY-MM-DD HH:MM`` (years 1000-9999) as microseconds since the epoch; None for another shape."""
    if prefix.translate(_DIGITS_TO_ZERO) != _MINUTE_SHAPE or prefix[0] == 0x30:
        return None
    moment = datetime(int(prefix[:4]), int(prefix[5:7]), int(prefix[8:10]), int(prefix[11:13]), int(prefix[14:16]))
    us = (moment - _EPOCH) // _ONE_US
    if len(_MINUTES_UTC) >= _MINUTES_UTC_MAX:
        _MINUTES_UTC.clear()
    _MINUTES_UTC[prefix] = us
    return us


def _timestamptz(data: bytes) -> int | Infinity:
    # The fast path: the replication and snapshot sessions run in UTC, so nearly every value is
    # ``YYYY-MM-DD HH:MM:SS[.f{1,6}]+00``; the minute is looked up, seconds and fraction added.
    n = len(data)
    if n >= 22 and data[n - 3 :] == b"+00" and data[16] == _COLON and (n == 22 or (n >= 24 and data[19] == _DOT)):
        base = _MINUTES_UTC.get(data[:16])
        if base is None:
            base = _minute_utc(data[:16])
        if base is not None:
            us = base + _SECONDS_US[data[17:19]]
            if n == 22:
                return us
            fraction = data[20 : n - 3]
            if len(fraction) <= 6 and fraction.isdigit():
                return us + int(fraction) * _FRACTION_SCALE[len(fraction)]
    return _timestamptz_general(data)


def _timestamptz_general(data: bytes) -> int | Infinity:
    if _common_shape(data) and _offset_at(data) > 0:
        parsed = datetime.fromisoformat(data.decode("ascii"))
        if parsed.tzinfo is None:
            raise ValueError(data)
        return (parsed - _EPOCH_UTC) // _ONE_US
    m = _TIMESTAMPTZ_RE.fullmatch(data)
    if m is None:
        return _infinity(data)
    days = _days_from_civil(_year(m[1], m[12]), int(m[2]), int(m[3]))
    tod = _time_of_day(m[4], m[5], m[6], m[7])
    if tod >= _US_PER_DAY:
        raise ValueError(data)
    offset = _offset_seconds(m[8], m[9], m[10], m[11])
    return days * _US_PER_DAY + tod - offset * 1_000_000


_INTERVAL_TIME_RE: Final = re.compile(rb"([+-])?([0-9]+):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?")
_INTERVAL_UNITS: Final[dict[bytes, int]] = {
    # unit -> 0 months, 1 days (years are 12 months)
    b"year": 12,
    b"years": 12,
    b"mon": 1,
    b"mons": 1,
    b"day": 0,
    b"days": 0,
}


def _interval(data: bytes) -> Interval:
    """IntervalStyle postgres: ``1 year 2 mons -3 days +04:05:06.789``, ``00:00:00``, ``infinity``."""
    if data == b"infinity":
        return INTERVAL_INFINITY
    if data == b"-infinity":
        return INTERVAL_NEG_INFINITY
    tokens = data.split(b" ")
    months = days = micros = 0
    seen_time = False
    i = 0
    n = len(tokens)
    while i < n:
        token = tokens[i]
        if b":" in token:
            m = _INTERVAL_TIME_RE.fullmatch(token)
            if m is None or seen_time or int(m[3]) > 59 or int(m[4]) > 59:
                raise ValueError(data)
            seen_time = True
            fraction = m[5]
            magnitude = ((int(m[2]) * 60 + int(m[3])) * 60 + int(m[4])) * 1_000_000
            if fraction:
                magnitude += int(fraction) * _FRACTION_SCALE[len(fraction)]
            micros = -magnitude if m[1] == b"-" else magnitude
            i += 1
            continue
        if i + 1 >= n:
            raise ValueError(data)
        if _SIGNED_INT_RE.fullmatch(token) is None:
            raise ValueError(data)
        amount = int(token)
        unit = _INTERVAL_UNITS[tokens[i + 1]]
        if unit:
            months += amount * unit
        else:
            days += amount
        i += 2
    return Interval(months, days, micros)


# --- hstore ---------------------------------------------------------------

_HSTORE_QUOTED: Final = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_HSTORE_BARE: Final = re.compile(r'[^\s=,>"]+')
_HSTORE_ARROW: Final = re.compile(r"\s*=>\s*")
_HSTORE_COMMA: Final = re.compile(r"\s*,\s*")
_BACKSLASH_ESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)


def _hstore_token(text: str, pos: int) -> tuple[str, bool, int]:
    """One key or value at ``pos``: (text, was quoted, end)."""
    m = _HSTORE_QUOTED.match(text, pos)
    if m is not None:
        raw = m[1]
        return (_BACKSLASH_ESCAPE.sub(r"\1", raw) if "\\" in raw else raw), True, m.end()
    m = _HSTORE_BARE.match(text, pos)
    if m is None:
        raise ValueError(text)
    return m[0], False, m.end()


def _hstore(data: bytes) -> dict[str, str | None]:
    """``"a"=>"1", "b"=>NULL`` (backslash escapes inside quotes; an unquoted NULL value is None)."""
    text = data.decode()
    result: dict[str, str | None] = {}
    n = len(text)
    pos = len(text) - len(text.lstrip())
    if pos == n:
        return result
    while True:
        key, _, pos = _hstore_token(text, pos)
        arrow = _HSTORE_ARROW.match(text, pos)
        if arrow is None:
            raise ValueError(text)
        value, quoted, pos = _hstore_token(text, arrow.end())
        result[key] = None if not quoted and value.upper() == "NULL" else value
        comma = _HSTORE_COMMA.match(text, pos)
        if comma is None:
            if text[pos:].strip():
                raise ValueError(text)
            return result
        pos = comma.end()


# --- arrays ---------------------------------------------------------------

_ARRAY_DIMS: Final = re.compile(rb"(?:\[[+-]?[0-9]+:[+-]?[0-9]+\])+=")
_ARRAY_QUOTED: Final = re.compile(rb'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_BYTES_ESCAPE: Final = re.compile(rb"\\(.)", re.DOTALL)
_WHITESPACE: Final = b" \t\n\r\v\f"
_ARRAY_MAX_DIMS: Final = 6  # PostgreSQL's MAXDIM


def _array_parser(element: _Parser, delimiter: bytes) -> _Parser:
    """A parser for ``{1,2}``, ``{{1,2},{3,4}}``, ``{"a b",NULL}``, ``[0:1]={1,2}`` (bounds dropped)."""
    delim = delimiter[0]
    bare = re.compile(rb'(?:[^{}"\\' + re.escape(delimiter) + rb"]|\\.)*", re.DOTALL)

    def level(data: bytes, pos: int, depth: int) -> tuple[list[Any], int]:
        # data[pos] is "{"
        if depth > _ARRAY_MAX_DIMS:
            raise ValueError("too many array dimensions")
        items: list[Any] = []
        pos += 1
        n = len(data)
        while pos < n and data[pos] in _WHITESPACE:
            pos += 1
        if data[pos] == 0x7D:  # "}"
            return items, pos + 1
        while True:
            while data[pos] in _WHITESPACE:
                pos += 1
            c = data[pos]
            if c == 0x7B:  # "{"
                sub, pos = level(data, pos, depth + 1)
                items.append(sub)
            elif c == 0x22:  # '"'
                m = _ARRAY_QUOTED.match(data, pos)
                if m is None:
                    raise ValueError(data)
                raw = m[1]
                items.append(element(_BYTES_ESCAPE.sub(rb"\1", raw) if b"\\" in raw else raw))
                pos = m.end()
            else:
                m = bare.match(data, pos)
                assert m is not None  # the pattern matches the empty string
                raw = m[0].strip(_WHITESPACE)
                if not raw:
                    raise ValueError(data)
                if raw.upper() == b"NULL":
                    items.append(None)
                else:
                    items.append(element(_BYTES_ESCAPE.sub(rb"\1", raw) if b"\\" in raw else raw))
                pos = m.end()
            while data[pos] in _WHITESPACE:
                pos += 1
            c = data[pos]
            pos += 1
            if c == delim:
                continue
            if c == 0x7D:
                return items, pos
            raise ValueError(data)

    def parse(data: bytes) -> list[Any]:
        if data[:1] == b"[":
            dims = _ARRAY_DIMS.match(data)
            if dims is None:
                raise ValueError(data)
            data = data[dims.end() :]
        if data[:1] != b"{" or data[-1:] != b"}":
            raise ValueError(data)
        inner = data[1:-1]
        if b"{" not in inner and b'"' not in inner and b"\\" not in inner and b"}" not in inner:
            # One dimension, nothing quoted or escaped: the common case.
            if not inner:
                return []
            return [None if item == b"NULL" else element(item) for item in inner.split(delimiter)]
        value, end = level(data, 0, 1)
        if end != len(data):
            raise ValueError(data)
        return value

    return parse


# ---------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------

_TEXT_TYPES: Final = frozenset(
    {
        "text", "varchar", "bpchar", "name", "char", "json", "jsonb", "xml", "jsonpath",
        "inet", "cidr", "macaddr", "macaddr8", "lseg", "path", "box", "polygon", "line", "circle",
    }
)  # fmt: skip

_BUILTIN_PARSERS: Final[dict[str, _Parser]] = {
    "bool": _bool,
    "int2": _int,
    "int4": _int,
    "int8": _int,
    "oid": _int,
    "float4": _float,
    "float8": _float,
    "numeric": _numeric,
    "money": _money,
    "bytea": _bytea,
    "uuid": _uuid,
    "date": _date,
    "time": _time,
    "timetz": _timetz,
    "timestamp": _timestamp,
    "timestamptz": _timestamptz,
    "interval": _interval,
    "bit": _bits,
    "varbit": _bits,
    "point": _point,
    **{name: _text for name in _TEXT_TYPES},
}

_EXTENSION_PARSERS: Final[dict[str, _Parser]] = {
    # Extension types have no fixed OID: known by name.
    "hstore": _hstore,
    "citext": _text,
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


def _resolve(pg_type: PgType) -> tuple[_Parser, str]:
    """The parser for a type and the type name that errors should show."""
    kind = pg_type.kind
    if kind is TypeKind.DOMAIN:
        base = _base_of(pg_type)
        if base is None:
            return _unknown_text, pg_type.name
        parser, base_name = _resolve(base)
        return parser, f"{pg_type.name} ({base_name})"
    if kind is TypeKind.ARRAY:
        element = pg_type.element
        if element is None:
            return _unknown_text, pg_type.name
        element_parser, _ = _resolve(element)
        base = _base_of(element)
        delimiter = b";" if base is not None and base.oid == 603 and base.kind is TypeKind.BASE else b","
        return _array_parser(element_parser, delimiter), pg_type.name
    if kind is TypeKind.ENUM or kind is TypeKind.RANGE or kind is TypeKind.MULTIRANGE:
        return _text, pg_type.name
    if kind is TypeKind.BASE:
        builtin = _BUILTIN_NAME.get(pg_type.oid)
        if builtin is not None:
            return _BUILTIN_PARSERS[builtin], builtin
        extension = _EXTENSION_PARSERS.get(pg_type.name)
        if extension is not None:
            return extension, pg_type.name
    return _unknown_text, pg_type.name


def parser_for(pg_type: PgType) -> Converter:
    """The bare parser behind ``converter_for``: faster, but its errors (``PARSE_ERRORS``) do not say
    which type failed. For generated fast paths that fall back to ``converter_for`` on any error."""
    return _resolve(pg_type)[0]


PARSE_ERRORS: Final = _PARSE_ERRORS


def converter_for(pg_type: PgType, modifier: int = -1) -> Converter:
    """The function that turns a column's text value into its Python value (see ``cdc.values``).

    Call it once per column (at Relation time); the returned function is the per-row path.
    ``modifier`` is the column's atttypmod; text values carry everything needed, so it only
    documents the column today.
    """
    del modifier  # the text form is self-describing
    parser, type_name = _resolve(pg_type)
    if parser is _unknown_text:
        return _unknown_text

    def convert(data: bytes) -> Any:
        try:
            return parser(data)
        except _PARSE_ERRORS as exc:
            raise ValueConversionError(type_name, data) from exc

    return convert
