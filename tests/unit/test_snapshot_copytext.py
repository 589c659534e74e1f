"""cdc.snapshot.copytext: COPY text lines in, the stream decoder's values out."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.decoder.types import BUILTIN_TYPES, converter_for
from cdc.event import Column, PgType, TypeKind
from cdc.snapshot.copytext import CopyFormatError, row_parser, split_line, unescape
from cdc.values import Infinity

BY_NAME = {t.name: t for t in BUILTIN_TYPES.values()}


def copy_escape(text: bytes) -> bytes:
    """What COPY ... TO STDOUT (text format) writes for a value (CopyAttributeOutText)."""
    out = bytearray()
    for byte in text:
        c = bytes((byte,))
        if c == b"\\":
            out += b"\\\\"
        elif c in b"\b\f\n\r\t\v":
            out += b"\\" + {b"\b": b"b", b"\f": b"f", b"\n": b"n", b"\r": b"r", b"\t": b"t", b"\v": b"v"}[c]
        else:
            out += c
    return bytes(out)


def columns(*spec: tuple[str, str]) -> list[Column]:
    return [Column(name, BY_NAME[type_name], key=i == 0) for i, (name, type_name) in enumerate(spec)]


def test_unescape_turns_every_copy_escape_back_into_its_byte() -> None:
    assert unescape(b"a\\tb\\nc\\\\d\\re\\bf\\fg\\vh") == b"a\tb\nc\\d\re\bf\fg\vh"


def test_unescape_reads_octal_and_hex_escapes_and_a_backslash_before_any_other_character() -> None:
    assert unescape(b"\\101\\x42\\7\\q") == b"AB\x07q"


def test_unescape_refuses_a_field_ending_in_a_lone_backslash() -> None:
    with pytest.raises(CopyFormatError):
        unescape(b"abc\\")
    assert unescape(b"abc\\\\") == b"abc\\"


@given(st.binary(max_size=200))
def test_any_value_escaped_as_copy_does_unescapes_to_itself(value: bytes) -> None:
    assert unescape(copy_escape(value)) == value


def test_split_line_gives_none_for_null_and_unescaped_fields_otherwise() -> None:
    assert split_line(b"1\t\\N\ta\\tb\t\n") == [b"1", None, b"a\tb", b""]


def test_a_row_parses_to_the_values_the_stream_decoder_gives_for_the_same_text() -> None:
    cols = columns(
        ("id", "int8"),
        ("price", "numeric"),
        ("seen", "timestamptz"),
        ("name", "text"),
        ("blob", "bytea"),
        ("ok", "bool"),
        ("tags", "_text"),
        ("day", "date"),
    )
    texts = [
        b"42",
        b"12.50",
        b"2024-05-01 12:34:56.5+02",
        b"tab\there \\ back",
        b"\\x00ff",
        b"t",
        b'{"a b","c\\\\d",NULL}',
        b"infinity",
    ]
    line = b"\t".join(copy_escape(t) for t in texts)
    row = row_parser(cols, where="public.t")(line)
    expected = {c.name: converter_for(c.type)(t) for c, t in zip(cols, texts, strict=True)}
    assert row == expected
    assert row["price"] == Decimal("12.50") and row["blob"] == b"\x00\xff" and row["day"] is Infinity.POSITIVE
    assert row["name"] == "tab\there \\ back" and row["tags"] == ["a b", "c\\d", None]


def test_null_fields_become_none_in_every_column() -> None:
    cols = columns(("id", "int4"), ("note", "text"), ("at", "timestamp"))
    assert row_parser(cols)(b"1\t\\N\t\\N") == {"id": 1, "note": None, "at": None}


def test_a_text_value_spelling_backslash_n_is_not_null() -> None:
    cols = columns(("id", "int4"), ("note", "text"))
    assert row_parser(cols)(b"1\t\\\\N") == {"id": 1, "note": "\\N"}


def test_unknown_types_and_domains_travel_as_the_stream_would_carry_them() -> None:
    unknown = PgType(99999, "tsvector_like", TypeKind.UNKNOWN, "public")
    domain = PgType(99998, "positive", TypeKind.DOMAIN, "public", element=BY_NAME["int4"])
    cols = [Column("id", domain, key=True), Column("doc", unknown)]
    assert row_parser(cols)(b"7\t'a' 'b'") == {"id": 7, "doc": "'a' 'b'"}


def test_a_line_with_the_wrong_number_of_fields_is_an_error_naming_the_table() -> None:
    with pytest.raises(CopyFormatError, match="public.t: a COPY line has 3 fields, expected 2"):
        row_parser(columns(("id", "int4"), ("n", "int4")), where="public.t")(b"1\t2\t3")


def test_a_value_that_does_not_convert_is_an_error_naming_the_column() -> None:
    with pytest.raises(CopyFormatError, match="column amount of public.t: malformed numeric"):
        row_parser(columns(("id", "int4"), ("amount", "numeric")), where="public.t")(b"1\tabc")


def test_column_names_that_are_not_identifiers_are_kept_verbatim() -> None:
    cols = [Column("id", BY_NAME["int4"], key=True), Column('we\'ird "name"\n', BY_NAME["text"])]
    assert row_parser(cols)(b"1\tx") == {"id": 1, 'we\'ird "name"\n': "x"}
