"""The compiled row codec (``cdc.render._compiled``) against the reference (``cdc.render.rows.render_parser``):
the same pgoutput bytes in, the same records out, byte for byte.

Every type of the decoder's type tests (``tests/support/type_cases.py``) in the text form the server
sends it, as a value column and as the key, through every op (insert, update with and without the old
row, a key change, delete by key and by old row), with NULLs and unchanged-TOAST placeholders, in JSON
with and without the schema block and in Avro; then edge values of the types the compiled codec writes
itself, and hypothesis for the rest, malformed tuples included.

The compiled module must be there: without it these tests fail (collection error), unless
``CDC_PURE_PYTHON`` is set, the run of the suite on the reference, where they are skipped as such.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.compiled import BUILD_FIX, FORCE_REFERENCE_ENV, Choice, load, log_choice
from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.pgoutput import UNCHANGED, Unchanged
from cdc.decoder.rows import Decline, RowParser
from cdc.event import ChangeEvent, TableInfo
from cdc.lsn import Lsn
from cdc.render import codec
from cdc.render.codec import TableRenderer
from cdc.render.rows import render_parser
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.rendering import RenderedRow, RowRendering
from tests.support.accounts import numeric_typmod
from tests.support.codec_cases import (
    CASES,
    DIRECT,
    OIDS,
    TEXTS,
    TYPES,
    serializers,
)
from tests.support.pgoutput import begin, delete, insert, relation, tuple_data, update

try:
    from cdc.render import _compiled
except ImportError as exc:  # pragma: no cover - the reference's run, or a broken build
    if os.environ.get(FORCE_REFERENCE_ENV, "") in ("", "0"):
        raise ImportError(
            f"the compiled row codec is not built ({exc}): build it (pip install -e ., or "
            "python -m Cython.Build.Cythonize -i src/cdc/render/_compiled.pyx), or set CDC_PURE_PYTHON=1 "
            "to run the suite on the reference alone"
        ) from exc
    pytest.skip(f"{FORCE_REFERENCE_ENV} is set and the compiled codec is not built", allow_module_level=True)

compiled_parser = functools.partial(codec.compiled_parser, row_codec=_compiled.RowCodec)  # whatever the chooser says


Value = bytes | None | Unchanged
Make = Callable[[RowRendering, Sequence[Callable[[bytes], Any]]], RowParser]


def test_the_cases_cover_every_type_of_the_decoders_type_tests() -> None:
    from tests.support.type_cases import CASES as TYPE_CASES

    named = {t.split("(")[0].strip().strip('"') for _, t, _, _ in TYPE_CASES}
    aliases = {"char": "bpchar", '"char"': "char", "mood[]": "_mood", "posint[]": "_posint", "int4[][]": "_int4"}
    wanted = {aliases.get(n, n) for n in named}
    wanted = {"_" + n[:-2] if n.endswith("[]") else n for n in wanted}
    assert wanted - {name for name, _, _ in CASES} == set()


def run(
    make: Make | None,
    new_serializer: Callable[[], Any],
    table: TableInfo,
    columns: Any,
    identity: bytes,
    payloads: Sequence[bytes],
) -> tuple[list[Any], list[type], list[bool]]:
    """The records (or the error) of each payload after the Relation, the row types, and whether each relation's
    parser is the compiled codec."""
    ser = new_serializer()
    renderer = None if make is None else TableRenderer(ser.row_rendering, make_parser=make)
    decoder = ChangeDecoder({table.schema + "." + table.name: table}, OIDS, renderer=renderer)
    decoder.feed(relation(name=table.name, identity=identity, columns=columns), Lsn(0x100))
    decoder.feed(begin(), Lsn(0x101))
    out: list[Any] = []
    rows: list[type] = []
    for i, payload in enumerate(payloads):
        try:
            events = list(decoder.feed(payload, Lsn(0x200 + i)))
            out.append([ser.records(e) for e in events if isinstance(e, ChangeEvent)])
            rows += [
                type(r) for e in events if isinstance(e, ChangeEvent) for r in (e.before, e.after) if r is not None
            ]
        except Exception as exc:
            out.append((type(exc).__name__, str(exc)))
    compiled = [isinstance(rel.parse, _compiled.RowCodec) for rel in decoder.tx.relations.values()]
    return out, rows, compiled


def compare(table: TableInfo, columns: Any, identity: bytes, payloads: Sequence[bytes]) -> dict[str, int]:
    """Both codecs over ``payloads`` in every format: the same records; the rendered rows seen, by format."""
    rendered = {}
    for label, new in serializers():
        reference, ref_rows, ref_compiled = run(render_parser, new, table, columns, identity, payloads)
        compiled, rows, is_compiled = run(compiled_parser, new, table, columns, identity, payloads)
        assert compiled == reference, label
        assert rows == ref_rows, label
        assert ref_compiled == [False] and is_compiled == [True], label  # the codec under test did run
        rendered[label] = rows.count(RenderedRow)
    return rendered


def columns_of(type_name: str, modifier: int, key: bool) -> tuple[tuple[int, str, int, int], ...]:
    oid = TYPES[type_name].oid
    if key:  # the case's column is the key
        return ((1, "c", oid, modifier), (0, "note", 25, -1))
    return ((1, "id", 20, -1), (0, "c", oid, modifier))


@pytest.mark.parametrize("not_null", [False, True])
@pytest.mark.parametrize(("type_name", "modifier", "text"), CASES)
def test_a_value_column_of_every_type_renders_the_same_in_both(
    type_name: str, modifier: int, text: bytes, not_null: bool
) -> None:
    table = TableInfo("public", "t", 16384, "d", ("id",), ("id", "c"), frozenset({"id", "c"} if not_null else {"id"}))
    row = tuple_data(b"1", text)
    payloads = [
        insert(16384, row),
        insert(16384, tuple_data(b"2", None)),
        update(16384, row),
        update(16384, tuple_data(b"1", UNCHANGED)),  # an unchanged TOASTed value: the typed path, in both
        update(16384, tuple_data(b"3", text), key=tuple_data(b"1", None)),  # a key change
        delete(16384, key=tuple_data(b"3", None)),
    ]
    compare(table, columns_of(type_name, modifier, False), b"d", payloads)
    full = [
        update(16384, row, old=tuple_data(b"1", text)),
        update(16384, tuple_data(b"1", UNCHANGED), old=row),
        delete(16384, old=row),
    ]
    compare(table, columns_of(type_name, modifier, False), b"f", full)


@pytest.mark.parametrize(("type_name", "modifier", "text"), CASES)
def test_a_key_column_of_every_type_renders_the_same_in_both(type_name: str, modifier: int, text: bytes) -> None:
    table = TableInfo("public", "t", 16384, "d", ("c",), ("c", "note"), frozenset({"c"}))
    payloads = [
        insert(16384, tuple_data(text, b"n")),
        insert(16384, tuple_data(None, b"n")),  # a NULL key: an error, the same one
        update(16384, tuple_data(text, UNCHANGED)),
        update(16384, tuple_data(text, b"m"), key=tuple_data(b"other", None)),
        delete(16384, key=tuple_data(text, None)),
        delete(16384, old=tuple_data(text, b"m")),
    ]
    compare(table, columns_of(type_name, modifier, True), b"d", payloads)


def test_a_wide_row_of_every_type_renders_the_same_in_both() -> None:
    types = [(f"c{i}", name, modifier, text) for i, (name, modifier, text) in enumerate(CASES)]
    names = ("id", *(n for n, _, _, _ in types))
    table = TableInfo("public", "wide", 16384, "d", ("id",), names, frozenset({"id"}))
    columns = ((1, "id", 20, -1), *((0, n, TYPES[t].oid, m) for n, t, m, _ in types))
    good = [text for _, name, _, text in types]
    payloads = [
        insert(16384, tuple_data(b"1", *good)),
        insert(16384, tuple_data(b"2", *(None for _ in types))),
        update(16384, tuple_data(b"1", *(UNCHANGED if i % 3 == 0 else t for i, t in enumerate(good)))),
        delete(16384, key=tuple_data(b"1", *(None for _ in types))),
    ]
    compare(table, columns, b"d", payloads)
    # The same row without the texts no codec renders (they send the whole row to the typed path): rendered.
    renders = [
        i
        for i, (_, name, modifier, text) in enumerate(types)
        if compare(
            TableInfo("public", "one", 16384, "d", ("id",), ("id", "c"), frozenset({"id"})),
            columns_of(name, modifier, False),
            b"d",
            [insert(16384, tuple_data(b"1", text))],
        )["json"]
        > 0
    ]
    assert len(renders) > 60
    kept = [types[i] for i in renders]
    table = TableInfo("public", "wide", 16384, "d", ("id",), ("id", *(n for n, _, _, _ in kept)), frozenset({"id"}))
    columns = ((1, "id", 20, -1), *((0, n, TYPES[t].oid, m) for n, t, m, _ in kept))
    rows = [
        insert(16384, tuple_data(b"1", *(t for _, _, _, t in kept))),
        delete(16384, old=tuple_data(b"1", *(t for _, _, _, t in kept))),
    ]
    assert compare(table, columns, b"d", rows)["json"] == 2


# -- hypothesis: the natively written types' texts, valid and not, and malformed tuples ------------------


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(DIRECT), st.one_of(TEXTS, st.none(), st.just(UNCHANGED))), min_size=1, max_size=6
    ),
    st.integers(0, 5),
    st.sampled_from([0, 1, 2]),
)
def test_random_rows_of_the_direct_types_render_the_same_in_both(cols: list[Any], key_at: int, fmt: int) -> None:
    key_at = key_at % len(cols)
    names = tuple(f"c{i}" for i in range(len(cols)))
    columns = tuple((int(i == key_at), names[i], TYPES[t].oid, m) for i, ((t, m), _) in enumerate(cols))
    table = TableInfo("public", "h", 16384, "d", (names[key_at],), names, frozenset({names[key_at]}))
    values: list[Value] = [v for _, v in cols]
    key_only: list[Value] = [v if i == key_at else None for i, v in enumerate(values)]
    payloads = [
        insert(16384, tuple_data(*values)),
        delete(16384, key=tuple_data(*key_only)),
        update(16384, tuple_data(*values), old=tuple_data(*values)),
    ]
    label, new = serializers()[fmt]
    reference = run(render_parser, new, table, columns, b"d", payloads)
    compiled = run(compiled_parser, new, table, columns, b"d", payloads)
    assert compiled[:2] == reference[:2], label
    assert reference[2] == [False] and compiled[2] == [True]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_malformed_tuples_fail_or_decline_alike(data: st.DataObject) -> None:
    # The parsers alone, over tuple bytes cut, extended or overwritten: both return the same row and
    # position, or both decline (an error the decoder sends to its general path).
    ser = JsonSerializer(JsonSettings(topic_prefix="p", database="db"), lambda topic: 1)
    names = ("id", "name", "amount", "at", "u")
    table = TableInfo("public", "m", 16384, "d", ("id",), names, frozenset({"id"}))
    columns = (
        (1, "id", 20, -1),
        (0, "name", 25, -1),
        (0, "amount", 1700, numeric_typmod(12, 2)),
        (0, "at", 1184, -1),
        (0, "u", 2950, -1),
    )
    decoder = ChangeDecoder(
        {"public.m": table}, {}, renderer=TableRenderer(ser.row_rendering, make_parser=render_parser)
    )
    decoder.feed(relation(name="m", columns=columns), Lsn(1))
    schema = decoder.table(16384)
    rendering = ser.row_rendering(schema)
    assert rendering is not None
    from cdc.decoder.types import parser_for

    parsers = [parser_for(c.type) for c in schema.columns]
    good = tuple_data(b"7", b"x", b"1.50", b"2024-01-31 10:00:00+00", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    buf = bytearray(b"I" + good)
    cut = data.draw(st.integers(1, len(buf)))
    buf = buf[:cut] + data.draw(st.binary(max_size=6))
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(buf) - 1)) if buf else 0
        if buf:
            buf[at] = data.draw(st.integers(0, 255))
    payload = bytes(buf)

    def outcome(parse: RowParser) -> Any:
        try:
            row, end = parse(payload, 1)
        except (Decline, IndexError, struct.error, ValueError, ArithmeticError, KeyError):
            return "declined"
        if end > len(payload):  # the reference reads a length past the end as a short slice: the caller declines
            return "declined"
        assert isinstance(row, RenderedRow)
        return (row.data, row.key_data, row.key, end)

    assert outcome(codec.compiled_parser(rendering, parsers, row_codec=_compiled.RowCodec)) == outcome(
        render_parser(rendering, parsers)
    )


def test_the_chooser_names_the_codec_it_runs() -> None:
    forced = os.environ.get(FORCE_REFERENCE_ENV, "") not in ("", "0")
    assert codec.IMPLEMENTATION == ("reference" if forced else "compiled")
    assert codec.format_pieces(b'{"a%%b":%b,"c":%b}') == (b'{"a%b":', b',"c":', b"}")
    assert codec.format_pieces(b"%b%b") == (b"", b"", b"")


def test_the_environment_variable_forces_the_reference_and_the_start_up_log_says_which_runs() -> None:
    import subprocess
    import sys

    script = "from cdc.render import codec; print(codec.IMPLEMENTATION)"  # what the chooser made of the variable
    env = {**os.environ, FORCE_REFERENCE_ENV: "1"}
    forced = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    env.pop(FORCE_REFERENCE_ENV)
    chosen = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert (forced.stdout.strip(), chosen.stdout.strip()) == ("reference", "compiled")


def test_a_missing_compiled_codec_is_a_warning_that_names_the_fix() -> None:
    from structlog.testing import capture_logs

    missing = Choice(False, {}, {"row_codec": "cdc.render._compiled is not built: no module"})
    with capture_logs() as logs:
        log_choice(choice=missing)
    assert [(e["event"], e["log_level"], e["implementation"]) for e in logs] == [
        ("row_codec_not_compiled", "warning", "reference")
    ]
    assert logs[0]["fix"] == BUILD_FIX and "C compiler" in BUILD_FIX
    assert (logs[0]["decoder"], logs[0]["delivery"], logs[0]["snapshot"]) == ("reference", "reference", "reference")


def test_the_start_up_line_names_each_compiled_extension_once() -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        log_choice(choice=load(force_reference=False))
        log_choice(choice=load(force_reference=True))
    compiled, forced = logs
    assert (compiled["event"], compiled["implementation"], compiled["module"]) == (
        "row_codec",
        "compiled",
        _compiled.__file__,
    )
    assert {compiled[k] for k in ("json_envelope", "avro_envelope", "decoder", "delivery", "snapshot")} == {"compiled"}
    assert (forced["event"], forced["log_level"], forced["implementation"]) == ("row_codec", "info", "reference")
    assert forced["reason"] == f"{FORCE_REFERENCE_ENV} is set"


def test_a_buffer_other_than_bytes_parses_as_bytes_do() -> None:
    ser = JsonSerializer(JsonSettings(topic_prefix="p", database="db"), lambda topic: 1)
    table = TableInfo("public", "b", 16384, "d", ("id",), ("id", "c"), frozenset({"id"}))
    decoder = ChangeDecoder(
        {"public.b": table}, {}, renderer=TableRenderer(ser.row_rendering, make_parser=render_parser)
    )
    decoder.feed(relation(name="b", columns=((1, "id", 20, -1), (0, "c", 25, -1))), Lsn(1))
    rendering = ser.row_rendering(decoder.table(16384))
    assert rendering is not None
    parsers: list[Callable[[bytes], Any]] = [int, bytes.decode]
    data = b"I" + tuple_data(b"5", b"text")
    compiled = codec.compiled_parser(rendering, parsers, row_codec=_compiled.RowCodec)
    expected = render_parser(rendering, parsers)(data, 1)
    assert compiled(data, 1) == compiled(memoryview(data), 1) == compiled(bytearray(data), 1) == expected  # type: ignore[arg-type]  # other buffers are the point
