"""The pgoutput codec: bytes in, values out.

Payloads are built with the small encoder of ``tests/support/pgoutput.py`` (the codec has none: the
service only ever reads pgoutput), and the payloads captured from a real
server by ``scripts/capture_pgoutput.py`` (``tests/data/pgoutput``) are
decoded and checked against what the server reported when capturing them.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import struct
import typing
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from cdc.decoder import pgoutput as pg
from cdc.decoder.pgoutput import UNCHANGED, DecodeError, decode
from cdc.lsn import Lsn
from tests.support.pgoutput import (  # noqa: F401 - the encoder, and the constants its defaults use
    END_LSN,
    LSN,
    PG_EPOCH_US,
    SUBXID,
    TS,
    TS_UNIX,
    XID,
    Binary,
    begin,
    begin_prepare,
    commit,
    cstring,
    delete,
    i32,
    i64,
    insert,
    logical_message,
    origin,
    prepare_like,
    relation,
    rollback_prepared,
    stream_abort,
    stream_commit,
    stream_start,
    stream_xid,
    truncate,
    tuple_data,
    type_message,
    u8,
    u16,
    u32,
    u64,
    update,
)

# --- transaction boundaries ----------------------------------------------------------------------


def test_begin_carries_final_lsn_commit_time_since_unix_epoch_and_xid() -> None:
    message = decode(begin())

    assert message == pg.Begin(final_lsn=Lsn(LSN), commit_ts_us=TS_UNIX, xid=XID)
    assert isinstance(message.final_lsn, Lsn)
    assert str(message.final_lsn) == "16/B374D848"


def test_commit_carries_commit_lsn_end_lsn_and_commit_time() -> None:
    assert decode(commit()) == pg.Commit(commit_lsn=Lsn(LSN), end_lsn=Lsn(END_LSN), commit_ts_us=TS_UNIX)


def test_timestamps_before_2000_come_out_as_unix_microseconds() -> None:
    message = decode(commit(ts=-PG_EPOCH_US))

    assert isinstance(message, pg.Commit)
    assert message.commit_ts_us == 0


def test_origin_carries_origin_lsn_and_name() -> None:
    assert decode(origin(name="node-ä")) == pg.Origin(origin_lsn=Lsn(LSN), name="node-ä")


# --- schema ------------------------------------------------------------------------------------


def test_relation_lists_columns_with_key_flag_type_oid_and_modifier() -> None:
    message = decode(relation())

    assert message == pg.Relation(
        xid=None,
        relation_id=16384,
        namespace="public",
        name="accounts",
        replica_identity=pg.ReplicaIdentity.DEFAULT,
        columns=(
            pg.Column(name="id", type_oid=23, type_modifier=-1, is_key=True),
            pg.Column(name="name", type_oid=1043, type_modifier=68, is_key=False),
        ),
    )


def test_relation_in_stream_carries_xid_before_relation_id() -> None:
    message = decode(relation(xid=XID), in_stream=True)

    assert isinstance(message, pg.Relation)
    assert (message.xid, message.relation_id, message.name) == (XID, 16384, "accounts")


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        (b"d", pg.ReplicaIdentity.DEFAULT),
        (b"n", pg.ReplicaIdentity.NOTHING),
        (b"f", pg.ReplicaIdentity.FULL),
        (b"i", pg.ReplicaIdentity.INDEX),
    ],
)
def test_relation_reports_each_replica_identity(identity: bytes, expected: pg.ReplicaIdentity) -> None:
    message = decode(relation(identity=identity))

    assert isinstance(message, pg.Relation)
    assert message.replica_identity is expected
    assert message.replica_identity == identity.decode()


def test_relation_without_columns_is_valid() -> None:
    message = decode(relation(columns=()))

    assert isinstance(message, pg.Relation)
    assert message.columns == ()


def test_relation_ignores_unknown_column_flag_bits() -> None:
    message = decode(relation(columns=((0b110, "a", 25, -1), (0b111, "b", 25, -1))))

    assert isinstance(message, pg.Relation)
    assert [c.is_key for c in message.columns] == [False, True]


def test_type_carries_oid_namespace_and_name() -> None:
    assert decode(type_message()) == pg.Type(xid=None, type_oid=16400, namespace="public", name="mood")


def test_type_in_stream_carries_xid() -> None:
    assert decode(type_message(xid=XID), in_stream=True) == pg.Type(
        xid=XID, type_oid=16400, namespace="public", name="mood"
    )


# --- rows --------------------------------------------------------------------------------------


def test_insert_carries_text_values_and_nulls_in_column_order() -> None:
    message = decode(insert(16384, tuple_data(b"1", None, b"alice", b"")))

    assert message == pg.Insert(
        xid=None, relation_id=16384, new=pg.TupleData(values=(b"1", None, b"alice", b""), binary_mask=0)
    )


def test_insert_in_stream_carries_xid() -> None:
    message = decode(insert(16384, tuple_data(b"1"), xid=SUBXID), in_stream=True)

    assert message == pg.Insert(xid=SUBXID, relation_id=16384, new=pg.TupleData((b"1",), 0))


def test_insert_keeps_binary_columns_apart_from_text_ones() -> None:
    message = decode(insert(1, tuple_data(Binary(b"\x00\x00\x00\x07"), b"seven", None, Binary(b"\x01"))))

    assert isinstance(message, pg.Insert)
    assert message.new.values == (b"\x00\x00\x00\x07", b"seven", None, b"\x01")
    assert message.new.binary_mask == 0b1001
    assert [message.new.is_binary(i) for i in range(4)] == [True, False, False, True]


def test_insert_of_a_row_without_columns_has_an_empty_tuple() -> None:
    message = decode(insert(1, tuple_data()))

    assert isinstance(message, pg.Insert)
    assert message.new == pg.TupleData((), 0)


def test_insert_values_are_plain_bytes_even_from_a_memoryview() -> None:
    buffer = bytearray(insert(1, tuple_data(b"abc")))
    message = decode(memoryview(buffer))
    buffer[:] = b"\xff" * len(buffer)  # the receive buffer is reused for the next frame

    assert isinstance(message, pg.Insert)
    assert message.new.values == (b"abc",)
    assert type(message.new.values[0]) is bytes


def test_decode_accepts_a_memoryview_slice_of_an_xlogdata_frame() -> None:
    frame = b"w" + bytes(24) + begin()

    assert decode(memoryview(frame)[25:]) == decode(begin())


def test_decode_reads_the_bytes_of_a_memoryview_of_another_format() -> None:
    payload = type_message(namespace="ns", name="abcdefghijklmno")  # 24 bytes: six 4-byte items
    as_words = memoryview(payload).cast("I")

    assert decode(as_words) == decode(payload) == pg.Type(None, 16400, "ns", "abcdefghijklmno")


def test_update_without_old_tuple_carries_only_the_new_tuple() -> None:
    message = decode(update(16384, tuple_data(b"1", b"bob")))

    assert message == pg.Update(
        xid=None, relation_id=16384, old_key=None, old=None, new=pg.TupleData((b"1", b"bob"), 0)
    )


def test_update_with_old_key_carries_key_tuple_then_new_tuple() -> None:
    message = decode(update(16384, tuple_data(b"2", b"bob"), key=tuple_data(b"1", None)))

    assert message == pg.Update(
        xid=None,
        relation_id=16384,
        old_key=pg.TupleData((b"1", None), 0),
        old=None,
        new=pg.TupleData((b"2", b"bob"), 0),
    )


def test_update_with_old_tuple_carries_the_full_old_row_then_new_tuple() -> None:
    message = decode(update(16384, tuple_data(b"1", b"bob"), old=tuple_data(b"1", b"alice")))

    assert message == pg.Update(
        xid=None,
        relation_id=16384,
        old_key=None,
        old=pg.TupleData((b"1", b"alice"), 0),
        new=pg.TupleData((b"1", b"bob"), 0),
    )


def test_update_marks_unchanged_toast_columns_with_the_sentinel() -> None:
    message = decode(update(16384, tuple_data(b"1", UNCHANGED, None)))

    assert isinstance(message, pg.Update)
    assert message.new.values == (b"1", UNCHANGED, None)
    assert message.new.values[1] is UNCHANGED


def test_update_in_stream_carries_xid() -> None:
    message = decode(update(7, tuple_data(b"2"), key=tuple_data(b"1"), xid=XID), in_stream=True)

    assert isinstance(message, pg.Update)
    assert (message.xid, message.relation_id) == (XID, 7)
    assert message.old_key == pg.TupleData((b"1",), 0)


def test_delete_with_old_key_carries_only_the_key_tuple() -> None:
    message = decode(delete(16384, key=tuple_data(b"1", None)))

    assert message == pg.Delete(xid=None, relation_id=16384, old_key=pg.TupleData((b"1", None), 0), old=None)


def test_delete_with_old_tuple_carries_the_full_old_row() -> None:
    message = decode(delete(16384, old=tuple_data(b"1", b"alice")))

    assert message == pg.Delete(xid=None, relation_id=16384, old_key=None, old=pg.TupleData((b"1", b"alice"), 0))


def test_delete_in_stream_carries_xid() -> None:
    message = decode(delete(16384, old=tuple_data(b"1"), xid=XID), in_stream=True)

    assert isinstance(message, pg.Delete)
    assert message.xid == XID


@pytest.mark.parametrize(
    ("options", "cascade", "restart_identity"),
    [(0, False, False), (1, True, False), (2, False, True), (3, True, True)],
)
def test_truncate_reports_cascade_and_restart_identity_flags(
    options: int, cascade: bool, restart_identity: bool
) -> None:
    message = decode(truncate((16384, 16390), options))

    assert message == pg.Truncate(
        xid=None, relation_ids=(16384, 16390), cascade=cascade, restart_identity=restart_identity
    )


def test_truncate_in_stream_carries_xid() -> None:
    message = decode(truncate((1,), xid=XID), in_stream=True)

    assert message == pg.Truncate(xid=XID, relation_ids=(1,), cascade=False, restart_identity=False)


def test_truncate_relation_ids_use_the_full_unsigned_oid_range() -> None:
    message = decode(truncate((0xFFFFFFFF,)))

    assert isinstance(message, pg.Truncate)
    assert message.relation_ids == (0xFFFFFFFF,)


# --- logical messages ------------------------------------------------------------------------------


def test_transactional_logical_message_carries_lsn_prefix_and_raw_content() -> None:
    message = decode(logical_message("outbox", b'{"a":1}\x00\xff'))

    assert message == pg.LogicalMessage(
        xid=None, transactional=True, lsn=Lsn(LSN), prefix="outbox", content=b'{"a":1}\x00\xff'
    )


def test_non_transactional_logical_message_says_so() -> None:
    message = decode(logical_message("heartbeat", b"", transactional=False))

    assert isinstance(message, pg.LogicalMessage)
    assert (message.transactional, message.content) == (False, b"")


def test_logical_message_in_stream_carries_xid() -> None:
    message = decode(logical_message("outbox", b"x", xid=XID), in_stream=True)

    assert isinstance(message, pg.LogicalMessage)
    assert (message.xid, message.prefix, message.content) == (XID, "outbox", b"x")


# --- streaming (protocol 2+) -----------------------------------------------------------------------


@pytest.mark.parametrize("first", [True, False])
def test_stream_start_carries_xid_and_whether_it_is_the_first_segment(first: bool) -> None:
    assert decode(stream_start(first=first)) == pg.StreamStart(xid=XID, first_segment=first)


def test_stream_stop_has_no_fields() -> None:
    message = decode(b"E", in_stream=True)

    assert message == pg.StreamStop()
    assert dataclasses.fields(message) == ()


def test_stream_commit_carries_xid_lsns_and_commit_time() -> None:
    assert decode(stream_commit()) == pg.StreamCommit(
        xid=XID, commit_lsn=Lsn(LSN), end_lsn=Lsn(END_LSN), commit_ts_us=TS_UNIX
    )


def test_stream_abort_of_protocol_2_has_no_abort_lsn_or_time() -> None:
    assert decode(stream_abort()) == pg.StreamAbort(xid=XID, subxid=SUBXID, abort_lsn=None, abort_ts_us=None)


def test_stream_abort_of_protocol_4_parallel_carries_abort_lsn_and_time() -> None:
    message = decode(stream_abort(abort_lsn=LSN))

    assert message == pg.StreamAbort(xid=XID, subxid=SUBXID, abort_lsn=Lsn(LSN), abort_ts_us=TS_UNIX)


# --- two-phase commit (protocol 3+) ------------------------------------------------------------------


def test_begin_prepare_carries_lsns_prepare_time_xid_and_gid() -> None:
    assert decode(begin_prepare("tx-é")) == pg.BeginPrepare(
        prepare_lsn=Lsn(LSN), end_lsn=Lsn(END_LSN), prepare_ts_us=TS_UNIX, xid=XID, gid="tx-é"
    )


def test_prepare_carries_lsns_prepare_time_xid_and_gid() -> None:
    assert decode(prepare_like(b"P")) == pg.Prepare(
        prepare_lsn=Lsn(LSN), end_lsn=Lsn(END_LSN), prepare_ts_us=TS_UNIX, xid=XID, gid="gid-1"
    )


def test_commit_prepared_at_top_level_is_not_taken_for_an_old_key_marker() -> None:
    assert decode(prepare_like(b"K")) == pg.CommitPrepared(
        commit_lsn=Lsn(LSN), end_lsn=Lsn(END_LSN), commit_ts_us=TS_UNIX, xid=XID, gid="gid-1"
    )


def test_rollback_prepared_carries_both_end_lsns_both_times_xid_and_gid() -> None:
    assert decode(rollback_prepared()) == pg.RollbackPrepared(
        prepare_end_lsn=Lsn(LSN),
        rollback_end_lsn=Lsn(END_LSN),
        prepare_ts_us=TS_UNIX,
        rollback_ts_us=TS_UNIX + 5,
        xid=XID,
        gid="gid-1",
    )


def test_stream_prepare_carries_lsns_prepare_time_xid_and_gid() -> None:
    assert decode(prepare_like(b"p", gid="")) == pg.StreamPrepare(
        prepare_lsn=Lsn(LSN), end_lsn=Lsn(END_LSN), prepare_ts_us=TS_UNIX, xid=XID, gid=""
    )


# --- values and types --------------------------------------------------------------------------


def test_unchanged_is_a_singleton_that_survives_pickling_and_reads_well() -> None:
    assert pickle.loads(pickle.dumps(UNCHANGED)) is UNCHANGED
    assert repr(UNCHANGED) == "UNCHANGED"
    assert UNCHANGED is not None and UNCHANGED != b"u"


def test_messages_are_frozen_and_slotted() -> None:
    message = decode(insert(1, tuple_data(b"1")))
    assert isinstance(message, pg.Insert)

    with pytest.raises(dataclasses.FrozenInstanceError):
        message.relation_id = 2  # type: ignore[misc]  # the write to a frozen field under test
    assert not hasattr(message, "__dict__")
    assert not hasattr(pg.TupleData((), 0), "__dict__")


def test_messages_compare_and_hash_by_value() -> None:
    assert decode(relation()) == decode(relation())
    assert hash(decode(insert(1, tuple_data(b"1", UNCHANGED)))) == hash(decode(insert(1, tuple_data(b"1", UNCHANGED))))


# --- malformed input -------------------------------------------------------------------------------


def test_decode_error_is_a_value_error_that_names_message_type_and_offset() -> None:
    with pytest.raises(DecodeError) as caught:
        decode(begin()[:-2])

    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.message_type, error.offset) == ("Begin", 19)
    assert str(error).startswith("Begin message at offset 19: truncated")


def test_decode_error_survives_pickling() -> None:
    error = DecodeError("Insert", 12, "unknown tuple column kind b'x' in column 0")
    copy = pickle.loads(pickle.dumps(error))

    assert (copy.message_type, copy.offset, str(copy)) == ("Insert", 12, str(error))


MALFORMED: list[tuple[str, bytes, bool, str, int, str]] = [
    # (case, payload, in_stream, message type named, offset, words in the reason)
    ("empty payload", b"", False, "empty", 0, "no message type"),
    ("unknown message type", b"Z\x00\x00", False, "unknown", 0, "unknown message type b'Z'"),
    ("truncated begin", begin()[:10], False, "Begin", 10, "truncated"),
    ("begin with trailing bytes", begin() + b"\x00", False, "Begin", 21, "1 trailing bytes"),
    ("commit with trailing bytes", commit() + b"xy", False, "Commit", 26, "2 trailing bytes"),
    ("stream stop with trailing byte", b"E\x00", True, "StreamStop", 1, "trailing"),
    ("stream start truncated", stream_start()[:5], False, "StreamStart", 5, "truncated"),
    (
        "stream abort between the two lengths",
        stream_abort() + b"\x00" * 8,
        False,
        "StreamAbort",
        9,
        "neither 9 (xid, subxid) nor 25",
    ),
    (
        "parallel stream abort with trailing bytes",
        stream_abort(abort_lsn=LSN) + b"\x00",
        False,
        "StreamAbort",
        25,
        "1 trailing bytes",
    ),
    ("stream abort truncated", stream_abort()[:6], False, "StreamAbort", 6, "truncated"),
    ("relation name without terminator", relation()[:14], False, "Relation", 12, "no NUL terminator"),
    (
        "relation namespace not utf-8",
        relation(namespace="p").replace(b"p\x00", b"\xff\x00", 1),
        False,
        "Relation",
        5,
        "not valid UTF-8",
    ),
    ("relation unknown replica identity", relation(identity=b"x"), False, "Relation", 21, "replica identity b'x'"),
    ("relation column truncated", relation()[:-3], False, "Relation", 42, "truncated column type"),
    (
        "relation column count beyond columns",
        relation(columns=())[:-2] + u16(5),
        False,
        "Relation",
        24,
        "truncated column flags",
    ),
    ("type name without terminator", type_message()[:-1], False, "Type", 12, "no NUL terminator"),
    ("origin truncated lsn", b"O\x00\x00", False, "Origin", 1, "truncated origin lsn"),
    ("insert without relation id", b"I\x00\x00", False, "Insert", 1, "truncated relation id"),
    ("in-stream insert without xid", b"I\x00\x00\x00\x01\x00", True, "Insert", 1, "truncated xid"),
    ("insert without tuple marker", b"I" + u32(1), False, "Insert", 5, "truncated tuple marker"),
    (
        "insert with old-key marker",
        b"I" + u32(1) + b"K" + tuple_data(b"1"),
        False,
        "Insert",
        5,
        "expected tuple marker b'N'",
    ),
    ("insert without column count", b"I" + u32(1) + b"N\x00", False, "Insert", 6, "truncated tuple data"),
    (
        "insert unknown tuple kind",
        insert(1, u16(2) + b"n" + b"x"),
        False,
        "Insert",
        9,
        "unknown tuple column kind b'x' in column 1",
    ),
    ("insert missing column", insert(1, tuple_data(b"1", b"2"))[:-6], False, "Insert", 14, "truncated tuple data"),
    (
        "insert column length beyond message",
        insert(1, u16(1) + b"t" + i32(10) + b"abc"),
        False,
        "Insert",
        9,
        "column 0 length 10 exceeds",
    ),
    ("insert negative column length", insert(1, u16(1) + b"t" + i32(-1)), False, "Insert", 9, "column 0 length -1"),
    ("insert truncated column length", insert(1, u16(1) + b"t\x00\x00"), False, "Insert", 8, "truncated tuple"),
    ("insert trailing garbage", insert(1, tuple_data(b"1")) + b"\x00", False, "Insert", 14, "1 trailing bytes"),
    (
        "insert in stream decoded as top level",
        insert(1, tuple_data(b"1"), xid=2),
        False,
        "Insert",
        5,
        "expected tuple marker b'N', got b'\\x00'",
    ),
    (
        "update with old key but no new tuple",
        b"U" + u32(1) + b"K" + tuple_data(b"1"),
        False,
        "Update",
        14,
        "truncated tuple marker",
    ),
    (
        "update with two old tuples",
        b"U" + u32(1) + b"K" + tuple_data(b"1") + b"O" + tuple_data(b"1"),
        False,
        "Update",
        14,
        "expected tuple marker b'N', got b'O'",
    ),
    ("update trailing garbage", update(1, tuple_data(b"1")) + b"N", False, "Update", 14, "trailing"),
    (
        "delete with new tuple marker",
        b"D" + u32(1) + b"N" + tuple_data(b"1"),
        False,
        "Delete",
        5,
        "expected tuple marker b'K' or b'O'",
    ),
    ("delete without tuple", b"D" + u32(1), False, "Delete", 5, "truncated tuple marker"),
    (
        "truncate count beyond message",
        b"T" + i32(1000) + u8(0) + u32(1),
        False,
        "Truncate",
        1,
        "relation count 1000 exceeds",
    ),
    ("truncate negative count", b"T" + i32(-1) + u8(0), False, "Truncate", 1, "relation count -1"),
    ("truncate trailing relation id", truncate((1,)) + u32(2), False, "Truncate", 10, "4 trailing bytes"),
    (
        "message content beyond payload",
        logical_message("p", b"abc")[:-1],
        False,
        "LogicalMessage",
        16,
        "content length 3 exceeds",
    ),
    (
        "message negative content length",
        logical_message("p", b"")[:-4] + i32(-5),
        False,
        "LogicalMessage",
        16,
        "content length -5",
    ),
    (
        "message prefix not utf-8",
        logical_message("p", b"").replace(b"p\x00", b"\xc3\x00"),
        False,
        "LogicalMessage",
        10,
        "prefix is not valid UTF-8",
    ),
    ("begin prepare gid without terminator", begin_prepare()[:-1], False, "BeginPrepare", 29, "gid has no NUL"),
    ("prepare truncated", prepare_like(b"P")[:20], False, "Prepare", 2, "truncated"),
    ("commit prepared trailing garbage", prepare_like(b"K") + b"\x00", False, "CommitPrepared", 36, "trailing"),
    ("rollback prepared truncated", rollback_prepared()[:3], False, "RollbackPrepared", 2, "truncated"),
    ("stream prepare empty after flags", b"p\x00", False, "StreamPrepare", 2, "truncated"),
]


@pytest.mark.parametrize(
    ("payload", "in_stream", "message_type", "offset", "reason"),
    [pytest.param(*case[1:], id=case[0]) for case in MALFORMED],
)
def test_malformed_payload_raises_decode_error_naming_type_and_offset(
    payload: bytes, in_stream: bool, message_type: str, offset: int, reason: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(payload, in_stream=in_stream)

    assert (caught.value.message_type, caught.value.offset) == (message_type, offset), str(caught.value)
    assert reason in str(caught.value)
    assert str(caught.value).startswith(f"{message_type} message at offset {offset}: ")


# --- payloads captured from a real server ----------------------------------------------------------

DATA = Path(__file__).resolve().parent.parent / "data" / "pgoutput"


@cache
def manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / "manifest.json").read_text())
    return loaded


def captured(step: str, kind: str, *, variant: str | None = None, slot: str | None = None) -> list[Any]:
    """Decode the captured payloads of one step and kind (in capture order)."""
    found = []
    for entry in manifest()["files"]:
        if (entry["step"], entry["kind"]) != (step, kind):
            continue
        if (variant is not None and entry["variant"] != variant) or (slot is not None and entry["slot"] != slot):
            continue
        found.append(decode((DATA / entry["file"]).read_bytes(), in_stream=entry["in_stream"]))
    assert found, f"no captured {kind} of step {step} ({variant=}, {slot=})"
    return found


def one(step: str, kind: str, *, variant: str | None = None, slot: str = "capture_v1") -> Any:
    messages = captured(step, kind, variant=variant, slot=slot)
    assert len(messages) == 1, messages
    return messages[0]


def relation_oid(name: str) -> int:
    oid: int = manifest()["relations"][f"capture.{name}"]
    return oid


def xid_of(step: str) -> int:
    xid: int = manifest()["xids"][step]
    return xid


def plausible_now_us(ts_us: int) -> bool:
    return 1_577_836_800_000_000 < ts_us < 4_102_444_800_000_000  # 2020 .. 2100


@pytest.mark.parametrize("entry", manifest()["files"], ids=lambda e: e["file"])
def test_every_captured_payload_decodes_to_the_kind_the_manifest_names(entry: dict[str, Any]) -> None:
    payload = (DATA / entry["file"]).read_bytes()

    message = decode(payload, in_stream=entry["in_stream"])

    assert type(message).__name__ == entry["kind"]
    assert decode(memoryview(payload), in_stream=entry["in_stream"]) == message


def test_captured_files_cover_every_message_kind_but_the_parallel_stream_abort() -> None:
    kinds = {entry["kind"] for entry in manifest()["files"]}
    two_phase = {"BeginPrepare", "Prepare", "CommitPrepared", "RollbackPrepared", "StreamPrepare"}
    every = {cls.__name__ for cls in typing.get_args(pg.Message)}

    missing = every - kinds - (set() if manifest()["gids"] else two_phase)
    assert missing == set()


def test_captured_transaction_begins_and_commits_at_the_same_lsn() -> None:
    started = one("insert_accounts", "Begin")
    committed = one("insert_accounts", "Commit")

    assert started.xid == xid_of("insert_accounts")
    assert started.final_lsn == committed.commit_lsn < committed.end_lsn
    assert started.commit_ts_us == committed.commit_ts_us
    assert plausible_now_us(started.commit_ts_us)


def test_captured_relation_describes_the_accounts_table() -> None:
    message = one("insert_accounts", "Relation")

    assert message == pg.Relation(
        xid=None,
        relation_id=relation_oid("accounts"),
        namespace="capture",
        name="accounts",
        replica_identity=pg.ReplicaIdentity.DEFAULT,
        columns=(
            pg.Column("id", 23, -1, is_key=True),
            pg.Column("name", 25, -1, is_key=False),
            pg.Column("balance", 1700, ((12 << 16) | 2) + 4, is_key=False),  # numeric(12, 2)
            pg.Column("active", 16, -1, is_key=False),
            pg.Column("opened", 1082, -1, is_key=False),
            pg.Column("note", 25, -1, is_key=False),
        ),
    )


def test_captured_inserts_carry_text_values_and_nulls() -> None:
    first, second = captured("insert_accounts", "Insert", slot="capture_v1")

    assert first == pg.Insert(
        None, relation_oid("accounts"), pg.TupleData((b"1", b"alice", b"100.50", b"t", b"2024-01-31", b"first"), 0)
    )
    assert second.new == pg.TupleData((b"2", b"bob", None, b"f", b"2024-02-29", None), 0)


def test_captured_update_without_key_change_has_no_old_tuple() -> None:
    message = one("update_no_key_change", "Update")

    assert (message.old_key, message.old) == (None, None)
    assert message.new.values[:3] == (b"1", b"alice", b"250.75")


def test_captured_update_of_the_key_sends_the_old_key_with_other_columns_null() -> None:
    message = one("update_key_change", "Update")

    assert message.old_key == pg.TupleData((b"2", None, None, None, None, None), 0)
    assert message.old is None
    assert message.new.values == (b"3", b"bob", None, b"f", b"2024-02-29", None)


def test_captured_delete_under_replica_identity_default_sends_the_key() -> None:
    message = one("delete_default", "Delete")

    assert message == pg.Delete(
        None, relation_oid("accounts"), pg.TupleData((b"3", None, None, None, None, None), 0), None
    )


def test_captured_relation_with_replica_identity_full_marks_every_column_as_key() -> None:
    message = one("insert_audit", "Relation")

    assert message.replica_identity is pg.ReplicaIdentity.FULL
    assert [(c.name, c.type_oid, c.is_key) for c in message.columns] == [
        ("id", 23, True),
        ("payload", 3802, True),
        ("at", 1184, True),
    ]


def test_captured_update_and_delete_under_replica_identity_full_send_the_old_row() -> None:
    updated = one("update_full", "Update")
    deleted = one("delete_full", "Delete")

    old_row = (b"10", b'{"a": 1}', b"2024-03-01 12:00:00+00")
    new_row = (b"10", b'{"a": 2}', b"2024-03-01 12:00:00+00")
    assert (updated.old_key, updated.old, updated.new) == (None, pg.TupleData(old_row, 0), pg.TupleData(new_row, 0))
    assert (deleted.old_key, deleted.old) == (None, pg.TupleData(new_row, 0))


def test_captured_enum_column_is_announced_by_a_type_message() -> None:
    type_info = one("insert_enum", "Type")
    table = one("insert_enum", "Relation")
    row = one("insert_enum", "Insert")

    assert type_info == pg.Type(None, manifest()["types"]["capture.mood"], "capture", "mood")
    assert table.columns[1] == pg.Column("mood", type_info.type_oid, -1, is_key=False)
    assert row.new.values == (b"1", b"happy")


def test_captured_truncate_cascade_restart_identity_lists_both_tables() -> None:
    message = one("truncate_cascade", "Truncate")

    assert message.cascade and message.restart_identity
    assert sorted(message.relation_ids) == sorted([relation_oid("parent"), relation_oid("child")])


def test_captured_plain_truncate_has_no_flags() -> None:
    assert one("truncate_plain", "Truncate") == pg.Truncate(None, (relation_oid("moods"),), False, False)


def test_captured_logical_messages_keep_prefix_and_binary_content() -> None:
    transactional = one("message_transactional", "LogicalMessage")
    other = one("message_nontransactional", "LogicalMessage")

    assert (transactional.transactional, transactional.prefix, transactional.content) == (
        True,
        "capture.tx.é",
        b"\x00\xffhello",
    )
    assert (other.transactional, other.prefix, other.content) == (False, "capture.nontx", b"ping")
    assert transactional.lsn < other.lsn


def test_captured_origin_transaction_names_the_origin_and_takes_its_timestamp() -> None:
    facts = manifest()["origin"]
    started = one("origin", "Begin")

    assert one("origin", "Origin") == pg.Origin(Lsn.parse(facts["lsn"]), facts["name"])
    assert started.xid == xid_of("origin")
    assert started.commit_ts_us == 1_704_067_200_000_000  # 2024-01-01 00:00:00 UTC, set by the origin
    assert one("origin", "Commit").commit_ts_us == started.commit_ts_us


def test_captured_update_leaving_a_toasted_column_alone_marks_it_unchanged() -> None:
    inserted = one("toast_insert", "Insert")
    updated = one("toast_update", "Update")

    assert len(inserted.new.values[2]) == manifest()["toast_body_length"]
    assert updated.new == pg.TupleData((b"1", b"final", UNCHANGED), 0)


def test_captured_binary_mode_sends_columns_in_binary_send_format() -> None:
    first, second = captured("insert_accounts", "Insert", slot="capture_v1_binary")
    toast = one("toast_update", "Update", slot="capture_v1_binary")

    assert first.new.values[0] == struct.pack(">i", 1) and first.new.values[1] == b"alice"
    assert first.new.values[3] == b"\x01"  # bool
    assert first.new.binary_mask == 0b111111
    assert second.new.values[2] is None and second.new.values[5] is None
    assert second.new.binary_mask == 0b011011  # NULLs are neither text nor binary
    assert toast.new.values == (struct.pack(">i", 1), b"final", UNCHANGED)
    assert toast.new.binary_mask == 0b011


STREAM = "capture_v2_stream"


def test_captured_streamed_transaction_opens_with_a_first_segment() -> None:
    first = one("streamed_commit", "StreamStart", variant="first_segment", slot=STREAM)
    later = one("streamed_commit", "StreamStart", variant="next_segment", slot=STREAM)

    assert first == pg.StreamStart(xid_of("streamed_commit"), first_segment=True)
    assert later == pg.StreamStart(xid_of("streamed_commit"), first_segment=False)
    assert one("streamed_commit", "StreamStop", slot=STREAM) == pg.StreamStop()


def test_captured_changes_inside_a_stream_carry_the_transaction_xid() -> None:
    xid = xid_of("streamed_commit")
    mood_type = one("streamed_commit", "Type", slot=STREAM)
    table = one("streamed_commit", "Relation", variant="", slot=STREAM)
    inserted = one("streamed_commit", "Insert", variant="", slot=STREAM)
    updated = one("streamed_commit", "Update", slot=STREAM)
    deleted = one("streamed_commit", "Delete", slot=STREAM)
    truncated = one("streamed_commit", "Truncate", slot=STREAM)
    message = one("streamed_commit", "LogicalMessage", slot=STREAM)

    assert {m.xid for m in (mood_type, table, inserted, updated, deleted, truncated, message)} == {xid}
    assert (table.name, inserted.new.values) == ("moods", (b"2", b"ok"))
    assert updated.new.values[1] == b"alice (streamed)" and updated.old_key is None
    assert deleted.old_key == pg.TupleData((b"4", None, None, None, None, None), 0)
    assert truncated.relation_ids == (relation_oid("child"),)
    assert (message.prefix, message.content) == ("capture.stream", b"inside a stream")


def test_captured_changes_of_a_subtransaction_inside_a_stream_carry_the_subtransaction_xid() -> None:
    xid = xid_of("streamed_commit")
    table = one("streamed_commit", "Relation", variant="subtransaction", slot=STREAM)
    inserted = one("streamed_commit", "Insert", variant="subtransaction", slot=STREAM)

    assert table.xid == inserted.xid != xid
    assert table.name == "bulk" and inserted.relation_id == relation_oid("bulk")
    assert inserted.new.values == (b"1", b"y" * 100)


def test_captured_rollback_to_savepoint_inside_a_stream_aborts_the_subtransaction() -> None:
    aborted = one("streamed_commit", "StreamAbort", slot=STREAM)

    assert aborted.xid == xid_of("streamed_commit") != aborted.subxid
    assert (aborted.abort_lsn, aborted.abort_ts_us) == (None, None)


def test_captured_stream_commit_closes_the_streamed_transaction() -> None:
    committed = one("streamed_commit", "StreamCommit", slot=STREAM)
    message = one("streamed_commit", "LogicalMessage", slot=STREAM)

    assert committed.xid == xid_of("streamed_commit")
    assert message.lsn <= committed.commit_lsn < committed.end_lsn
    assert plausible_now_us(committed.commit_ts_us)


def test_captured_rolled_back_streamed_transaction_ends_in_a_stream_abort() -> None:
    xid = xid_of("streamed_abort")
    inserted = one("streamed_abort", "Insert", slot=STREAM)

    assert one("streamed_abort", "StreamAbort", slot=STREAM) == pg.StreamAbort(xid, xid, None, None)
    assert inserted.xid == xid and inserted.new.values == (b"10001", b"z" * 100)


def two_phase_captured() -> bool:
    return bool(manifest()["gids"])


needs_two_phase = pytest.mark.skipif(not two_phase_captured(), reason="captured without max_prepared_transactions")
TWO_PHASE = "capture_v3_two_phase"


@needs_two_phase
def test_captured_prepared_then_committed_transaction() -> None:
    xid, gid = xid_of("prepare_commit"), manifest()["gids"]["prepare_commit"]
    started = one("prepare_commit", "BeginPrepare", slot=TWO_PHASE)
    row = one("prepare_commit", "Insert", slot=TWO_PHASE)
    prepared = one("prepare_commit", "Prepare", slot=TWO_PHASE)
    committed = one("prepare_commit", "CommitPrepared", slot=TWO_PHASE)

    assert (started.xid, started.gid, prepared.xid, prepared.gid) == (xid, gid, xid, gid)
    assert (started.prepare_lsn, started.end_lsn) == (prepared.prepare_lsn, prepared.end_lsn)
    assert started.prepare_ts_us == prepared.prepare_ts_us and plausible_now_us(prepared.prepare_ts_us)
    assert row.new.values[:2] == (b"5", b"prepared")
    assert (committed.xid, committed.gid) == (xid, gid)
    assert prepared.end_lsn <= committed.commit_lsn < committed.end_lsn
    assert committed.commit_ts_us >= prepared.prepare_ts_us


@needs_two_phase
def test_captured_prepared_then_rolled_back_transaction() -> None:
    xid, gid = xid_of("prepare_rollback"), manifest()["gids"]["prepare_rollback"]
    prepared = one("prepare_rollback", "Prepare", slot=TWO_PHASE)
    rolled_back = one("prepare_rollback", "RollbackPrepared", slot=TWO_PHASE)

    assert (rolled_back.xid, rolled_back.gid) == (xid, gid)
    assert rolled_back.prepare_end_lsn == prepared.end_lsn < rolled_back.rollback_end_lsn
    assert rolled_back.prepare_ts_us == prepared.prepare_ts_us <= rolled_back.rollback_ts_us


@needs_two_phase
def test_captured_streamed_prepared_transaction_ends_in_a_stream_prepare() -> None:
    xid, gid = xid_of("prepare_streamed"), manifest()["gids"]["prepare_streamed"]
    started = one("prepare_streamed", "StreamStart", variant="first_segment", slot=TWO_PHASE)
    prepared = one("prepare_streamed", "StreamPrepare", slot=TWO_PHASE)
    committed = one("prepare_streamed", "CommitPrepared", slot=TWO_PHASE)

    assert started == pg.StreamStart(xid, True)
    assert (prepared.xid, prepared.gid, committed.xid, committed.gid) == (xid, gid, xid, gid)
    assert prepared.end_lsn <= committed.commit_lsn
