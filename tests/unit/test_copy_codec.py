"""The row codec's COPY entry (the snapshot's): a ``COPY ... TO STDOUT`` text line in, the ``RenderedRow`` that
the same values' pgoutput tuple gives out, byte for byte, in the compiled codec (``RowCodec.copy_row``) and
the reference (``cdc.render.rows.render_copy_parser``); and the snapshot's record of the line
(``copy_record``), that row and key between the record's constant parts, in both.

Every type case of ``tests/unit/test_codec.py`` as a value column and as the key, escaped as COPY escapes
it, in JSON with and without the schema block and in Avro; then hypothesis over rows of the natively written
types (texts with tabs, newlines and backslashes among them) and over malformed lines (a field too many or
too few, a dangling backslash): both give the same row or both decline (or raise a ValueError, which
sends the line to the snapshot's typed path as a decline does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.compiled import FORCE_REFERENCE_ENV
from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.rows import Decline
from cdc.decoder.types import parser_for
from cdc.event import TableInfo, TableSchema
from cdc.lsn import Lsn
from cdc.render import codec
from cdc.render.codec import TableRenderer
from cdc.render.rows import render_copy_parser, render_copy_record, render_parser
from cdc.sink.rendering import RenderedRow, RowRendering
from cdc.snapshot.copytext import unescape
from tests.support.codec_cases import CASES, DIRECT, OIDS, TEXTS, TYPES, serializers
from tests.support.pgoutput import relation, tuple_data

try:
    from cdc.render import _compiled
except ImportError:  # pragma: no cover
    if os.environ.get(FORCE_REFERENCE_ENV, "") in ("", "0"):
        raise
    pytest.skip(f"{FORCE_REFERENCE_ENV} is set and the compiled codec is not built", allow_module_level=True)

_ESCAPES = {0x5C: b"\\\\", 0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x0B: b"\\v"}


def copy_field(text: bytes | None) -> bytes:
    """A value as ``COPY ... TO STDOUT`` (text format) writes it."""
    if text is None:
        return b"\\N"
    return b"".join(_ESCAPES.get(c, bytes((c,))) for c in text)


def copy_line(*texts: bytes | None) -> bytes:
    return b"\t".join(copy_field(t) for t in texts) + b"\n"


def schema_of(table: TableInfo, columns: Any, new_serializer: Callable[[], Any]) -> tuple[TableSchema, Any]:
    ser = new_serializer()
    decoder = ChangeDecoder(
        {f"{table.schema}.{table.name}": table},
        OIDS,
        renderer=TableRenderer(ser.row_rendering, make_parser=render_parser),
    )
    decoder.feed(relation(name=table.name, columns=columns), Lsn(1))
    return decoder.table(16384), ser


def outcome(parse: Callable[[bytes], Any], line: bytes) -> Any:
    try:
        row = parse(line)
    except Decline:
        return "declined"
    except Exception as exc:
        return (type(exc).__name__, str(exc))
    assert type(row) is RenderedRow
    return (row.data, row.key_data, repr(row.key))  # repr: a NaN key equals itself


_PARTS = (b'{"k":', b"}", b'{"after":', b',"op":"r"}')  # key_head, key_end, value_head, value_end


def record_outcome(record: Callable[..., tuple[bytes, bytes]], line: bytes | memoryview) -> Any:
    """``copy_record``'s result on the line, or how it failed (as ``outcome``)."""
    try:
        return record(line, *_PARTS)
    except Decline:
        return "declined"
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def as_record(got: Any) -> Any:
    """The record ``copy_record`` makes of ``outcome``'s row: its key and row between the parts."""
    if not (type(got) is tuple and len(got) == 3):
        return got
    return _PARTS[0] + got[1] + _PARTS[1], _PARTS[2] + got[0] + _PARTS[3]


def from_tuple(rendering: RowRendering, parsers: Any, texts: tuple[bytes | None, ...]) -> Any:
    """What the streaming path's compiled codec makes of the same values in a pgoutput tuple."""
    parse = codec.compiled_parser(rendering, parsers, row_codec=_compiled.RowCodec)
    return outcome(lambda data: parse(data, 0)[0], tuple_data(*texts))


def check(table: TableInfo, columns: Any, rows: list[tuple[bytes | None, ...]]) -> int:
    """Each row as a COPY line through both COPY parsers and, as a pgoutput tuple, through the stream's codec,
    in every format: the same outcome. Returns how many rows rendered in JSON."""
    rendered = 0
    for label, new in serializers():
        schema, ser = schema_of(table, columns, new)
        rendering = ser.row_rendering(schema)
        if rendering is None:
            continue
        parsers = [parser_for(c.type) for c in schema.columns]
        compiled = codec.compiled_copy_parser(rendering, parsers, unescape, row_codec=_compiled.RowCodec)
        reference = render_copy_parser(rendering, parsers, unescape)
        compiled_record = codec.compiled_copy_record(rendering, parsers, unescape, row_codec=_compiled.RowCodec)
        reference_record = render_copy_record(rendering, parsers, unescape)
        for texts in rows:
            line = copy_line(*texts)
            got = outcome(compiled, line)
            assert got == outcome(reference, line), (label, line)
            assert got == outcome(compiled, line[:-1]) == outcome(compiled, memoryview(line)), (label, line)  # type: ignore[arg-type]  # COPY hands memoryviews
            assert got == from_tuple(rendering, parsers, texts), (label, line)
            record = record_outcome(compiled_record, memoryview(line))
            assert record == record_outcome(reference_record, line) == as_record(got), (label, line)
            rendered += label == "json" and got != "declined" and type(got) is tuple and len(got) == 3
    return rendered


@pytest.mark.parametrize(("type_name", "modifier", "text"), CASES)
def test_a_copy_line_renders_as_its_pgoutput_tuple_for_every_type(type_name: str, modifier: int, text: bytes) -> None:
    oid = TYPES[type_name].oid
    table = TableInfo("public", "t", 16384, "d", ("id",), ("id", "c"), frozenset({"id"}))
    check(table, ((1, "id", 20, -1), (0, "c", oid, modifier)), [(b"1", text), (b"2", None)])
    keyed = TableInfo("public", "t", 16384, "d", ("c",), ("c", "note"), frozenset({"c"}))
    check(keyed, ((1, "c", oid, modifier), (0, "note", 25, -1)), [(text, b"n"), (text, None)])


def test_texts_with_every_escape_and_the_null_marker_as_text_render_as_in_the_stream() -> None:
    table = TableInfo("public", "t", 16384, "d", ("id",), ("id", "c", "j"), frozenset({"id"}))
    columns = ((1, "id", 20, -1), (0, "c", 25, -1), (0, "j", 3802, -1))
    texts = [
        b"a\tb",
        b"line\nnext\r",
        b"back\\slash",
        b"\\N",
        b"\x08\x0c\x0b",
        "caf\u00e9 \\ \u65e5".encode(),
        b"",
        b"\\",
    ]
    rows: list[tuple[bytes | None, ...]] = [
        (b"%d" % i, t, b'{"k": "%s"}' % t.replace(b"\\", b"\\\\")) for i, t in enumerate(texts)
    ]
    assert check(table, columns, rows) == len(rows)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(DIRECT), st.one_of(TEXTS, st.none())), min_size=1, max_size=6), st.integers(0, 5)
)
def test_random_rows_of_the_direct_types_render_as_their_tuples(cols: list[Any], key_at: int) -> None:
    key_at = key_at % len(cols)
    names = tuple(f"c{i}" for i in range(len(cols)))
    columns = tuple((int(i == key_at), names[i], TYPES[t].oid, m) for i, ((t, m), _) in enumerate(cols))
    table = TableInfo("public", "h", 16384, "d", (names[key_at],), names, frozenset({names[key_at]}))
    check(table, columns, [tuple(v for _, v in cols)])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_malformed_lines_fail_or_decline_alike(data: st.DataObject) -> None:
    columns = ((1, "id", 20, -1), (0, "name", 25, -1), (0, "amount", 1700, 786438), (0, "u", 2950, -1))
    table = TableInfo("public", "m", 16384, "d", ("id",), ("id", "name", "amount", "u"), frozenset({"id"}))
    schema, ser = schema_of(table, columns, serializers()[0][1])
    rendering = ser.row_rendering(schema)
    assert rendering is not None
    parsers = [parser_for(c.type) for c in schema.columns]
    good = copy_line(b"7", b"x\ty", b"1.50", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    line = bytearray(good[: data.draw(st.integers(0, len(good)))] + data.draw(st.binary(max_size=6)))
    for _ in range(data.draw(st.integers(0, 3))):
        if line:
            line[data.draw(st.integers(0, len(line) - 1))] = data.draw(st.sampled_from(b"\t\\N\n0a-.x"))
    compiled = codec.compiled_copy_parser(rendering, parsers, unescape, row_codec=_compiled.RowCodec)
    reference = render_copy_parser(rendering, parsers, unescape)

    def declined(parse: Callable[[bytes], Any]) -> Any:  # either way the worker's typed path takes the line
        try:
            row = parse(bytes(line))
        except (Decline, ValueError):
            return "declined"
        return (row.data, row.key_data, repr(row.key))

    assert declined(compiled) == declined(reference)

    def record_declined(record: Callable[..., tuple[bytes, bytes]]) -> Any:
        try:
            return record(bytes(line), *_PARTS)
        except (Decline, ValueError):
            return "declined"

    compiled_record = codec.compiled_copy_record(rendering, parsers, unescape, row_codec=_compiled.RowCodec)
    assert record_declined(compiled_record) == record_declined(render_copy_record(rendering, parsers, unescape))
    assert record_declined(compiled_record) == as_record(declined(compiled))


def test_the_chooser_gives_the_compiled_copy_parser_unless_the_reference_is_forced() -> None:
    table = TableInfo("public", "t", 16384, "d", ("id",), ("id",), frozenset({"id"}))
    schema, ser = schema_of(table, ((1, "id", 20, -1),), serializers()[0][1])
    parse = codec.copy_parser(ser.row_rendering(schema), [int], unescape)
    forced = os.environ.get(FORCE_REFERENCE_ENV, "") not in ("", "0")
    assert (type(getattr(parse, "__self__", None)).__name__ == "RowCodec") is not forced
    assert parse(b"5\n").data == b'{"id":5}'
    record = codec.copy_record(ser.row_rendering(schema), [int], unescape)
    assert (type(getattr(record, "__self__", None)).__name__ == "RowCodec") is not forced
    assert record(b"5\n", *_PARTS) == (b'{"k":{"id":5}}', b'{"after":{"id":5},"op":"r"}')
