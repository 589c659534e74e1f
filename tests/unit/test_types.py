"""cdc.decoder.types: PostgreSQL text values (bytes) in, the values of cdc.values out."""

from __future__ import annotations

import math
import string
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.decoder.types import (
    BUILTIN_TYPES,
    INTERVAL_INFINITY,
    INTERVAL_NEG_INFINITY,
    ValueConversionError,
    converter_for,
)
from cdc.event import PgType, TypeKind
from cdc.values import Infinity, Interval, Point, TimeTz

BY_NAME = {t.name: t for t in BUILTIN_TYPES.values()}
EPOCH = datetime(1970, 1, 1)
EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
US = timedelta(microseconds=1)


def convert(type_name: str, data: bytes, modifier: int = -1) -> Any:
    return converter_for(BY_NAME[type_name], modifier)(data)


def jdn_days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 by the Fliegel–Van Flandern Julian day formula (independent of the module)."""
    a = int((month - 14) / 12)
    jdn = (
        (1461 * (year + 4800 + a)) // 4
        + (367 * (month - 2 - 12 * a)) // 12
        - (3 * ((year + 4900 + a) // 100)) // 4
        + day
        - 32075
    )
    return jdn - 2440588


# --- the OID registry -------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "name"),
    [
        (16, "bool"),
        (17, "bytea"),
        (18, "char"),
        (19, "name"),
        (20, "int8"),
        (21, "int2"),
        (23, "int4"),
        (25, "text"),
        (26, "oid"),
        (114, "json"),
        (142, "xml"),
        (600, "point"),
        (601, "lseg"),
        (602, "path"),
        (603, "box"),
        (604, "polygon"),
        (628, "line"),
        (650, "cidr"),
        (700, "float4"),
        (701, "float8"),
        (718, "circle"),
        (774, "macaddr8"),
        (790, "money"),
        (829, "macaddr"),
        (869, "inet"),
        (1042, "bpchar"),
        (1043, "varchar"),
        (1082, "date"),
        (1083, "time"),
        (1114, "timestamp"),
        (1184, "timestamptz"),
        (1186, "interval"),
        (1266, "timetz"),
        (1560, "bit"),
        (1562, "varbit"),
        (1700, "numeric"),
        (2950, "uuid"),
        (3802, "jsonb"),
        (3904, "int4range"),
        (3906, "numrange"),
        (3908, "tsrange"),
        (3910, "tstzrange"),
        (3912, "daterange"),
        (3926, "int8range"),
        (4072, "jsonpath"),
        (1000, "_bool"),
        (1001, "_bytea"),
        (1005, "_int2"),
        (1007, "_int4"),
        (1009, "_text"),
        (1016, "_int8"),
        (1014, "_bpchar"),
        (1015, "_varchar"),
        (1020, "_box"),
        (1017, "_point"),
        (1021, "_float4"),
        (1022, "_float8"),
        (1028, "_oid"),
        (1115, "_timestamp"),
        (1182, "_date"),
        (1183, "_time"),
        (1185, "_timestamptz"),
        (1187, "_interval"),
        (1231, "_numeric"),
        (1270, "_timetz"),
        (2951, "_uuid"),
        (3807, "_jsonb"),
        (199, "_json"),
        (791, "_money"),
        (1041, "_inet"),
        (3905, "_int4range"),
        (4451, "int4multirange"),
        (6150, "_int4multirange"),
    ],
)
def test_builtin_type_has_its_pg_catalog_oid(oid: int, name: str) -> None:
    assert BUILTIN_TYPES[oid].name == name
    assert BUILTIN_TYPES[oid].oid == oid
    assert BUILTIN_TYPES[oid].schema == "pg_catalog"


def test_builtin_arrays_point_at_their_element_types() -> None:
    for t in BUILTIN_TYPES.values():
        if t.kind is TypeKind.ARRAY:
            assert t.element is not None
            assert t.name == "_" + t.element.name
            assert BUILTIN_TYPES[t.element.oid] is t.element


def test_builtin_ranges_know_their_subtype() -> None:
    assert BY_NAME["tstzrange"].kind is TypeKind.RANGE
    assert BY_NAME["tstzrange"].element is BY_NAME["timestamptz"]
    assert BY_NAME["datemultirange"].kind is TypeKind.MULTIRANGE


# --- numbers ------------------------------------------------------------------


@pytest.mark.parametrize("type_name", ["int2", "int4", "int8", "oid"])
def test_integers(type_name: str) -> None:
    assert convert(type_name, b"0") == 0
    assert convert(type_name, b"-32768") == -32768
    assert convert(type_name, b"4294967295") == 4294967295


def test_int8_extremes() -> None:
    assert convert("int8", b"9223372036854775807") == 2**63 - 1
    assert convert("int8", b"-9223372036854775808") == -(2**63)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int8_round_trips(n: int) -> None:
    assert convert("int8", str(n).encode()) == n


@pytest.mark.parametrize("data", [b"", b"1.5", b"abc", b" 1", b"1_000", b"+1", b"--1", b"0x10"])
def test_malformed_integer_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="int4"):
        convert("int4", data)


def test_numeric_is_exact() -> None:
    value = convert("numeric", b"12345678901234567890123456789012345678.000000000000000000001")
    assert value == Decimal("12345678901234567890123456789012345678.000000000000000000001")
    assert str(convert("numeric", b"1000.00")) == "1000.00"  # the scale is kept
    assert convert("numeric", b"-0.5") == Decimal("-0.5")


def test_numeric_specials() -> None:
    assert convert("numeric", b"NaN").is_nan()
    assert convert("numeric", b"Infinity") == Decimal("Infinity")
    assert convert("numeric", b"-Infinity") == Decimal("-Infinity")


@given(st.integers(0, 30).flatmap(lambda places: st.decimals(allow_nan=False, allow_infinity=False, places=places)))
def test_numeric_round_trips(value: Decimal) -> None:
    text = format(value, "f")
    assert format(convert("numeric", text.encode()), "f") == text


@pytest.mark.parametrize("data", [b"", b"1.2.3", b"abc", b"inf", b"sNaN", b"nan", b"1_0", b" 1"])
def test_malformed_numeric_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="numeric"):
        convert("numeric", data)


@pytest.mark.parametrize("type_name", ["float4", "float8"])
def test_floats(type_name: str) -> None:
    assert convert(type_name, b"1.5") == 1.5
    assert convert(type_name, b"-1e+30") == -1e30
    assert math.isnan(convert(type_name, b"NaN"))
    assert convert(type_name, b"Infinity") == math.inf
    assert convert(type_name, b"-Infinity") == -math.inf


@given(st.floats(allow_nan=False))
def test_float8_round_trips(x: float) -> None:
    text = "Infinity" if x == math.inf else "-Infinity" if x == -math.inf else repr(x)
    assert convert("float8", text.encode()) == x


def test_malformed_float_is_a_conversion_error() -> None:
    with pytest.raises(ValueConversionError, match="float8"):
        convert("float8", b"one")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"$1,234.56", Decimal("1234.56")),
        (b"-$1,234.56", Decimal("-1234.56")),
        (b"$0.00", Decimal("0.00")),
        (b"$92,233,720,368,547,758.07", Decimal("92233720368547758.07")),
        (b"-$92,233,720,368,547,758.08", Decimal("-92233720368547758.08")),
        (b"($5.00)", Decimal("-5.00")),
    ],
)
def test_money(data: bytes, expected: Decimal) -> None:
    value = convert("money", data)
    assert value == expected
    assert str(value) == str(expected)


@pytest.mark.parametrize("data", [b"", b"$", b"$1,23.00", b"($1.00", b"1.2.3", b"\xff"])
def test_malformed_money_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="money"):
        convert("money", data)


# --- text, bytes, bool, uuid, json ------------------------------------------


@pytest.mark.parametrize("type_name", ["text", "varchar", "bpchar", "name", "char", "json", "jsonb", "xml", "jsonpath"])
def test_text_family_is_str(type_name: str) -> None:
    assert convert(type_name, "héllo, wörld ✓".encode()) == "héllo, wörld ✓"
    assert convert(type_name, b"") == ""


def test_bpchar_keeps_its_padding() -> None:
    assert convert("bpchar", b"ab   ", 5 + 4) == "ab   "


def test_json_is_the_server_text() -> None:
    assert convert("jsonb", b'{"a": [1, 2.50, null]}') == '{"a": [1, 2.50, null]}'
    assert convert("xml", b"<a>x</a>") == "<a>x</a>"


def test_invalid_utf8_in_text_is_a_conversion_error() -> None:
    with pytest.raises(ValueConversionError, match="text"):
        convert("text", b"\xff\xfe")


def test_bytea_hex() -> None:
    assert convert("bytea", b"\\x") == b""
    assert convert("bytea", b"\\x00ff10DEADbeef") == b"\x00\xff\x10\xde\xad\xbe\xef"


def test_bytea_escape_format() -> None:
    assert convert("bytea", b"abc") == b"abc"
    assert convert("bytea", b"a\\\\b") == b"a\\b"
    assert convert("bytea", b"\\000\\377x\\101") == b"\x00\xffxA"


@pytest.mark.parametrize("data", [b"\\xf", b"\\xzz", b"\\4", b"a\\", b"\\400", b"\\09"])
def test_malformed_bytea_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="bytea"):
        convert("bytea", data)


@given(st.binary(max_size=64))
def test_bytea_round_trips_both_formats(data: bytes) -> None:
    assert convert("bytea", b"\\x" + data.hex().encode()) == data
    escaped = b"".join(b"\\\\" if c == 0x5C else bytes([c]) if 0x20 <= c < 0x7F else b"\\%03o" % c for c in data)
    assert convert("bytea", escaped) == data


def test_bool() -> None:
    assert convert("bool", b"t") is True
    assert convert("bool", b"f") is False
    with pytest.raises(ValueConversionError, match="bool"):
        convert("bool", b"true")


def test_uuid() -> None:
    value = convert("uuid", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert value == UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    with pytest.raises(ValueConversionError, match="uuid"):
        convert("uuid", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1")


@given(st.uuids())
def test_uuid_round_trips(u: UUID) -> None:
    assert convert("uuid", str(u).encode()) == u


@pytest.mark.parametrize("type_name", ["inet", "cidr", "macaddr", "macaddr8"])
def test_network_types_are_str(type_name: str) -> None:
    text = {"inet": "192.168.0.1/24", "cidr": "10.0.0.0/8", "macaddr": "08:00:2b:01:02:03"}.get(
        type_name, "08:00:2b:01:02:03:04:05"
    )
    assert convert(type_name, text.encode()) == text


def test_bit_strings_are_str() -> None:
    assert convert("bit", b"101", 3) == "101"
    assert convert("varbit", b"") == ""
    with pytest.raises(ValueConversionError, match="varbit"):
        convert("varbit", b"102")


@pytest.mark.parametrize("type_name", ["int4range", "numrange", "tsrange", "tstzrange", "daterange", "int8range"])
def test_ranges_are_the_server_text(type_name: str) -> None:
    assert convert(type_name, b'["2024-01-01 00:00:00+00",infinity)') == '["2024-01-01 00:00:00+00",infinity)'
    assert convert(type_name, b"empty") == "empty"


def test_multirange_is_the_server_text() -> None:
    assert convert("int4multirange", b"{[1,3),[5,7)}") == "{[1,3),[5,7)}"


# --- geometry -------------------------------------------------------------------


def test_point() -> None:
    assert convert("point", b"(1.5,-2)") == Point(1.5, -2.0)
    p = convert("point", b"(NaN,Infinity)")
    assert math.isnan(p.x) and p.y == math.inf


@pytest.mark.parametrize("data", [b"1,2", b"(1)", b"(1,2,3)", b"(a,b)"])
def test_malformed_point_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="point"):
        convert("point", data)


@pytest.mark.parametrize(
    ("type_name", "text"),
    [
        ("lseg", "[(1,2),(3,4)]"),
        ("box", "(3,4),(1,2)"),
        ("path", "((1,2),(3,4))"),
        ("polygon", "((0,0),(1,1),(1,0))"),
        ("line", "{1,-1,0}"),
        ("circle", "<(1,2),3>"),
    ],
)
def test_other_geometric_types_are_the_server_text(type_name: str, text: str) -> None:
    assert convert(type_name, text.encode()) == text


# --- dates and times ------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"1970-01-01", 0),
        (b"1970-01-02", 1),
        (b"1969-12-31", -1),
        (b"2000-02-29", 11016),
        (b"0001-01-01", jdn_days(1, 1, 1)),
        (b"0044-03-15 BC", jdn_days(-43, 3, 15)),
        (b"0001-12-31 BC", jdn_days(0, 12, 31)),
        (b"0001-02-29 BC", jdn_days(0, 2, 29)),  # 1 BC is a leap year
        (b"4713-11-24 BC", jdn_days(-4712, 11, 24)),
        (b"10000-01-01", jdn_days(10000, 1, 1)),
        (b"5874897-12-31", jdn_days(5874897, 12, 31)),
    ],
)
def test_date(data: bytes, expected: int) -> None:
    assert convert("date", data) == expected


def test_date_infinities() -> None:
    assert convert("date", b"infinity") is Infinity.POSITIVE
    assert convert("date", b"-infinity") is Infinity.NEGATIVE


def test_bc_dates_continue_the_ad_dates() -> None:
    assert convert("date", b"0001-12-31 BC") + 1 == convert("date", b"0001-01-01")


@given(st.dates())
def test_date_round_trips(d: date) -> None:
    assert convert("date", d.isoformat().encode()) == (d - date(1970, 1, 1)).days


@pytest.mark.parametrize(
    "data", [b"2024-02-30", b"2023-02-29", b"2024-13-01", b"2024-1-01", b"0000-01-01", b"24-01-01"]
)
def test_malformed_date_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="date"):
        convert("date", data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"00:00:00", 0),
        (b"12:34:56", (12 * 3600 + 34 * 60 + 56) * 1_000_000),
        (b"12:34:56.789", (12 * 3600 + 34 * 60 + 56) * 1_000_000 + 789_000),
        (b"23:59:59.999999", 86_400_000_000 - 1),
        (b"24:00:00", 86_400_000_000),
    ],
)
def test_time(data: bytes, expected: int) -> None:
    assert convert("time", data) == expected


@pytest.mark.parametrize("data", [b"24:00:01", b"12:60:00", b"12:00", b"12:00:00.1234567", b"1:00:00"])
def test_malformed_time_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="time"):
        convert("time", data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"12:00:00+00", TimeTz(43_200_000_000, 0)),
        (b"12:00:00.5+05:30", TimeTz(43_200_500_000, 19800)),
        (b"12:00:00-05:30:15", TimeTz(43_200_000_000, -19815)),
        (b"24:00:00-15:59", TimeTz(86_400_000_000, -(15 * 3600 + 59 * 60))),
    ],
)
def test_timetz(data: bytes, expected: TimeTz) -> None:
    assert convert("timetz", data) == expected


def test_malformed_timetz_is_a_conversion_error() -> None:
    with pytest.raises(ValueConversionError, match="timetz"):
        convert("timetz", b"12:00:00")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"1970-01-01 00:00:00", 0),
        (b"2024-05-01 12:34:56", 1714566896_000000),
        (b"2024-05-01 12:34:56.7", 1714566896_700000),
        (b"2024-05-01 12:34:56.789012", 1714566896_789012),
        (b"1969-12-31 23:59:59.999999", -1),
        (b"0044-03-15 12:00:00 BC", jdn_days(-43, 3, 15) * 86_400_000_000 + 43_200_000_000),
        (b"0044-03-15 12:00:00.25 BC", jdn_days(-43, 3, 15) * 86_400_000_000 + 43_200_250_000),
        (b"10000-01-01 00:00:00", jdn_days(10000, 1, 1) * 86_400_000_000),
        (b"294276-12-31 23:59:59.999999", (jdn_days(294276, 12, 31) + 1) * 86_400_000_000 - 1),
        (b"0999-01-01 00:00:00", jdn_days(999, 1, 1) * 86_400_000_000),
    ],
)
def test_timestamp(data: bytes, expected: int) -> None:
    assert convert("timestamp", data) == expected


def test_timestamp_infinities() -> None:
    assert convert("timestamp", b"infinity") is Infinity.POSITIVE
    assert convert("timestamp", b"-infinity") is Infinity.NEGATIVE
    assert convert("timestamptz", b"infinity") is Infinity.POSITIVE
    assert convert("timestamptz", b"-infinity") is Infinity.NEGATIVE


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)))
def test_timestamp_round_trips(dt: datetime) -> None:
    text = dt.strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0")
    if len(str(dt.year)) < 4:
        text = f"{dt.year:04d}" + dt.strftime("-%m-%d %H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond:06d}".rstrip("0")
    assert convert("timestamp", text.encode()) == (dt - EPOCH) // US


@pytest.mark.parametrize(
    "data",
    [
        b"2024-05-01 12:34:56+00",  # an offset on a timestamp without time zone
        b"2024-05-01 12:34:56.1+00",
        b"2024-05-01T12:34:56",
        b"2024-05-01",
        b"2024-05-01 12:34:56.1234567",
        b"2024-05-01 24:00:00",
        b"2024-05-01 12:34:56 AD",
    ],
)
def test_malformed_timestamp_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="timestamp"):
        convert("timestamp", data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"2024-05-01 12:34:56.789012+00", 1714566896_789012),
        (b"2024-05-01 18:04:56.789012+05:30", 1714566896_789012),
        (b"2024-05-01 07:34:56-05", 1714566896_000000),
        (b"2024-05-01 18:04:56+05:30:15", 1714566896_000000 - 15_000000),
        (b"1970-01-01 00:00:00-00:00:01", 1_000000),
        (b"0044-03-15 12:00:00+00 BC", jdn_days(-43, 3, 15) * 86_400_000_000 + 43_200_000_000),
        (b"0044-03-15 12:00:00-00:01:15 BC", jdn_days(-43, 3, 15) * 86_400_000_000 + 43_275_000_000),
        (b"12345-06-07 08:09:10.5+02", jdn_days(12345, 6, 7) * 86_400_000_000 + 22_150_500_000),
    ],
)
def test_timestamptz(data: bytes, expected: int) -> None:
    assert convert("timestamptz", data) == expected


@given(
    st.datetimes(min_value=datetime(1000, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(min_value=-15 * 3600, max_value=15 * 3600),
)
def test_timestamptz_round_trips(dt: datetime, offset: int) -> None:
    sign = "-" if offset < 0 else "+"
    h, rest = divmod(abs(offset), 3600)
    m, s = divmod(rest, 60)
    text = dt.strftime("%Y-%m-%d %H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond:06d}".rstrip("0")
    text += f"{sign}{h:02d}" + (f":{m:02d}" if m or s else "") + (f":{s:02d}" if s else "")
    aware = dt.replace(tzinfo=timezone(timedelta(seconds=offset)))
    assert convert("timestamptz", text.encode()) == (aware - EPOCH_UTC) // US


@pytest.mark.parametrize(
    "data",
    [
        b"2024-05-01 12:34:56",
        b"2024-05-01 12:34:56.1234567+00",
        b"2024-05-01 12:34:56+0",
        b"0044-05-01 12:34:56+05:60 BC",
    ],
)
def test_malformed_timestamptz_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="timestamptz"):
        convert("timestamptz", data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"00:00:00", Interval(0, 0, 0)),
        (b"1 day", Interval(0, 1, 0)),
        (b"-1 days", Interval(0, -1, 0)),
        (b"1 mon", Interval(1, 0, 0)),
        (b"1 year", Interval(12, 0, 0)),
        (b"1 year 2 mons 3 days 04:05:06.78", Interval(14, 3, 14_706_780_000)),
        (b"-1 years -2 mons +3 days -04:05:06", Interval(-14, 3, -14_706_000_000)),
        (b"1 year -2 mons", Interval(10, 0, 0)),
        (b"-00:00:00.000001", Interval(0, 0, -1)),
        (b"+01:00:00", Interval(0, 0, 3_600_000_000)),
        (b"2562047788:00:54.775807", Interval(0, 0, 2**63 - 1)),
        (b"178956970 years 7 mons", Interval(2**31 - 1, 0, 0)),
        (b"infinity", INTERVAL_INFINITY),
        (b"-infinity", INTERVAL_NEG_INFINITY),
    ],
)
def test_interval(data: bytes, expected: Interval) -> None:
    assert convert("interval", data) == expected


def pg_interval(months: int, days: int, micros: int) -> str:
    """The IntervalStyle postgres text, as PostgreSQL's EncodeInterval writes it."""
    years, mons = int(months / 12), months - int(months / 12) * 12
    parts: list[str] = []
    before = False
    for value, unit in ((years, "year"), (mons, "mon"), (days, "day")):
        if value:
            parts.append(f"{'+' if before and value > 0 else ''}{value} {unit}{'' if value == 1 else 's'}")
            before = value < 0
    if not parts or micros:
        sign = "-" if micros < 0 else ("+" if before else "")
        a = abs(micros)
        hours, rest = divmod(a, 3_600_000_000)
        minutes, rest = divmod(rest, 60_000_000)
        seconds, fraction = divmod(rest, 1_000_000)
        clock = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
        if fraction:
            clock += f".{fraction:06d}".rstrip("0")
        parts.append(clock)
    return " ".join(parts)


@given(
    st.integers(min_value=-(2**31) + 1, max_value=2**31 - 2),
    st.integers(min_value=-(2**31) + 1, max_value=2**31 - 2),
    st.integers(min_value=-(2**63) + 1, max_value=2**63 - 2),
)
def test_interval_round_trips(months: int, days: int, micros: int) -> None:
    assert convert("interval", pg_interval(months, days, micros).encode()) == Interval(months, days, micros)


@pytest.mark.parametrize("data", [b"", b"1", b"1 week", b"1 day 2", b"00:60:00", b"1:2:3", b"01:00:00 01:00:00"])
def test_malformed_interval_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="interval"):
        convert("interval", data)


# --- arrays ---------------------------------------------------------------------


def test_int_arrays() -> None:
    assert convert("_int4", b"{}") == []
    assert convert("_int4", b"{1,-2,3}") == [1, -2, 3]
    assert convert("_int4", b"{1,NULL,3}") == [1, None, 3]
    assert convert("_int8", b"{{1,2},{3,4}}") == [[1, 2], [3, 4]]
    assert convert("_int2", b"{{{1},{2}},{{3},{NULL}}}") == [[[1], [2]], [[3], [None]]]


def test_arrays_with_explicit_bounds() -> None:
    assert convert("_int4", b"[0:1]={1,2}") == [1, 2]
    assert convert("_int4", b"[-2:-1][1:2]={{1,2},{3,4}}") == [[1, 2], [3, 4]]
    assert convert("_text", b'[0:0]={"a b"}') == ["a b"]


def test_text_arrays_with_quotes_and_escapes() -> None:
    data = rb'{plain,"with space","with,comma","q\"uote","back\\slash","",NULL,"NULL","null","{brace}"}'
    assert convert("_text", data) == [
        "plain",
        "with space",
        "with,comma",
        'q"uote',
        "back\\slash",
        "",
        None,
        "NULL",
        "null",
        "{brace}",
    ]
    assert convert("_varchar", '{héllo,"wörld ✓"}'.encode()) == ["héllo", "wörld ✓"]


def test_multidimensional_text_array_with_nulls() -> None:
    assert convert("_text", b'{{"a,b",NULL},{c,"}"}}') == [["a,b", None], ["c", "}"]]


def test_box_arrays_use_semicolons() -> None:
    assert convert("_box", b"{(1,1),(0,0);(3,3),(2,2)}") == ["(1,1),(0,0)", "(3,3),(2,2)"]


@pytest.mark.parametrize(
    ("type_name", "data", "expected"),
    [
        ("_bool", b"{t,f,NULL}", [True, False, None]),
        ("_bytea", b'{"\\\\x0102","\\\\x"}', [b"\x01\x02", b""]),
        ("_numeric", b"{1.50,NaN,-Infinity}", [Decimal("1.50"), Decimal("NaN"), Decimal("-Infinity")]),
        ("_float8", b"{1.5,Infinity,-Infinity}", [1.5, math.inf, -math.inf]),
        ("_money", b'{"$1,234.56",-$0.01}', [Decimal("1234.56"), Decimal("-0.01")]),
        ("_date", b'{2024-05-01,infinity,"0044-03-15 BC"}', [19844, Infinity.POSITIVE, jdn_days(-43, 3, 15)]),
        ("_time", b"{12:00:00,24:00:00}", [43_200_000_000, 86_400_000_000]),
        ("_timetz", b'{"12:00:00+05:30"}', [TimeTz(43_200_000_000, 19800)]),
        ("_timestamp", b'{"2024-05-01 12:34:56",-infinity}', [1714566896_000000, Infinity.NEGATIVE]),
        ("_timestamptz", b'{"2024-05-01 12:34:56.789012+00",NULL}', [1714566896_789012, None]),
        ("_interval", b'{"1 day 01:00:00",00:00:00}', [Interval(0, 1, 3_600_000_000), Interval(0, 0, 0)]),
        ("_uuid", b"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", [UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")]),
        ("_json", b'{"{\\"a\\": 1}",null}', ['{"a": 1}', None]),
        ("_jsonb", b'{"[1, 2]"}', ["[1, 2]"]),
        ("_xml", b'{"<a>x</a>"}', ["<a>x</a>"]),
        ("_point", b'{"(1,2)","(3.5,-4)"}', [Point(1.0, 2.0), Point(3.5, -4.0)]),
        ("_inet", b"{10.0.0.1,::1/128}", ["10.0.0.1", "::1/128"]),
        ("_bit", b"{101,010}", ["101", "010"]),
        ("_int4range", b'{"[1,3)",empty}', ["[1,3)", "empty"]),
        ("_bpchar", b'{"a  ",bc }', ["a  ", "bc"]),
        ("_char", b'{a,"\\\\"}', ["a", "\\"]),
        ("_oid", b"{4294967295}", [4294967295]),
    ],
)
def test_arrays_of_every_element_type(type_name: str, data: bytes, expected: list[Any]) -> None:
    value = convert(type_name, data)
    for got, want in zip(value, expected, strict=True):
        if isinstance(want, Decimal) and want.is_nan():
            assert got.is_nan()
        else:
            assert got == want


@pytest.mark.parametrize(
    "data", [b"", b"1,2", b"{1,2", b"{1,,2}", b"{1,2}}", b"{{1},2", b'{"a}', b"[1:2]{1,2}", b"{x}"]
)
def test_malformed_array_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="_int4"):
        convert("_int4", data)


def test_arrays_deeper_than_postgres_allows_are_malformed() -> None:
    with pytest.raises(ValueConversionError):
        convert("_int4", b"{" * 7 + b"1" + b"}" * 7)
    with pytest.raises(ValueConversionError):
        convert("_int4", b"{" * 5000 + b"}" * 5000)


def pg_array(value: Any) -> str:
    """array_out's text: quote elements that need it, escape quotes and backslashes."""
    if isinstance(value, list):
        return "{" + ",".join(pg_array(v) for v in value) + "}"
    if value is None:
        return "NULL"
    text = str(value)
    needs_quotes = (
        text == "" or text.upper() == "NULL" or any(c in text for c in '{},"\\') or any(c.isspace() for c in text)
    )
    if needs_quotes:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def nested(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """Rectangular arrays of 1 to 3 dimensions."""

    @st.composite
    def build(draw: st.DrawFn) -> list[Any]:
        shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))

        def fill(dims: list[int]) -> list[Any]:
            if len(dims) == 1:
                return [draw(elements) for _ in range(dims[0])]
            return [fill(dims[1:]) for _ in range(dims[0])]

        return fill(shape)

    return build()


@given(nested(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))))
def test_int_arrays_round_trip(value: list[Any]) -> None:
    assert convert("_int4", pg_array(value).encode()) == value


@given(nested(st.one_of(st.none(), st.text(max_size=8))))
def test_text_arrays_round_trip(value: list[Any]) -> None:
    assert convert("_text", pg_array(value).encode()) == value


# --- enums, domains, hstore, unknown types -----------------------------------------

MOOD = PgType(70001, "mood", TypeKind.ENUM, "public", labels=("sad", "ok", "happy"))


def test_enum_is_its_label() -> None:
    assert converter_for(MOOD)(b"happy") == "happy"
    mood_array = PgType(70002, "_mood", TypeKind.ARRAY, "public", element=MOOD)
    assert converter_for(mood_array)(b"{sad,NULL,happy}") == ["sad", None, "happy"]


def test_domain_is_its_base_type() -> None:
    positive = PgType(70003, "positive", TypeKind.DOMAIN, "public", element=BY_NAME["int4"])
    assert converter_for(positive)(b"42") == 42
    price = PgType(70004, "price", TypeKind.DOMAIN, "public", element=BY_NAME["numeric"])
    assert converter_for(price, (10 << 16 | 2) + 4)(b"9.99") == Decimal("9.99")
    small_price = PgType(70005, "small_price", TypeKind.DOMAIN, "public", element=price)
    assert converter_for(small_price)(b"1.00") == Decimal("1.00")
    prices = PgType(70006, "_price", TypeKind.ARRAY, "public", element=price)
    assert converter_for(prices)(b"{1.00,NULL}") == [Decimal("1.00"), None]
    boxes = PgType(70007, "boxy", TypeKind.DOMAIN, "public", element=BY_NAME["box"])
    assert converter_for(PgType(70008, "_boxy", TypeKind.ARRAY, element=boxes))(b"{(1,1),(0,0);(2,2),(1,1)}") == [
        "(1,1),(0,0)",
        "(2,2),(1,1)",
    ]


def test_malformed_domain_value_names_the_domain() -> None:
    positive = PgType(70003, "positive", TypeKind.DOMAIN, "public", element=BY_NAME["int4"])
    with pytest.raises(ValueConversionError, match="positive"):
        converter_for(positive)(b"x")


HSTORE = PgType(80001, "hstore", TypeKind.BASE, "public")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", {}),
        (b'"a"=>"1"', {"a": "1"}),
        (b'"a"=>"1", "b"=>NULL', {"a": "1", "b": None}),
        (b'"b"=>"NULL"', {"b": "NULL"}),
        (r'"q\"k"=>"back\\slash", "é"=>"ü ✓"'.encode(), {'q"k': "back\\slash", "é": "ü ✓"}),
        (b'"x"=>"", ""=>"y"', {"x": "", "": "y"}),
        (b"a=>1,b=>null", {"a": "1", "b": None}),
        (b'"a,b"=>"c=>d"', {"a,b": "c=>d"}),
    ],
)
def test_hstore(data: bytes, expected: dict[str, str | None]) -> None:
    assert converter_for(HSTORE)(data) == expected


@pytest.mark.parametrize("data", [b'"a"', b'"a"=>', b'"a"=>"1" "b"=>"2"', b'"a"=>"1",', b'"a=>"1"'])
def test_malformed_hstore_is_a_conversion_error(data: bytes) -> None:
    with pytest.raises(ValueConversionError, match="hstore"):
        converter_for(HSTORE)(data)


def pg_hstore(value: dict[str, str | None]) -> str:
    def quote(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return ", ".join(f"{quote(k)}=>{'NULL' if v is None else quote(v)}" for k, v in value.items())


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.text(max_size=8)), max_size=6))
def test_hstore_round_trips(value: dict[str, str | None]) -> None:
    assert converter_for(HSTORE)(pg_hstore(value).encode()) == value


def test_hstore_array() -> None:
    hstores = PgType(80002, "_hstore", TypeKind.ARRAY, "public", element=HSTORE)
    assert converter_for(hstores)(b'{"\\"a\\"=>\\"1\\"",NULL}') == [{"a": "1"}, None]


def test_citext_is_str() -> None:
    assert converter_for(PgType(80003, "citext", TypeKind.BASE, "public"))(b"MiXeD") == "MiXeD"


@pytest.mark.parametrize(
    "pg_type",
    [
        PgType(90001, "mystery", TypeKind.UNKNOWN, "public"),
        PgType(90002, "address", TypeKind.COMPOSITE, "public"),
        PgType(3614, "tsvector", TypeKind.BASE),  # a catalog type this module does not convert
        PgType(23, "int4", TypeKind.UNKNOWN),  # UNKNOWN wins over a known OID
        PgType(90003, "broken_domain", TypeKind.DOMAIN, "public"),
        PgType(90004, "_broken", TypeKind.ARRAY, "public"),
    ],
)
def test_unknown_types_are_their_text(pg_type: PgType) -> None:
    convert_unknown = converter_for(pg_type)
    assert convert_unknown(b'(1,"a b")') == '(1,"a b")'
    assert convert_unknown(b"\xffok") == "\\xffok"  # never an error, never dropped


# --- errors ---------------------------------------------------------------------


def test_error_names_the_type_and_a_short_repr() -> None:
    with pytest.raises(ValueConversionError) as info:
        convert("timestamptz", b"x" * 500)
    message = str(info.value)
    assert "timestamptz" in message
    assert "500 bytes" in message
    assert len(message) < 200
    assert info.value.type_name == "timestamptz"
    assert info.value.data == b"x" * 500
    assert isinstance(info.value, ValueError)


KNOWN = sorted(
    {name for name, t in BY_NAME.items() if t.kind is not TypeKind.ARRAY} | {"_int4", "_text", "_box", "_numeric"}
)


@settings(max_examples=300)
@given(st.sampled_from(KNOWN), st.binary(max_size=40) | st.text(string.printable, max_size=40).map(str.encode))
def test_arbitrary_bytes_give_a_value_or_a_conversion_error(type_name: str, data: bytes) -> None:
    try:
        convert(type_name, data)
    except ValueConversionError:
        pass
