"""Every built-in type as a case: column type, SQL literal, the value the event must carry (``Sql``: the server
computes it). Shared by the decoder's type tests and the JSON renderer's tests."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg

from cdc.event import TypeKind
from cdc.values import Infinity, Interval, Point, TimeTz


@dataclass(frozen=True)
class Sql:
    """An expected value the server computes."""

    expression: str


def days(date: str) -> Sql:
    return Sql(f"'{date}'::date - '1970-01-01'::date")


def micros(timestamp: str, type_: str = "timestamp") -> Sql:
    return Sql(f"(extract(epoch from '{timestamp}'::{type_}) * 1000000)::numeric(30, 0)")


CASES: list[tuple[str, str, str, Any]] = [
    # (label, column type, SQL literal, expected value)
    ("int2 min", "int2", "-32768", -32768),
    ("int4 max", "int4", "2147483647", 2147483647),
    ("int8 min", "int8", "-9223372036854775808", -9223372036854775808),
    ("oid", "oid", "4294967295", 4294967295),
    (
        "numeric exact",
        "numeric",
        "123456789012345678901234567890.123456789",
        Decimal("123456789012345678901234567890.123456789"),
    ),
    ("numeric scaled", "numeric(10, 2)", "1.5", Decimal("1.50")),
    ("numeric NaN", "numeric", "'NaN'", Decimal("NaN")),
    ("numeric infinity", "numeric", "'Infinity'", Decimal("Infinity")),
    ("numeric -infinity", "numeric", "'-Infinity'", Decimal("-Infinity")),
    ("float4", "float4", "1.5", 1.5),
    ("float4 NaN", "float4", "'NaN'", math.nan),
    ("float8 shortest exact", "float8", "0.1", 0.1),
    ("float8 tiny", "float8", "5e-324", 5e-324),
    ("float8 infinity", "float8", "'Infinity'", math.inf),
    ("float8 -infinity", "float8", "'-Infinity'", -math.inf),
    (
        "text",
        "text",
        "E'quote '' backslash \\\\ newline \\n tab \\t é 😀'",
        "quote ' backslash \\ newline \n tab \t é 😀",
    ),
    ("text empty", "text", "''", ""),
    ("varchar", "varchar(10)", "'abc'", "abc"),
    ("bpchar padded", "char(5)", "'ab'", "ab   "),
    ("name", "name", "'a_name'", "a_name"),
    ("char", '"char"', "'c'", "c"),
    ("bytea", "bytea", "'\\x00ff10'", b"\x00\xff\x10"),
    ("bytea empty", "bytea", "''", b""),
    ("bool true", "bool", "true", True),
    ("bool false", "bool", "false", False),
    ("date", "date", "'2024-02-29'", days("2024-02-29")),
    ("date before 1970", "date", "'1900-03-01'", days("1900-03-01")),
    ("date BC", "date", "'0044-03-15 BC'", days("0044-03-15 BC")),
    ("date far future", "date", "'5874897-12-31'", days("5874897-12-31")),
    ("date infinity", "date", "'infinity'", Infinity.POSITIVE),
    ("date -infinity", "date", "'-infinity'", Infinity.NEGATIVE),
    ("time", "time", "'23:59:59.999999'", 86_399_999_999),
    ("time midnight 24", "time", "'24:00:00'", 86_400_000_000),
    ("timetz", "timetz", "'12:34:56.789+05:30'", TimeTz(45_296_789_000, 19_800)),
    ("timetz west", "timetz", "'00:00:01-08'", TimeTz(1_000_000, -28_800)),
    ("timestamp", "timestamp", "'2024-01-31 12:34:56.123456'", micros("2024-01-31 12:34:56.123456")),
    ("timestamp BC", "timestamp", "'0044-03-15 12:00:00 BC'", micros("0044-03-15 12:00:00 BC")),
    ("timestamp infinity", "timestamp", "'infinity'", Infinity.POSITIVE),
    ("timestamp -infinity", "timestamp", "'-infinity'", Infinity.NEGATIVE),
    ("timestamptz", "timestamptz", "'2024-01-31 12:34:56.5+02'", micros("2024-01-31 12:34:56.5+02", "timestamptz")),
    (
        "timestamptz BC",
        "timestamptz",
        "'0100-01-01 00:00:00+00 BC'",
        micros("0100-01-01 00:00:00+00 BC", "timestamptz"),
    ),
    ("timestamptz infinity", "timestamptz", "'infinity'", Infinity.POSITIVE),
    ("interval", "interval", "'1 year 2 mons -3 days 04:05:06.789'", Interval(14, -3, 14_706_789_000)),
    ("interval negative time", "interval", "'-1 day -00:00:01.5'", Interval(0, -1, -1_500_000)),
    ("interval zero", "interval", "'0'", Interval(0, 0, 0)),
    ("uuid", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    ("json as written", "json", """'{"b": 1,  "a": [1, 2.50, null]}'""", '{"b": 1,  "a": [1, 2.50, null]}'),
    ("jsonb normalized", "jsonb", """'{"b": 1,  "a": [1, 2.50, null]}'""", '{"a": [1, 2.50, null], "b": 1}'),
    ("xml", "xml", "'<a href=\"x\">b &amp; c</a>'", '<a href="x">b &amp; c</a>'),
    ("money", "money", "'1234.56'", Decimal("1234.56")),
    ("money negative", "money", "'-1234567.89'", Decimal("-1234567.89")),
    ("inet", "inet", "'192.168.0.1/24'", "192.168.0.1/24"),
    ("inet6", "inet", "'::1'", "::1"),
    ("cidr", "cidr", "'10.0.0.0/8'", "10.0.0.0/8"),
    ("macaddr", "macaddr", "'08:00:2b:01:02:03'", "08:00:2b:01:02:03"),
    ("macaddr8", "macaddr8", "'08:00:2b:01:02:03:04:05'", "08:00:2b:01:02:03:04:05"),
    ("bit", "bit(4)", "B'1010'", "1010"),
    ("varbit", "varbit", "B'101'", "101"),
    ("int4range", "int4range", "'[1,10)'", "[1,10)"),
    ("int4range empty", "int4range", "'empty'", "empty"),
    ("numrange unbounded", "numrange", "'(1.5,)'", "(1.5,)"),
    ("daterange", "daterange", "'[2024-01-01,2024-02-01)'", "[2024-01-01,2024-02-01)"),
    (
        "tstzrange",
        "tstzrange",
        "'[2024-01-01 00:00+00,2024-02-01 00:00+00)'",
        '["2024-01-01 00:00:00+00","2024-02-01 00:00:00+00")',
    ),
    ("int4multirange", "int4multirange", "'{[1,3), [5,7)}'", "{[1,3),[5,7)}"),
    ("point", "point", "'(1.5,-2)'", Point(1.5, -2.0)),
    ("line", "line", "'{1,-1,0}'", "{1,-1,0}"),
    ("lseg", "lseg", "'[(0,0),(1,1)]'", "[(0,0),(1,1)]"),
    ("box", "box", "'(0,0),(1,1)'", "(1,1),(0,0)"),
    ("path", "path", "'((0,0),(1,1),(2,0))'", "((0,0),(1,1),(2,0))"),
    ("polygon", "polygon", "'((0,0),(1,0),(1,1))'", "((0,0),(1,0),(1,1))"),
    ("circle", "circle", "'<(0,0),1.5>'", "<(0,0),1.5>"),
    ("enum", "mood", "'happy'", "happy"),
    ("array of enum", "mood[]", "'{sad,NULL,happy}'", ["sad", None, "happy"]),
    ("domain over int", "posint", "42", 42),
    ("domain over text", "email", "'a@example.org'", "a@example.org"),
    ("domain over numeric", "price", "9.9", Decimal("9.90")),
    ("domain over domain", "small_posint", "7", 7),
    ("array of domain", "posint[]", "'{1,2}'", [1, 2]),
    ("hstore", "hstore", """'a=>1, b=>NULL, "c d"=>"e\\"f"'""", {"a": "1", "b": None, "c d": 'e"f'}),
    ("citext", "citext", "'MiXeD'", "MiXeD"),
    ("int4[] with NULL", "int4[]", "'{1,NULL,3}'", [1, None, 3]),
    ("int4[] empty", "int4[]", "'{}'", []),
    ("int4[][]", "int4[][]", "'{{1,2},{3,4}}'", [[1, 2], [3, 4]]),
    ("int4[][][]", "int4[]", "'{{{1},{2}},{{3},{4}}}'", [[[1], [2]], [[3], [4]]]),
    ("int4[] lower bound", "int4[]", "'[0:1]={7,8}'", [7, 8]),
    (
        "text[] quoting",
        "text[]",
        """ARRAY['a,b', 'c"d', NULL, 'NULL', '', 'e\\f', ' sp ']""",
        ["a,b", 'c"d', None, "NULL", "", "e\\f", " sp "],
    ),
    ("numeric[]", "numeric[]", "'{1.5,NaN,-0.001}'", [Decimal("1.5"), Decimal("NaN"), Decimal("-0.001")]),
    ("float8[]", "float8[]", "'{1.5,Infinity,NaN}'", [1.5, math.inf, math.nan]),
    ("bool[]", "bool[]", "'{t,f,NULL}'", [True, False, None]),
    ("date[]", "date[]", "'{2024-01-01,infinity}'", [days("2024-01-01"), Infinity.POSITIVE]),
    (
        "timestamptz[]",
        "timestamptz[]",
        "ARRAY['2024-01-31 12:00:00+00'::timestamptz]",
        [micros("2024-01-31 12:00:00+00", "timestamptz")],
    ),
    ("uuid[]", "uuid[]", "'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}'", [UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")]),
    ("bytea[]", "bytea[]", "ARRAY['\\x00ff'::bytea, NULL]", [b"\x00\xff", None]),
    ("jsonb[]", "jsonb[]", """ARRAY['{"a": 1}'::jsonb, '[1, "x"]']""", ['{"a": 1}', '[1, "x"]']),
    ("interval[]", "interval[]", '\'{"1 day","-00:00:01"}\'', [Interval(0, 1, 0), Interval(0, 0, -1_000_000)]),
    ("box[]", "box[]", "'{(1,1),(0,0);(2,2),(1,1)}'", ["(1,1),(0,0)", "(2,2),(1,1)"]),
    ("point[]", "point[]", '\'{"(1,2)","(3,4)"}\'', [Point(1.0, 2.0), Point(3.0, 4.0)]),
    ("varchar[]", "varchar(5)[]", "'{ab,cd}'", ["ab", "cd"]),
    ("composite travels as text", "pair", "ROW(1, 'x y')", '(1,"x y")'),
    ("tsvector travels as text", "tsvector", "'fat:1 cat:2'", "'cat':2 'fat':1"),
    ("pg_lsn travels as text", "pg_lsn", "'16/B374D848'", "16/B374D848"),
    ("NULL", "text", "NULL", None),
]

SETUP = """
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE EXTENSION IF NOT EXISTS citext;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN small_posint AS posint CHECK (VALUE < 100);
CREATE DOMAIN email AS text;
CREATE DOMAIN price AS numeric(10, 2);
CREATE TYPE pair AS (a int, b text);
"""

# Declared types the catalog reports under another name.
UNKNOWN_AS_TEXT = {
    "composite travels as text": ("pair", TypeKind.COMPOSITE),
    "tsvector travels as text": ("tsvector", TypeKind.BASE),
}


def same(got: Any, expected: Any) -> bool:
    if isinstance(expected, float) and math.isnan(expected):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(expected, Decimal):
        return isinstance(got, Decimal) and (got.is_nan() and expected.is_nan() or repr(got) == repr(expected))
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(same(g, e) for g, e in zip(got, expected, strict=True))
        )
    return type(got) is type(expected) and bool(got == expected)


def resolve(conn: psycopg.Connection[Any], expected: Any) -> Any:
    if isinstance(expected, Sql):
        row = conn.execute(f"SELECT ({expected.expression})").fetchone()
        assert row is not None
        return int(row[0])
    if isinstance(expected, list):
        return [resolve(conn, e) for e in expected]
    return expected


def hstore_available(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'hstore'").fetchone() is not None


def xml_available(dsn: str) -> bool:
    """Whether the server was built with libxml (Debian's is; the PostgreSQL 16 and 18 wheels are not)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("SELECT '<a/>'::xml")
        except psycopg.errors.FeatureNotSupported:
            return False
    return True


def server_cases(dsn: str) -> list[tuple[str, str, str, Any]]:
    """CASES this server can hold: without the xml column where the server has no libxml, without hstore
    and citext where contrib is not installed (the PostgreSQL 16 wheel has neither)."""
    left_out = set() if xml_available(dsn) else {"xml"}
    if not hstore_available(dsn):
        left_out |= {"hstore", "citext"}
    return [case for case in CASES if case[1] not in left_out]


def server_setup(dsn: str) -> str:
    """SETUP without the contrib extensions where they are not installed."""
    if hstore_available(dsn):
        return SETUP
    return "\n".join(line for line in SETUP.splitlines() if "CREATE EXTENSION" not in line)
