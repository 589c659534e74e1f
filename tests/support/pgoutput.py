"""A pgoutput encoder: the test side of the protocol (the codec has none: the service only ever reads pgoutput).

Builds the payloads the unit tests of the codec, the change decoder and the renderers feed in."""

from __future__ import annotations

import struct

from cdc.decoder import pgoutput as pg
from cdc.decoder.pgoutput import UNCHANGED

PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in microseconds since 1970-01-01
TS = 777_000_000_000_000  # a timestamp as pgoutput sends it: microseconds since 2000-01-01
TS_UNIX = TS + PG_EPOCH_US
LSN = 0x16_B374D848
END_LSN = 0x16_B374D900
XID = 0x0DEAD
SUBXID = 0x0BEEF


# --- encoder: the test side of the protocol -------------------------------------------------------


def u8(value: int) -> bytes:
    return struct.pack(">B", value)


def u16(value: int) -> bytes:
    return struct.pack(">H", value)


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def i32(value: int) -> bytes:
    return struct.pack(">i", value)


def u64(value: int) -> bytes:
    return struct.pack(">Q", value)


def i64(value: int) -> bytes:
    return struct.pack(">q", value)


def cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


class Binary(bytes):
    """A column value to encode as ``'b'`` rather than ``'t'``."""


def tuple_data(*columns: bytes | None | pg.Unchanged) -> bytes:
    out = [u16(len(columns))]
    for column in columns:
        if column is None:
            out.append(b"n")
        elif column is UNCHANGED:
            out.append(b"u")
        else:
            assert isinstance(column, bytes)
            out.append((b"b" if isinstance(column, Binary) else b"t") + i32(len(column)) + column)
    return b"".join(out)


def stream_xid(xid: int | None) -> bytes:
    return b"" if xid is None else u32(xid)


def begin(final_lsn: int = LSN, ts: int = TS, xid: int = XID) -> bytes:
    return b"B" + u64(final_lsn) + i64(ts) + u32(xid)


def commit(commit_lsn: int = LSN, end_lsn: int = END_LSN, ts: int = TS) -> bytes:
    return b"C" + u8(0) + u64(commit_lsn) + u64(end_lsn) + i64(ts)


def origin(origin_lsn: int = LSN, name: str = "upstream") -> bytes:
    return b"O" + u64(origin_lsn) + cstring(name)


def relation(
    relation_id: int = 16384,
    namespace: str = "public",
    name: str = "accounts",
    identity: bytes = b"d",
    columns: tuple[tuple[int, str, int, int], ...] = ((1, "id", 23, -1), (0, "name", 1043, 68)),
    xid: int | None = None,
) -> bytes:
    body = [b"R", stream_xid(xid), u32(relation_id), cstring(namespace), cstring(name), identity, u16(len(columns))]
    for flags, column, type_oid, modifier in columns:
        body += [u8(flags), cstring(column), u32(type_oid), i32(modifier)]
    return b"".join(body)


def type_message(type_oid: int = 16400, namespace: str = "public", name: str = "mood", xid: int | None = None) -> bytes:
    return b"Y" + stream_xid(xid) + u32(type_oid) + cstring(namespace) + cstring(name)


def insert(relation_id: int, new: bytes, xid: int | None = None) -> bytes:
    return b"I" + stream_xid(xid) + u32(relation_id) + b"N" + new


def update(relation_id: int, new: bytes, *, key: bytes = b"", old: bytes = b"", xid: int | None = None) -> bytes:
    before = b"K" + key if key else b"O" + old if old else b""
    return b"U" + stream_xid(xid) + u32(relation_id) + before + b"N" + new


def delete(relation_id: int, *, key: bytes = b"", old: bytes = b"", xid: int | None = None) -> bytes:
    before = b"K" + key if key else b"O" + old
    return b"D" + stream_xid(xid) + u32(relation_id) + before


def truncate(relation_ids: tuple[int, ...], options: int = 0, xid: int | None = None) -> bytes:
    return b"T" + stream_xid(xid) + i32(len(relation_ids)) + u8(options) + b"".join(u32(r) for r in relation_ids)


def logical_message(
    prefix: str, content: bytes, *, transactional: bool = True, lsn: int = LSN, xid: int | None = None
) -> bytes:
    return b"M" + stream_xid(xid) + u8(int(transactional)) + u64(lsn) + cstring(prefix) + i32(len(content)) + content


def stream_start(xid: int = XID, first: bool = True) -> bytes:
    return b"S" + u32(xid) + u8(int(first))


def stream_commit(xid: int = XID, commit_lsn: int = LSN, end_lsn: int = END_LSN, ts: int = TS) -> bytes:
    return b"c" + u32(xid) + u8(0) + u64(commit_lsn) + u64(end_lsn) + i64(ts)


def stream_abort(xid: int = XID, subxid: int = SUBXID, abort_lsn: int | None = None, ts: int = TS) -> bytes:
    tail = b"" if abort_lsn is None else u64(abort_lsn) + i64(ts)
    return b"A" + u32(xid) + u32(subxid) + tail


def begin_prepare(gid: str = "gid-1", lsn: int = LSN, end_lsn: int = END_LSN, ts: int = TS, xid: int = XID) -> bytes:
    return b"b" + u64(lsn) + u64(end_lsn) + i64(ts) + u32(xid) + cstring(gid)


def prepare_like(tag: bytes, gid: str = "gid-1", lsn: int = LSN, end_lsn: int = END_LSN, ts: int = TS) -> bytes:
    """Prepare 'P', Commit Prepared 'K' and Stream Prepare 'p' share one layout."""
    return tag + u8(0) + u64(lsn) + u64(end_lsn) + i64(ts) + u32(XID) + cstring(gid)


def rollback_prepared(gid: str = "gid-1", prepare_ts: int = TS, rollback_ts: int = TS + 5) -> bytes:
    return b"r" + u8(0) + u64(LSN) + u64(END_LSN) + i64(prepare_ts) + i64(rollback_ts) + u32(XID) + cstring(gid)
