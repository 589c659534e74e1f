"""Rendering pgoutput column text straight to JSON: bytes in, the typed path's bytes out.

Each direct renderer must return exactly what orjson writes for the serializer's encoding of
the value the decoder's converter makes of the same text, and must decline (ValueError) what it
does not cover. ``tests/integration/test_render_json.py`` checks whole records from a real server.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.pgoutput import UNCHANGED
from cdc.decoder.types import BUILTIN_TYPES, converter_for
from cdc.render.codec import TableRenderer
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.rendering import RenderedRow
from cdc.sink.rendering_json import _direct_renderer
from cdc.sink.typemap import TypeOptions, column_schema
from tests.support.accounts import COLUMNS, TABLES, feed, numeric_typmod
from tests.support.pgoutput import begin, delete, insert, relation, tuple_data, update

TYPES = {t.name: t for t in BUILTIN_TYPES.values()}
PRECISE = TypeOptions("precise", "adaptive", "numeric")


def typed_json(type_name: str, modifier: int, text: bytes) -> bytes:
    pg_type = TYPES[type_name]
    value = converter_for(pg_type, modifier)(text)
    encode = column_schema(pg_type, modifier, PRECISE, False, "column").encode
    return orjson.dumps(value if encode is None else encode(value))


def render(type_name: str, modifier: int, text: bytes) -> bytes:
    renderer = _direct_renderer(TYPES[type_name], modifier, PRECISE)
    assert renderer is not None
    return renderer(text)


@given(st.integers(-(2**63), 2**63 - 1), st.sampled_from(["int2", "int4", "int8", "oid"]))
def test_integers_render_as_their_text(n: int, type_name: str) -> None:
    text = str(n).encode()
    assert render(type_name, -1, text) == typed_json(type_name, -1, text)


@given(
    st.text(st.characters(blacklist_categories=["Cs"])),
    st.sampled_from(["text", "varchar", "bpchar", "name", "jsonb"]),
)
def test_strings_render_as_orjson_writes_them(s: str, type_name: str) -> None:
    text = s.encode()
    assert render(type_name, -1, text) == typed_json(type_name, -1, text)


@given(st.integers(-(10**17), 10**17), st.integers(0, 6))
def test_fixed_scale_numerics_render_as_base64_twos_complement(unscaled: int, scale: int) -> None:
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    text = ("-" if unscaled < 0 else "") + (digits[: len(digits) - scale] + "." + digits[-scale:] if scale else digits)
    modifier = numeric_typmod(18, scale)
    assert render("numeric", modifier, text.encode()) == typed_json("numeric", modifier, text.encode())


@given(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)),
    st.integers(0, 6),
)
def test_utc_timestamps_render_as_zoned_timestamps_at_the_columns_precision(moment: datetime, precision: int) -> None:
    micro = moment.microsecond - moment.microsecond % 10 ** (6 - precision)  # what the column keeps
    fraction = f"{micro:06d}".rstrip("0")
    text = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}" + ("." + fraction if fraction else "") + "+00"
    )
    assert render("timestamptz", precision, text.encode()) == typed_json("timestamptz", precision, text.encode())
    assert render("timestamptz", -1, text.encode()) == typed_json("timestamptz", -1, text.encode())


@given(st.uuids())
def test_uuids_render_as_their_canonical_text(u: Any) -> None:
    text = str(u).encode()
    assert render("uuid", -1, text) == typed_json("uuid", -1, text)


@pytest.mark.parametrize(
    ("type_name", "modifier", "text"),
    [
        ("numeric", numeric_typmod(12, 2), b"NaN"),
        ("numeric", numeric_typmod(12, 2), b"1.5"),  # not the column's scale: never sent, still declined
        ("numeric", numeric_typmod(12, 0), b"1.5"),
        ("timestamptz", -1, b"infinity"),
        ("timestamptz", -1, b"-infinity"),
        ("timestamptz", -1, b"0044-03-15 12:00:00+00 BC"),
        ("timestamptz", -1, b"10000-01-01 00:00:00+00"),
        ("timestamptz", -1, b"2024-01-31 12:00:00+02"),  # a session not in UTC
        ("uuid", -1, b"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),
        ("bool", -1, b"true"),
        ("int8", -1, b"1e3"),
        ("text", -1, b"\xff\xfe"),  # not UTF-8: the typed path names the column
    ],
)
def test_text_a_renderer_does_not_cover_is_declined(type_name: str, modifier: int, text: bytes) -> None:
    with pytest.raises(ValueError):
        render(type_name, modifier, text)


def test_types_without_a_direct_renderer_are_rendered_from_their_typed_value() -> None:
    for name in ("float8", "date", "timestamp", "interval", "bytea", "money", "timetz"):
        assert _direct_renderer(TYPES[name], -1, PRECISE) is None, name
    assert _direct_renderer(TYPES["numeric"], -1, PRECISE) is None  # variable scale: a struct
    assert (
        _direct_renderer(TYPES["numeric"], numeric_typmod(12, 2), TypeOptions("string", "adaptive", "numeric")) is None
    )


# -- through the decoder ------------------------------------------------------------------------------


def serializer() -> JsonSerializer:
    return JsonSerializer(JsonSettings(topic_prefix="p", database="db"), lambda topic: 1, clock_ns=lambda: 1)


def test_a_rendered_row_serializes_as_the_typed_row_and_keeps_its_typed_key() -> None:
    ser = serializer()
    row = tuple_data(b"7", b'100% "sure"', b"-1.50", b"0.1")
    payloads = (
        relation(columns=COLUMNS),
        begin(),
        insert(16384, row),
        update(16384, row, key=tuple_data(b"6", None, None, None)),
    )
    fast = feed(ChangeDecoder(TABLES, {}, renderer=TableRenderer(ser.row_rendering)), *payloads)
    typed = feed(ChangeDecoder(TABLES, {}), *payloads)
    assert [type(e.after) for e in fast] == [RenderedRow, RenderedRow]
    assert type(fast[1].before) is RenderedRow
    assert [ser.records(e) for e in fast] == [serializer().records(e) for e in typed]
    assert fast[0].key() == {"id": 7} and fast[1].old_key() == {"id": 6}
    after = fast[0].after
    assert isinstance(after, RenderedRow)
    assert after.data == b'{"id":7,"we%ird \\"name":"100% \\"sure\\"","amount":"/2o=","f":0.1}'
    assert after.key_data == b'{"id":7}'


@pytest.mark.parametrize("schemas", [False, True])
def test_rendered_records_of_every_op_are_the_typed_records(schemas: bool) -> None:
    # Rendered rows go through the envelope template, typed rows through orjson: the same bytes, for
    # each op, with and without the Kafka Connect schema block.
    def ser() -> JsonSerializer:
        return JsonSerializer(
            JsonSettings(topic_prefix="p", database="db", schemas_enable=schemas),
            lambda topic: 1,
            clock_ns=lambda: 1_700_000_000_123_456_789,
        )

    row = tuple_data(b"7", b'100% "sure" \xc3\xa9', b"-1.50", None)
    payloads = (
        relation(columns=COLUMNS),
        begin(),
        insert(16384, row),
        update(16384, row),
        update(16384, row, old=tuple_data(b"7", b"x", b"1.00", b"2.5")),
        update(16384, tuple_data(b"8", None, None, None), key=tuple_data(b"7", None, None, None)),
        delete(16384, old=row),
    )
    rendering = ser()
    fast = feed(ChangeDecoder(TABLES, {}, renderer=TableRenderer(rendering.row_rendering)), *payloads)
    assert any(type(e.after) is RenderedRow for e in fast) and any(type(e.before) is RenderedRow for e in fast)
    typed = feed(ChangeDecoder(TABLES, {}), *payloads)
    records = [rendering.records(e) for e in fast]
    assert records == [ser().records(e) for e in typed]
    for value in (r.value for rs in records for r in rs if r.value is not None):
        body = orjson.loads(value)
        assert (body["payload"] if schemas else body)["ts_us"] == 1_700_000_000_123_456


def test_an_unchanged_toasted_value_takes_the_typed_path() -> None:
    ser = serializer()
    payloads = (relation(columns=COLUMNS), begin(), update(16384, tuple_data(b"7", UNCHANGED, b"1.00", None)))
    (event,) = feed(ChangeDecoder(TABLES, {}, renderer=TableRenderer(ser.row_rendering)), *payloads)
    assert isinstance(event.after, dict) and event.unchanged == {'we%ird "name'}


def test_set_renderer_applies_to_tables_already_announced() -> None:
    ser = serializer()
    decoder = ChangeDecoder(TABLES, {}, renderer=TableRenderer(ser.row_rendering))
    row = insert(16384, tuple_data(b"1", b"a", b"1.00", None))
    (first,) = feed(decoder, relation(columns=COLUMNS), begin(), row)
    decoder.set_renderer(TableRenderer(lambda table: None))  # e.g. the table gained a column policy at a reload
    (second,) = feed(decoder, row)
    decoder.set_renderer(TableRenderer(ser.row_rendering))
    (third,) = feed(decoder, row)
    assert [type(e.after) for e in (first, second, third)] == [RenderedRow, dict, RenderedRow]


def test_a_rendered_row_has_typed_values_for_its_key_columns_only() -> None:
    row = RenderedRow(b'{"id":1,"name":"a"}', {"id": 1}, b'{"id":1}')
    assert row["id"] == 1 and row.get("id") == 1 and "id" in row
    for read in (lambda: row["name"], lambda: row.get("name"), lambda: "name" in row):
        with pytest.raises(TypeError, match="no typed value for column 'name'"):
            read()


def test_an_old_key_tuple_of_an_identity_wider_than_the_key_takes_the_typed_path() -> None:
    # REPLICA IDENTITY USING INDEX on (id, name) while the configured key is id: the 'K' tuple carries
    # name too, which the typed path leaves out of the before row; a rendered row would keep it.
    columns = (
        (1, "id", 20, -1),
        (1, 'we%ird "name', 25, -1),
        (0, "amount", 1700, numeric_typmod(12, 2)),
        (0, "f", 701, -1),
    )
    payloads = (
        relation(columns=columns, identity=b"i"),
        begin(),
        delete(16384, key=tuple_data(b"7", b"x", None, None)),
    )
    ser = serializer()
    (fast,) = feed(ChangeDecoder(TABLES, {}, renderer=TableRenderer(ser.row_rendering)), *payloads)
    (typed,) = feed(ChangeDecoder(TABLES, {}), *payloads)
    assert fast.before == {"id": 7}
    assert ser.records(fast) == serializer().records(typed)
