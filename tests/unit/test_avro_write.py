"""Compiled Avro writers: random schemas of the subset ``avro_schema`` emits, and random data, must give
exactly fastavro's bytes; the Avro serializer's records are the same with and without them."""

from __future__ import annotations

import io
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cdc.sink.avro as avro_module
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import ChangeEvent, Column, Op, TableSchema, TruncateEvent, change_event
from cdc.lsn import Lsn
from cdc.sink.avro import _RENDERED, AvroSerializer, AvroSettings, _write, _Writer
from cdc.sink.avro_write import Encoded, Unsupported, compile_writer, write_long
from cdc.sink.errors import SerializationError

PRIMITIVES: dict[str, st.SearchStrategy[Any]] = {
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "bytes": st.binary(max_size=300),
    "string": st.text(max_size=300),
}


@st.composite
def schema_and_datum(draw: st.DrawFn, depth: int = 0, names: list[int] | None = None) -> tuple[Any, Any]:
    names = names if names is not None else [0]
    kinds = ["primitive", "union", "array"] + (["record"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "primitive":
        name = draw(st.sampled_from(sorted(PRIMITIVES)))
        annotated = draw(st.booleans())
        schema: Any = {"type": name, "connect.name": "x"} if annotated else name
        return schema, draw(PRIMITIVES[name])
    if kind == "union":
        inner, value = draw(schema_and_datum(depth + 1, names))
        if isinstance(inner, list):  # no union directly inside a union
            return inner, value
        null_first = draw(st.booleans())
        chosen = None if draw(st.booleans()) else value
        return (["null", inner] if null_first else [inner, "null"]), chosen
    if kind == "array":
        item = draw(st.sampled_from(sorted(PRIMITIVES)))
        values = draw(st.lists(st.one_of(st.none(), PRIMITIVES[item]), max_size=5))
        return {"type": "array", "items": ["null", item]}, values
    names[0] += 1
    record: dict[str, Any] = {"type": "record", "name": f"R{names[0]}", "namespace": "ns.sub", "fields": []}
    datum: dict[str, Any] = {}
    for i in range(draw(st.integers(0, 5))):
        field_schema, field_value = draw(schema_and_datum(depth + 1, names))
        record["fields"].append({"name": f"f{i}", "type": field_schema})
        datum[f"f{i}"] = field_value
    return record, datum


def fastavro_bytes(schema: Any, datum: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), datum)
    return buffer.getvalue()


@settings(max_examples=300, deadline=None)
@given(schema_and_datum())
def test_compiled_writers_write_fastavros_bytes(case: tuple[Any, Any]) -> None:
    schema, datum = case
    if not isinstance(schema, dict) or schema.get("type") != "record":
        schema = {"type": "record", "name": "Top", "fields": [{"name": "v", "type": schema}]}
        datum = {"v": datum}
    write, _ = compile_writer(schema)
    assert write(datum) == fastavro_bytes(schema, datum)


@given(st.integers(-(2**63), 2**63 - 1))
def test_longs_are_zigzag_varints(n: int) -> None:
    assert write_long(n) == fastavro_bytes("long", n)


# Every length a varint can have and every chunk boundary of the table-driven writer, on both sides
# and for both signs (zig-zag: -n lands next to n), up to the ends of the long range.
_EDGES = sorted(
    {s * (2**b + d) // 2 for b in range(1, 65) for d in (-1, 0, 1) for s in (1, -1)} | {-(2**63), 2**63 - 1}
)


@pytest.mark.parametrize("n", [n for n in _EDGES if -(2**63) <= n < 2**63])
def test_longs_at_every_varint_length_and_chunk_boundary(n: int) -> None:
    assert write_long(n) == fastavro_bytes("long", n)


@pytest.mark.parametrize("n", [2**63, -(2**63) - 1, 2**64])
def test_a_long_outside_64_bits_is_refused(n: int) -> None:
    with pytest.raises(OverflowError, match="does not fit an Avro long"):
        write_long(n)


def test_a_record_referenced_by_name_and_an_encoded_field() -> None:
    inner = {"type": "record", "name": "Row", "namespace": "t", "fields": [{"name": "a", "type": "int"}]}
    schema = {
        "type": "record",
        "name": "Envelope",
        "namespace": "t",
        "fields": [{"name": "before", "type": ["null", inner]}, {"name": "after", "type": ["null", "t.Row"]}],
    }
    write, fields = compile_writer(schema)
    datum = {"before": ("t.Row", {"a": 1}), "after": {"a": -2}}
    assert write(datum) == fastavro_bytes(schema, datum)
    spliced = {"before": Encoded(b"\x02\x02", {"a": 1}), "after": {"a": -2}}
    assert write(spliced) == fastavro_bytes(schema, datum)
    assert [name for name, _ in fields["t.Row"]] == ["a"]


@pytest.mark.parametrize(
    ("schema", "datum"),
    [("int", 2**31), ("long", 2**63), ("string", b"bytes"), ("boolean", 1), ("bytes", "text"), (["null", "int"], "x")],
)
def test_a_datum_that_does_not_fit_raises_so_the_caller_asks_fastavro(schema: Any, datum: Any) -> None:
    write, _ = compile_writer({"type": "record", "name": "R", "fields": [{"name": "v", "type": schema}]})
    with pytest.raises((TypeError, ValueError, OverflowError)):
        write({"v": datum})


def test_constructs_outside_the_subset_are_refused_at_compile_time() -> None:
    for schema in (
        {"type": "map", "values": "int"},
        {"type": "enum", "name": "E", "symbols": ["A"]},
        ["int", "string"],
    ):
        with pytest.raises(Unsupported):
            compile_writer({"type": "record", "name": "R", "fields": [{"name": "v", "type": schema}]})


# -- the serializer, with and without compiled writers ------------------------------------------------

TYPES = {t.name: t for t in BUILTIN_TYPES.values()}


class Registry:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def register(self, subject: str, schema: Any, source: str | None = None) -> int:
        return self.ids.setdefault(subject, len(self.ids) + 1)


def table() -> TableSchema:
    columns = (
        Column("id", TYPES["int8"], -1, key=True, nullable=False),
        Column("name", TYPES["text"], -1),
        Column("amount", TYPES["numeric"], ((12 << 16) | 2) + 4),
        Column("ratio", TYPES["float8"], -1),
        Column("flag", TYPES["bool"], -1),
        Column("at", TYPES["timestamptz"], -1),
        Column("day", TYPES["date"], -1),
        Column("tags", TYPES["_text"], -1),
        Column("blob", TYPES["bytea"], -1),
    )
    return TableSchema("public", "things", columns, 16384)


def serializer() -> AvroSerializer:
    return AvroSerializer(
        AvroSettings(topic_prefix="p", database="db"),
        lambda topic: 2,
        Registry(),
        clock_ns=lambda: 1_700_000_000_123_456_789,
    )


def test_the_serializers_records_are_the_same_without_compiled_writers(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = table()
    row = {
        "id": 7,
        "name": 'é "x"',
        "amount": Decimal("-12.50"),
        "ratio": 0.1,
        "flag": True,
        "at": 1_700_000_000_000_001,
        "day": 19_000,
        "tags": ["a", None, ""],
        "blob": b"\x00\xff",
    }
    empty = dict.fromkeys(row) | {"id": 8}
    events: list[ChangeEvent | TruncateEvent] = [
        change_event(Op.CREATE, schema, None, row, Lsn(100), Lsn(90), 5, 1, 1_700_000_000_000_000, False, frozenset()),
        change_event(
            Op.UPDATE, schema, None, empty, Lsn(100), Lsn(95), 5, 2, 1_700_000_000_000_000, False, frozenset()
        ),
        change_event(
            Op.UPDATE,
            schema,
            {"id": 7},
            row | {"id": 9},
            Lsn(200),
            Lsn(190),
            6,
            1,
            1_700_000_000_000_001,
            False,
            frozenset(),
        ),
        change_event(
            Op.DELETE, schema, {"id": 9}, None, Lsn(200), Lsn(195), 6, 2, 1_700_000_000_000_001, False, frozenset()
        ),
        change_event(Op.READ, schema, None, row, Lsn(50), Lsn(50), None, 1, 1_700_000_000_000_000, True, frozenset()),
        TruncateEvent((schema,), False, False, Lsn(300), Lsn(290), 7, 1, 1_700_000_000_000_002),
    ]
    compiled = serializer()
    fast = [compiled.records(e) for e in events]
    assert all(w.write is not None for w in (compiled.plan(schema).key, compiled.plan(schema).value) if w is not None)
    assert compiled.plan(schema).write_envelope is not None  # change events went through the envelope's own writer

    def unsupported(schema: Any) -> Any:
        raise Unsupported("off for the comparison")

    monkeypatch.setattr(avro_module, "compile_writer", unsupported)
    reference = serializer()  # fastavro only, the source block as a dict
    assert reference._source_fields is None
    assert fast == [reference.records(e) for e in events]


def test_the_fastavro_fallback_writes_spliced_fields_from_their_datum() -> None:
    # A datum the compiled writer refuses (a bool where a long goes; fastavro writes it as 1) sends the
    # whole envelope to fastavro, which gets the spliced source block's dict from its Encoded.
    inner = {"type": "record", "name": "Source", "fields": [{"name": "lsn", "type": "long"}]}
    schema = {
        "type": "record",
        "name": "E",
        "fields": [{"name": "source", "type": inner}, {"name": "n", "type": "long"}],
    }
    write, _ = compile_writer(schema)
    writer = _Writer(schema, fastavro.parse_schema(schema), b"\x00\x00\x00\x00\x01", "s", 1, write, {})
    made: list[int] = []

    def make() -> dict[str, int]:
        made.append(1)
        return {"lsn": 5}

    data = _write(writer, {"source": Encoded(write_long(5), make=make), "n": True}, "an envelope")
    assert data == b"\x00\x00\x00\x00\x01" + fastavro_bytes(schema, {"source": {"lsn": 5}, "n": 1})
    assert made == [1]
    assert _write(writer, {"source": Encoded(write_long(5), make=make), "n": 2}, "an envelope") == (
        b"\x00\x00\x00\x00\x01" + write_long(5) + write_long(2)
    )
    assert made == [1]  # the compiled writer splices without making the dict


def test_a_rendered_row_that_reaches_the_fastavro_fallback_is_an_error_not_a_null() -> None:
    row = {"type": "record", "name": "Row", "fields": [{"name": "a", "type": "int"}]}
    schema = {
        "type": "record",
        "name": "E",
        "fields": [{"name": "after", "type": ["null", row]}, {"name": "n", "type": "long"}],
    }
    write, _ = compile_writer(schema)
    writer = _Writer(schema, fastavro.parse_schema(schema), b"\x00\x00\x00\x00\x01", "s", 1, write, {})
    datum = {"after": ("Row", Encoded(b"\x02", _RENDERED)), "n": True}  # n sends it to fastavro
    with pytest.raises(SerializationError, match="rendered by the decoder"):
        _write(writer, datum, "an envelope")


def test_rendered_rows_through_the_envelope_writer_are_fastavros_records_of_the_typed_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cdc.decoder.changes import ChangeDecoder
    from cdc.render.codec import TableRenderer
    from cdc.sink.rendering import RenderedRow
    from tests.support.accounts import COLUMNS, TABLES, feed
    from tests.support.pgoutput import begin, delete, insert, relation, tuple_data, update

    row = tuple_data(b"7", b'100% "sure"', b"-1.50", b"0.1")
    payloads = (
        relation(columns=COLUMNS),
        begin(),
        insert(16384, row),
        update(16384, row, key=tuple_data(b"6", None, None, None)),
        delete(16384, old=row),
    )
    compiled = serializer()
    rendered = feed(ChangeDecoder(TABLES, {}, renderer=TableRenderer(compiled.row_rendering)), *payloads)
    assert type(rendered[0].after) is RenderedRow and type(rendered[1].before) is RenderedRow
    fast = [compiled.records(e) for e in rendered]
    assert compiled.plan(rendered[0].table).write_envelope is not None

    def unsupported(schema: Any) -> Any:
        raise Unsupported("off for the comparison")

    monkeypatch.setattr(avro_module, "compile_writer", unsupported)
    reference = serializer()
    assert fast == [reference.records(e) for e in feed(ChangeDecoder(TABLES, {}), *payloads)]
