"""Fuzzing the pgoutput codec: whatever the bytes, it decodes or raises DecodeError, nothing else."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.decoder import pgoutput as pg
from cdc.decoder.pgoutput import UNCHANGED, DecodeError, decode

DATA = Path(__file__).resolve().parent.parent / "data" / "pgoutput"


def load_captured() -> list[tuple[bytes, bool]]:
    manifest = json.loads((DATA / "manifest.json").read_text())
    return [((DATA / e["file"]).read_bytes(), bool(e["in_stream"])) for e in manifest["files"]]


# Valid payloads the server did not send here (a PG15 capture): protocol 4's long
# Stream Abort, an Insert mixing a binary and an unchanged column, an in-stream
# Type with empty names.
PARALLEL_STREAM_ABORT = b"A" + struct.pack(">IIQq", 7, 8, 0x1_0000_0000, 1_000_000)
SYNTHETIC: list[tuple[bytes, bool]] = [
    (PARALLEL_STREAM_ABORT, False),
    (
        b"I" + struct.pack(">I", 16384) + b"N" + struct.pack(">H", 2) + b"b" + struct.pack(">i", 4) + bytes(4) + b"u",
        False,
    ),
    (b"Y" + struct.pack(">II", 5, 16400) + b"\x00\x00", True),
]

CORPUS = load_captured() + SYNTHETIC
TYPE_BYTES = b"BCORYIUDTMSEcAbPKrp"


def decode_or_reject(payload: bytes, in_stream: bool) -> pg.Message | None:
    """Decode, or return None on DecodeError; any other exception fails the test."""
    try:
        return decode(payload, in_stream=in_stream)
    except DecodeError as error:
        assert str(error).startswith(f"{error.message_type} message at offset {error.offset}: ")
        assert 0 <= error.offset <= len(payload)
        return None


def test_the_corpus_is_valid() -> None:
    for payload, in_stream in CORPUS:
        assert decode_or_reject(payload, in_stream) is not None, payload


def test_every_truncation_of_a_valid_payload_raises_decode_error() -> None:
    for payload, in_stream in CORPUS:
        for cut in range(len(payload)):
            if payload == PARALLEL_STREAM_ABORT and cut == 9:
                continue  # the protocol 2 Stream Abort is a prefix of the protocol 4 one
            with pytest.raises(DecodeError):
                decode(payload[:cut], in_stream=in_stream)


def test_every_valid_payload_with_a_trailing_byte_raises_decode_error() -> None:
    for payload, in_stream in CORPUS:
        with pytest.raises(DecodeError):
            decode(payload + b"\x00", in_stream=in_stream)


@settings(max_examples=2000)
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_decode_or_raise_decode_error(payload: bytes, in_stream: bool) -> None:
    decode_or_reject(payload, in_stream)


@settings(max_examples=2000)
@given(st.sampled_from(list(TYPE_BYTES)), st.binary(max_size=120), st.booleans())
def test_random_bodies_of_every_message_type_decode_or_raise_decode_error(
    tag: int, body: bytes, in_stream: bool
) -> None:
    decode_or_reject(bytes([tag]) + body, in_stream)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, bool]:
    payload, in_stream = draw(st.sampled_from(CORPUS))
    data = bytearray(payload)
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        match draw(st.sampled_from(["flip", "insert", "delete"])):
            case "flip" if data:
                data[position] = draw(st.integers(0, 255))
            case "insert":
                data[position:position] = draw(st.binary(min_size=1, max_size=4))
            case "delete" if data:
                del data[position]
            case _:
                pass
    return bytes(data), draw(st.booleans()) if draw(st.booleans()) else in_stream


@settings(max_examples=3000)
@given(mutated())
def test_mutated_valid_payloads_decode_or_raise_decode_error(case: tuple[bytes, bool]) -> None:
    decode_or_reject(*case)


# --- round trips of what the encoder can say --------------------------------------------------------

column_values = st.one_of(
    st.none(),
    st.just(UNCHANGED),
    st.tuples(st.booleans(), st.binary(max_size=40)),  # (binary?, value)
)


def encode_tuple(columns: list[None | pg.Unchanged | tuple[bool, bytes]]) -> bytes:
    out = [struct.pack(">H", len(columns))]
    for column in columns:
        if column is None:
            out.append(b"n")
        elif column is UNCHANGED:
            out.append(b"u")
        else:
            assert isinstance(column, tuple)
            binary, value = column
            out.append((b"b" if binary else b"t") + struct.pack(">i", len(value)) + value)
    return b"".join(out)


@given(st.lists(column_values, max_size=40), st.lists(column_values, max_size=5), st.integers(0, 2**32 - 1))
def test_update_tuples_round_trip(
    new: list[None | pg.Unchanged | tuple[bool, bytes]],
    key: list[None | pg.Unchanged | tuple[bool, bytes]],
    relation_id: int,
) -> None:
    payload = b"U" + struct.pack(">I", relation_id) + b"K" + encode_tuple(key) + b"N" + encode_tuple(new)

    message = decode(payload)

    def expected(columns: list[None | pg.Unchanged | tuple[bool, bytes]]) -> pg.TupleData:
        values = tuple(c[1] if isinstance(c, tuple) else c for c in columns)
        mask = sum(1 << i for i, c in enumerate(columns) if isinstance(c, tuple) and c[0])
        return pg.TupleData(values, mask)

    assert message == pg.Update(None, relation_id, expected(key), None, expected(new))


names = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=30)


@given(
    names,
    names,
    st.lists(
        st.tuples(st.integers(0, 255), names, st.integers(0, 2**32 - 1), st.integers(-(2**31), 2**31 - 1)), max_size=8
    ),
)
def test_relation_names_round_trip_through_utf8(
    namespace: str, name: str, columns: list[tuple[int, str, int, int]]
) -> None:
    body = [
        b"R",
        struct.pack(">I", 1),
        namespace.encode() + b"\x00",
        name.encode() + b"\x00",
        b"f",
        struct.pack(">H", len(columns)),
    ]
    for flags, column, type_oid, modifier in columns:
        body += [bytes([flags]), column.encode() + b"\x00", struct.pack(">Ii", type_oid, modifier)]

    message = decode(b"".join(body))

    assert message == pg.Relation(
        None,
        1,
        namespace,
        name,
        pg.ReplicaIdentity.FULL,
        tuple(pg.Column(c, oid, mod, bool(flags & 1)) for flags, c, oid, mod in columns),
    )
