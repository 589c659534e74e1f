"""The row codec's cases shared by its tests (tests/unit/test_codec.py, test_copy_codec.py): a value of
every type as pgoutput sends it, the types the direct path renders, random texts, and the serializers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import PgType, TypeKind
from cdc.sink.avro import AvroSerializer, AvroSettings
from cdc.sink.json import JsonSerializer, JsonSettings
from tests.support.accounts import numeric_typmod
from tests.support.avro import FakeRegistry

BY = {t.name: t for t in BUILTIN_TYPES.values()}


MOOD = PgType(90001, "mood", TypeKind.ENUM, "public", labels=("sad", "ok", "happy"))


POSINT = PgType(90003, "posint", TypeKind.DOMAIN, "public", element=BY["int4"])


CUSTOM = [
    MOOD,
    PgType(90002, "_mood", TypeKind.ARRAY, "public", element=MOOD),
    POSINT,
    PgType(90004, "email", TypeKind.DOMAIN, "public", element=BY["text"]),
    PgType(90005, "price", TypeKind.DOMAIN, "public", element=BY["numeric"]),
    PgType(90006, "small_posint", TypeKind.DOMAIN, "public", element=POSINT),
    PgType(90007, "_posint", TypeKind.ARRAY, "public", element=POSINT),
    PgType(90008, "hstore", TypeKind.BASE, "public"),
    PgType(90009, "citext", TypeKind.BASE, "public"),
    PgType(90010, "pair", TypeKind.COMPOSITE, "public"),
    PgType(3614, "tsvector", TypeKind.BASE, "pg_catalog"),
    PgType(3220, "pg_lsn", TypeKind.UNKNOWN, "pg_catalog"),
]


TYPES = {**BY, **{t.name: t for t in CUSTOM}}


OIDS = {t.oid: t for t in CUSTOM}


# (type, modifier, the text the server sends): every case of tests/support/type_cases.py, and edges.
CASES: list[tuple[str, int, bytes]] = [
    ("int2", -1, b"-32768"),
    ("int4", -1, b"2147483647"),
    ("int8", -1, b"-9223372036854775808"),
    ("int8", -1, b"9223372036854775807"),
    ("int8", -1, b"0"),
    ("oid", -1, b"4294967295"),
    ("numeric", -1, b"123456789012345678901234567890.123456789"),
    ("numeric", numeric_typmod(10, 2), b"1.50"),
    ("numeric", numeric_typmod(10, 2), b"-0.01"),
    ("numeric", numeric_typmod(10, 2), b"0.00"),
    ("numeric", numeric_typmod(18, 0), b"999999999999999999"),
    ("numeric", numeric_typmod(18, 0), b"-999999999999999999"),
    ("numeric", numeric_typmod(19, 0), b"-9223372036854775808"),
    ("numeric", numeric_typmod(38, 6), b"12345678901234567890123456789012.123456"),
    ("numeric", numeric_typmod(12, 2), b"-128.00"),
    ("numeric", numeric_typmod(12, 2), b"1.27"),
    ("numeric", numeric_typmod(12, 2), b"1.28"),
    ("numeric", numeric_typmod(12, 2), b"NaN"),
    ("numeric", numeric_typmod(12, 2), b"Infinity"),
    ("numeric", -1, b"NaN"),
    ("numeric", -1, b"Infinity"),
    ("numeric", -1, b"-Infinity"),
    ("float4", -1, b"1.5"),
    ("float4", -1, b"NaN"),
    ("float8", -1, b"0.1"),
    ("float8", -1, b"5e-324"),
    ("float8", -1, b"Infinity"),
    ("float8", -1, b"-Infinity"),
    ("text", -1, "quote ' backslash \\ newline \n tab \t é 😀".encode()),
    ("text", -1, b""),
    ("text", -1, b'100% "sure"'),
    ("text", -1, b"del \x7f and bell \x07"),
    ("text", -1, b"\xff\xfe"),  # not UTF-8: both decline to the typed path
    ("varchar", 10, b"abc"),
    ("bpchar", 9, b"ab   "),
    ("name", -1, b"a_name"),
    ("char", -1, b"c"),
    ("bytea", -1, b"\\x00ff10"),
    ("bytea", -1, b"\\x"),
    ("bool", -1, b"t"),
    ("bool", -1, b"f"),
    ("bool", -1, b"true"),
    ("date", -1, b"2024-02-29"),
    ("date", -1, b"1900-03-01"),
    ("date", -1, b"0044-03-15 BC"),
    ("date", -1, b"5874897-12-31"),
    ("date", -1, b"infinity"),
    ("date", -1, b"-infinity"),
    ("time", -1, b"23:59:59.999999"),
    ("time", -1, b"24:00:00"),
    ("timetz", -1, b"12:34:56.789+05:30"),
    ("timetz", -1, b"00:00:01-08"),
    ("timestamp", -1, b"2024-01-31 12:34:56.123456"),
    ("timestamp", -1, b"0044-03-15 12:00:00 BC"),
    ("timestamp", -1, b"infinity"),
    ("timestamp", -1, b"-infinity"),
    ("timestamptz", -1, b"2024-01-31 10:34:56.5+00"),
    ("timestamptz", 0, b"2024-01-31 10:34:56+00"),
    ("timestamptz", 3, b"2024-01-31 10:34:56.5+00"),
    ("timestamptz", 3, b"2024-01-31 10:34:56+00"),
    ("timestamptz", 6, b"9999-12-31 23:59:59.999999+00"),
    ("timestamptz", 2, b"0001-01-01 00:00:00.01+00"),
    ("timestamptz", -1, b"0100-01-01 00:00:00+00 BC"),
    ("timestamptz", -1, b"10000-01-01 00:00:00+00"),
    ("timestamptz", -1, b"infinity"),
    ("timestamptz", -1, b"-infinity"),
    ("timestamptz", -1, b"2024-01-31 12:34:56.5+02"),  # a session not in UTC
    ("timestamptz", -1, b"2024-01-31 12:34:56.+00"),
    ("interval", -1, b"1 year 2 mons -3 days 04:05:06.789"),
    ("interval", -1, b"-1 days -00:00:01.5"),
    ("interval", -1, b"00:00:00"),
    ("uuid", -1, b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("uuid", -1, b"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),
    ("uuid", -1, b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1"),
    ("json", -1, b'{"b": 1,  "a": [1, 2.50, null]}'),
    ("jsonb", -1, b'{"a": [1, 2.50, null], "b": 1}'),
    ("xml", -1, b'<a href="x">b &amp; c</a>'),
    ("money", -1, b"$1,234.56"),
    ("money", -1, b"-$1,234,567.89"),
    ("inet", -1, b"192.168.0.1/24"),
    ("inet", -1, b"::1"),
    ("cidr", -1, b"10.0.0.0/8"),
    ("macaddr", -1, b"08:00:2b:01:02:03"),
    ("macaddr8", -1, b"08:00:2b:01:02:03:04:05"),
    ("bit", 4, b"1010"),
    ("varbit", -1, b"101"),
    ("int4range", -1, b"[1,10)"),
    ("int4range", -1, b"empty"),
    ("numrange", -1, b"(1.5,)"),
    ("daterange", -1, b"[2024-01-01,2024-02-01)"),
    ("tstzrange", -1, b'["2024-01-01 00:00:00+00","2024-02-01 00:00:00+00")'),
    ("int4multirange", -1, b"{[1,3),[5,7)}"),
    ("point", -1, b"(1.5,-2)"),
    ("line", -1, b"{1,-1,0}"),
    ("lseg", -1, b"[(0,0),(1,1)]"),
    ("box", -1, b"(1,1),(0,0)"),
    ("path", -1, b"((0,0),(1,1),(2,0))"),
    ("polygon", -1, b"((0,0),(1,0),(1,1))"),
    ("circle", -1, b"<(0,0),1.5>"),
    ("mood", -1, b"happy"),
    ("_mood", -1, b"{sad,NULL,happy}"),
    ("posint", -1, b"42"),
    ("email", -1, b"a@example.org"),
    ("price", numeric_typmod(10, 2), b"9.90"),
    ("small_posint", -1, b"7"),
    ("_posint", -1, b"{1,2}"),
    ("hstore", -1, b'"a"=>"1", "b"=>NULL, "c d"=>"e\\"f"'),
    ("citext", -1, b"MiXeD"),
    ("_int4", -1, b"{1,NULL,3}"),
    ("_int4", -1, b"{}"),
    ("_int4", -1, b"{{1,2},{3,4}}"),
    ("_int4", -1, b"{{{1},{2}},{{3},{4}}}"),
    ("_int4", -1, b"[0:1]={7,8}"),
    ("_text", -1, b'{"a,b","c\\"d",NULL,"NULL","","e\\\\f"," sp "}'),
    ("_numeric", -1, b"{1.5,NaN,-0.001}"),
    ("_float8", -1, b"{1.5,Infinity,NaN}"),
    ("_bool", -1, b"{t,f,NULL}"),
    ("_date", -1, b"{2024-01-01,infinity}"),
    ("_timestamptz", -1, b'{"2024-01-31 12:00:00+00"}'),
    ("_uuid", -1, b"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"),
    ("_bytea", -1, b'{"\\\\x00ff",NULL}'),
    ("_jsonb", -1, b'{"{\\"a\\": 1}","[1, \\"x\\"]"}'),
    ("_interval", -1, b'{"1 day","-00:00:01"}'),
    ("_box", -1, b"{(1,1),(0,0);(2,2),(1,1)}"),
    ("_point", -1, b'{"(1,2)","(3,4)"}'),
    ("_varchar", 9, b"{ab,cd}"),
    ("pair", -1, b'(1,"x y")'),
    ("tsvector", -1, b"'cat':2 'fat':1"),
    ("pg_lsn", -1, b"16/B374D848"),
]


def serializers() -> list[tuple[str, Callable[[], Any]]]:
    def json(schemas: bool) -> Callable[[], Any]:
        return lambda: JsonSerializer(
            JsonSettings(topic_prefix="p", database="db", schemas_enable=schemas),
            lambda topic: 2,
            clock_ns=lambda: CLOCK,
        )

    def avro() -> AvroSerializer:
        return AvroSerializer(
            AvroSettings(topic_prefix="p", database="db"), lambda topic: 2, FakeRegistry(), clock_ns=lambda: CLOCK
        )

    return [("json", json(False)), ("json+schema", json(True)), ("avro", avro)]


DIRECT = [
    ("int8", -1),
    ("int4", -1),
    ("text", -1),
    ("varchar", 20),
    ("bool", -1),
    ("uuid", -1),
    ("timestamptz", -1),
    ("timestamptz", 0),
    ("timestamptz", 3),
    ("numeric", numeric_typmod(12, 2)),
    ("numeric", numeric_typmod(18, 0)),
    ("numeric", numeric_typmod(30, 4)),
    ("jsonb", -1),
    ("float8", -1),
]


def _timestamptz_texts() -> st.SearchStrategy[bytes]:
    fraction = st.one_of(st.just(""), st.text("0123456789", min_size=0, max_size=7).map(lambda d: "." + d))
    return st.builds(
        lambda y, mo, d, h, mi, s, f, z: f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}{f}{z}".encode(),
        st.integers(1, 12000),
        st.integers(1, 12),
        st.integers(1, 28),
        st.integers(0, 23),
        st.integers(0, 59),
        st.integers(0, 59),
        fraction,
        st.sampled_from(["+00", "+00", "+02", "-00", "+00 BC", ""]),
    )


def _numeric_texts() -> st.SearchStrategy[bytes]:
    def text(unscaled: int, scale: int) -> bytes:
        digits = str(abs(unscaled)).rjust(scale + 1, "0")
        body = digits[: len(digits) - scale] + "." + digits[-scale:] if scale else digits
        return (("-" if unscaled < 0 else "") + body).encode()

    return st.builds(text, st.integers(-(10**22), 10**22) | st.integers(-(2**63), 2**63), st.sampled_from([0, 2, 4]))


TEXTS = st.one_of(
    st.integers(-(2**64), 2**64).map(lambda n: str(n).encode()),
    st.text(max_size=12).map(str.encode),
    st.binary(max_size=12),
    st.uuids().map(lambda u: str(u).encode()),
    st.uuids().map(lambda u: str(u).upper().encode()),
    st.sampled_from(
        [b"t", b"f", b"", b"-", b"NaN", b"Infinity", b"infinity", b"-0", b"007", b".5", b"-.50", b"1.", b"1e3"]
    ),
    _timestamptz_texts(),
    _numeric_texts(),
)


CLOCK = 1_700_000_000_123_456_789
