"""The pgoutput protocol of PostgreSQL logical replication, decoded without I/O.

``decode(payload)`` turns one pgoutput message (the bytes after the 25-byte
XLogData ``'w'`` header) into one frozen dataclass per message type (defined in
``cdc.decoder.messages``, re-exported here). It covers every message that
protocol versions 1 to 4 carry on PostgreSQL 14 to 17:

======  ====================  ================================================================
byte    class                 sent
======  ====================  ================================================================
``B``   ``Begin``             start of a transaction
``C``   ``Commit``            end of a transaction
``O``   ``Origin``            after Begin, when the transaction came from a replication origin
``R``   ``Relation``          before the first change of a table (again after DDL or TRUNCATE)
``Y``   ``Type``              before a Relation with a column of a user-defined type
``I``   ``Insert``            a new row
``U``   ``Update``            a changed row: optional old key or old row, then the new row
``D``   ``Delete``            a deleted row: its key or (REPLICA IDENTITY FULL) its old row
``T``   ``Truncate``          TRUNCATE of one or more tables
``M``   ``LogicalMessage``    ``pg_logical_emit_message`` (option ``messages 'true'``)
``S``   ``StreamStart``       proto 2+: start of a block of an in-progress transaction
``E``   ``StreamStop``        proto 2+: end of that block
``c``   ``StreamCommit``      proto 2+: a streamed transaction committed
``A``   ``StreamAbort``       proto 2+: a streamed (sub)transaction aborted
``b``   ``BeginPrepare``      proto 3+: start of a prepared transaction
``P``   ``Prepare``           proto 3+: PREPARE TRANSACTION
``K``   ``CommitPrepared``    proto 3+: COMMIT PREPARED
``r``   ``RollbackPrepared``  proto 3+: ROLLBACK PREPARED
``p``   ``StreamPrepare``     proto 3+: PREPARE TRANSACTION of a streamed transaction
======  ====================  ================================================================

Between a Stream Start and a Stream Stop, Relation, Type, Insert, Update,
Delete, Truncate and LogicalMessage carry the xid of the (sub)transaction that
made the change right after their type byte (a subtransaction's own xid, not
the top-level one of the Stream Start); the caller says so with
``in_stream=True`` and the value lands in their ``xid`` field (None outside a
stream). The codec keeps no state: the caller tracks Stream Start/Stop.

Conventions: LSNs are ``Lsn``; timestamps, sent as microseconds since
2000-01-01, are exposed as microseconds since the Unix epoch in fields named
``*_ts_us``; names, prefixes and GIDs are decoded as UTF-8; column values stay
``bytes`` (see ``TupleData``). Anything malformed raises ``DecodeError`` and
nothing else.
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError
from typing import Final

from cdc.decoder.messages import (
    UNCHANGED,
    Begin,
    BeginPrepare,
    Column,
    ColumnValue,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Unchanged,
    Update,
)
from cdc.lsn import Lsn

__all__ = [
    "POSTGRES_EPOCH_US",
    "UNCHANGED",
    "Begin",
    "BeginPrepare",
    "Column",
    "ColumnValue",
    "Commit",
    "CommitPrepared",
    "DecodeError",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Origin",
    "Prepare",
    "Relation",
    "ReplicaIdentity",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "Type",
    "Unchanged",
    "Update",
    "decode",
]

#: Microseconds from the Unix epoch (1970-01-01) to the PostgreSQL epoch (2000-01-01).
POSTGRES_EPOCH_US: Final = 946_684_800_000_000


class DecodeError(ValueError):
    """A pgoutput payload that is not a well-formed message.

    ``message_type`` names the message being decoded (``"unknown"`` when the
    type byte itself is not known); ``offset`` is the byte offset in the
    payload where decoding failed.
    """

    def __init__(self, message_type: str, offset: int, reason: str) -> None:
        super().__init__(f"{message_type} message at offset {offset}: {reason}")
        self.message_type = message_type
        self.offset = offset
        self.reason = reason

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, int, str]]:
        return (type(self), (self.message_type, self.offset, self.reason))


# --- wire layouts (network byte order), each read right after the type byte -------------------

_U64: Final = Struct(">Q")
_U32: Final = Struct(">I")
_I32: Final = Struct(">i")
_U16: Final = Struct(">H")
_U32_U32: Final = Struct(">II")
_BEGIN: Final = Struct(">QqI")  # final lsn, commit ts, xid
_COMMIT: Final = Struct(">BQQq")  # flags, commit lsn, end lsn, commit ts
_STREAM_START: Final = Struct(">IB")  # xid, first segment
_STREAM_COMMIT: Final = Struct(">IBQQq")  # xid, flags, commit lsn, end lsn, commit ts
_STREAM_ABORT: Final = Struct(">II")  # xid, subxid
_STREAM_ABORT_PARALLEL: Final = Struct(">IIQq")  # ... abort lsn, abort ts (proto 4, parallel)
_PREPARE_HEAD: Final = Struct(">QQqI")  # lsn, end lsn, ts, xid (then gid)
_ROLLBACK_PREPARED_HEAD: Final = Struct(">QQqqI")  # prepare end, rollback end, prepare ts, rollback ts, xid
_COLUMN_TAIL: Final = Struct(">Ii")  # type oid, atttypmod

_NEW: Final = 0x4E  # 'N'
_OLD_KEY: Final = 0x4B  # 'K'
_OLD: Final = 0x4F  # 'O'

_STREAM_STOP: Final = StreamStop()


# --- decoding ---------------------------------------------------------------------------------


def decode(payload: bytes | memoryview, *, in_stream: bool = False) -> Message:
    """Decode one pgoutput message.

    ``in_stream`` must be True between a Stream Start and the matching Stream
    Stop: there Relation, Type, Insert, Update, Delete, Truncate and
    LogicalMessage carry an xid. The result never refers to ``payload``, so a
    memoryview into a reused buffer may be handed in.
    """
    buf = payload if type(payload) is bytes else _to_bytes(payload)
    if not buf:
        raise DecodeError("empty", 0, "no message type byte")
    match buf[0]:  # the row changes first: they are most of the traffic
        case 0x49:  # 'I'
            return _decode_insert(buf, in_stream)
        case 0x55:  # 'U'
            return _decode_update(buf, in_stream)
        case 0x44:  # 'D'
            return _decode_delete(buf, in_stream)
        case 0x42:  # 'B'
            final_lsn, ts, xid = _fixed(buf, _BEGIN, "Begin")
            return Begin(Lsn(final_lsn), ts + POSTGRES_EPOCH_US, xid)
        case 0x43:  # 'C'
            _flags, commit_lsn, end_lsn, ts = _fixed(buf, _COMMIT, "Commit")
            return Commit(Lsn(commit_lsn), Lsn(end_lsn), ts + POSTGRES_EPOCH_US)
        case 0x52:  # 'R'
            return _decode_relation(buf, in_stream)
        case 0x59:  # 'Y'
            return _decode_type(buf, in_stream)
        case 0x4F:  # 'O'
            return _decode_origin(buf)
        case 0x54:  # 'T'
            return _decode_truncate(buf, in_stream)
        case 0x4D:  # 'M'
            return _decode_logical_message(buf, in_stream)
        case 0x53:  # 'S'
            xid, first = _fixed(buf, _STREAM_START, "StreamStart")
            return StreamStart(xid, first == 1)
        case 0x45:  # 'E'
            if len(buf) != 1:
                raise DecodeError("StreamStop", 1, f"{len(buf) - 1} trailing bytes")
            return _STREAM_STOP
        case 0x63:  # 'c'
            xid, _flags, commit_lsn, end_lsn, ts = _fixed(buf, _STREAM_COMMIT, "StreamCommit")
            return StreamCommit(xid, Lsn(commit_lsn), Lsn(end_lsn), ts + POSTGRES_EPOCH_US)
        case 0x41:  # 'A'
            return _decode_stream_abort(buf)
        case 0x62:  # 'b'
            lsn, end_lsn, ts, xid, gid = _decode_prepare_like(buf, 1, "BeginPrepare")
            return BeginPrepare(lsn, end_lsn, ts, xid, gid)
        case 0x50:  # 'P'
            lsn, end_lsn, ts, xid, gid = _decode_prepare_like(buf, 2, "Prepare")
            return Prepare(lsn, end_lsn, ts, xid, gid)
        case 0x4B:  # 'K'
            lsn, end_lsn, ts, xid, gid = _decode_prepare_like(buf, 2, "CommitPrepared")
            return CommitPrepared(lsn, end_lsn, ts, xid, gid)
        case 0x72:  # 'r'
            return _decode_rollback_prepared(buf)
        case 0x70:  # 'p'
            lsn, end_lsn, ts, xid, gid = _decode_prepare_like(buf, 2, "StreamPrepare")
            return StreamPrepare(lsn, end_lsn, ts, xid, gid)
        case unknown:
            raise DecodeError("unknown", 0, f"unknown message type {bytes([unknown])!r}")


def _to_bytes(payload: bytes | memoryview) -> bytes:
    # One copy of the whole payload, then plain bytes slicing per column, is
    # cheaper than a memoryview slice plus .tobytes() per column.
    if isinstance(payload, memoryview):
        return payload.tobytes()
    return bytes(payload)


def _fixed(buf: bytes, layout: Struct, name: str) -> tuple[int, ...]:
    """Unpack a message whose whole body is one fixed layout."""
    expected = layout.size + 1
    if len(buf) != expected:
        if len(buf) < expected:
            raise DecodeError(name, len(buf), f"truncated: {expected} bytes expected, {len(buf)} given")
        raise DecodeError(name, expected, f"{len(buf) - expected} trailing bytes")
    return layout.unpack_from(buf, 1)


def _trailing(name: str, buf: bytes, pos: int) -> DecodeError:
    return DecodeError(name, pos, f"{len(buf) - pos} trailing bytes")


def _truncated(name: str, buf: bytes, pos: int, what: str) -> DecodeError:
    return DecodeError(name, min(pos, len(buf)), f"truncated {what} ({len(buf)} bytes in message)")


def _decode_tuple(buf: bytes, pos: int, name: str) -> tuple[TupleData, int]:
    """Read TupleData at ``pos`` (the column count); return it and the offset after it.

    The hot path. Column kinds are int literals (a global lookup per column
    costs), text is tested first, and reading past the end is not checked per
    column: it raises IndexError or struct.error, turned into DecodeError below
    with ``pos`` still at the failing column. Only value lengths are checked,
    since slicing past the end would not raise.
    """
    size = len(buf)
    values: list[ColumnValue] = []
    append = values.append
    binary_mask = 0
    unpack_length = _I32.unpack_from
    try:
        (count,) = _U16.unpack_from(buf, pos)
        pos += 2
        for index in range(count):
            kind = buf[pos]
            if kind == 0x74:  # 't': text
                (length,) = unpack_length(buf, pos + 1)
                start = pos + 5
                pos = start + length
                if length < 0 or pos > size:
                    raise _bad_length(name, start - 4, index, length)
                append(buf[start:pos])
            elif kind == 0x6E:  # 'n': null
                append(None)
                pos += 1
            elif kind == 0x62:  # 'b': binary
                (length,) = unpack_length(buf, pos + 1)
                start = pos + 5
                pos = start + length
                if length < 0 or pos > size:
                    raise _bad_length(name, start - 4, index, length)
                append(buf[start:pos])
                binary_mask |= 1 << index
            elif kind == 0x75:  # 'u': unchanged TOAST
                append(UNCHANGED)
                pos += 1
            else:
                raise DecodeError(name, pos, f"unknown tuple column kind {bytes([kind])!r} in column {index}")
    except (IndexError, StructError):
        raise _truncated(name, buf, pos, "tuple data") from None
    return TupleData(tuple(values), binary_mask), pos


def _bad_length(name: str, offset: int, index: int, length: int) -> DecodeError:
    return DecodeError(name, offset, f"column {index} length {length} exceeds the message")


def _decode_change_head(buf: bytes, in_stream: bool, name: str) -> tuple[int | None, int, int]:
    """Read the optional xid and the relation id: ``(xid, relation_id, offset of the next byte)``."""
    try:
        if in_stream:
            xid, relation_id = _U32_U32.unpack_from(buf, 1)
            return xid, relation_id, 9
        (relation_id,) = _U32.unpack_from(buf, 1)
    except StructError:
        raise _truncated(name, buf, 1, "xid and relation id" if in_stream else "relation id") from None
    return None, relation_id, 5


def _marker(buf: bytes, pos: int, name: str) -> int:
    if pos >= len(buf):
        raise _truncated(name, buf, pos, "tuple marker")
    return buf[pos]


def _decode_insert(buf: bytes, in_stream: bool) -> Insert:
    xid, relation_id, pos = _decode_change_head(buf, in_stream, "Insert")
    marker = _marker(buf, pos, "Insert")
    if marker != _NEW:
        raise DecodeError("Insert", pos, f"expected tuple marker b'N', got {bytes([marker])!r}")
    new, pos = _decode_tuple(buf, pos + 1, "Insert")
    if pos != len(buf):
        raise _trailing("Insert", buf, pos)
    return Insert(xid, relation_id, new)


def _decode_update(buf: bytes, in_stream: bool) -> Update:
    xid, relation_id, pos = _decode_change_head(buf, in_stream, "Update")
    old_key = old = None
    marker = _marker(buf, pos, "Update")
    if marker == _OLD_KEY:
        old_key, pos = _decode_tuple(buf, pos + 1, "Update")
        marker = _marker(buf, pos, "Update")
    elif marker == _OLD:
        old, pos = _decode_tuple(buf, pos + 1, "Update")
        marker = _marker(buf, pos, "Update")
    if marker != _NEW:
        raise DecodeError("Update", pos, f"expected tuple marker b'N', got {bytes([marker])!r}")
    new, pos = _decode_tuple(buf, pos + 1, "Update")
    if pos != len(buf):
        raise _trailing("Update", buf, pos)
    return Update(xid, relation_id, old_key, old, new)


def _decode_delete(buf: bytes, in_stream: bool) -> Delete:
    xid, relation_id, pos = _decode_change_head(buf, in_stream, "Delete")
    marker = _marker(buf, pos, "Delete")
    old_key = old = None
    if marker == _OLD_KEY:
        old_key, pos = _decode_tuple(buf, pos + 1, "Delete")
    elif marker == _OLD:
        old, pos = _decode_tuple(buf, pos + 1, "Delete")
    else:
        raise DecodeError("Delete", pos, f"expected tuple marker b'K' or b'O', got {bytes([marker])!r}")
    if pos != len(buf):
        raise _trailing("Delete", buf, pos)
    return Delete(xid, relation_id, old_key, old)


class _Reader:
    """Bounds-checked sequential reads for the messages off the hot path."""

    __slots__ = ("_buf", "_name", "pos")

    def __init__(self, buf: bytes, name: str) -> None:
        self._buf = buf
        self._name = name
        self.pos = 1

    def error(self, reason: str, offset: int | None = None) -> DecodeError:
        return DecodeError(self._name, self.pos if offset is None else offset, reason)

    def unpack(self, layout: Struct, what: str) -> tuple[int, ...]:
        pos = self.pos
        if pos + layout.size > len(self._buf):
            raise _truncated(self._name, self._buf, pos, what)
        self.pos = pos + layout.size
        return layout.unpack_from(self._buf, pos)

    def u8(self, what: str) -> int:
        pos = self.pos
        if pos >= len(self._buf):
            raise _truncated(self._name, self._buf, pos, what)
        self.pos = pos + 1
        return self._buf[pos]

    def u16(self, what: str) -> int:
        (value,) = self.unpack(_U16, what)
        return value

    def u32(self, what: str) -> int:
        (value,) = self.unpack(_U32, what)
        return value

    def i32(self, what: str) -> int:
        (value,) = self.unpack(_I32, what)
        return value

    def take(self, length: int, what: str) -> bytes:
        pos = self.pos
        if length < 0 or pos + length > len(self._buf):
            raise self.error(f"{what} length {length} exceeds the message")
        self.pos = pos + length
        return self._buf[pos : pos + length]

    def cstring(self, what: str) -> str:
        """A NUL-terminated UTF-8 string."""
        pos = self.pos
        end = self._buf.find(b"\x00", pos)
        if end < 0:
            raise self.error(f"{what} has no NUL terminator")
        try:
            text = self._buf[pos:end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"{what} is not valid UTF-8", pos + exc.start) from None
        self.pos = end + 1
        return text

    def xid_if(self, in_stream: bool) -> int | None:
        return self.u32("xid") if in_stream else None

    def finish(self) -> None:
        if self.pos != len(self._buf):
            raise _trailing(self._name, self._buf, self.pos)


def _decode_relation(buf: bytes, in_stream: bool) -> Relation:
    reader = _Reader(buf, "Relation")
    xid = reader.xid_if(in_stream)
    relation_id = reader.u32("relation id")
    namespace = reader.cstring("namespace")
    name = reader.cstring("relation name")
    identity_offset = reader.pos
    identity = reader.u8("replica identity")
    try:
        replica_identity = ReplicaIdentity(chr(identity))
    except ValueError:
        raise reader.error(f"unknown replica identity {bytes([identity])!r}", identity_offset) from None
    count = reader.u16("column count")
    columns = []
    for _ in range(count):
        flags = reader.u8("column flags")
        column_name = reader.cstring("column name")
        type_oid, type_modifier = reader.unpack(_COLUMN_TAIL, "column type")
        columns.append(Column(column_name, type_oid, type_modifier, bool(flags & 1)))
    reader.finish()
    return Relation(xid, relation_id, namespace, name, replica_identity, tuple(columns))


def _decode_type(buf: bytes, in_stream: bool) -> Type:
    reader = _Reader(buf, "Type")
    xid = reader.xid_if(in_stream)
    type_oid = reader.u32("type oid")
    namespace = reader.cstring("namespace")
    name = reader.cstring("type name")
    reader.finish()
    return Type(xid, type_oid, namespace, name)


def _decode_origin(buf: bytes) -> Origin:
    reader = _Reader(buf, "Origin")
    (origin_lsn,) = reader.unpack(_U64, "origin lsn")
    name = reader.cstring("origin name")
    reader.finish()
    return Origin(Lsn(origin_lsn), name)


def _decode_truncate(buf: bytes, in_stream: bool) -> Truncate:
    reader = _Reader(buf, "Truncate")
    xid = reader.xid_if(in_stream)
    count = reader.i32("relation count")
    options = reader.u8("options")
    if count < 0 or reader.pos + 4 * count > len(buf):
        raise reader.error(f"relation count {count} exceeds the message", 1 if xid is None else 5)
    relation_ids = reader.unpack(Struct(f">{count}I"), "relation ids")
    reader.finish()
    return Truncate(xid, relation_ids, bool(options & 1), bool(options & 2))


def _decode_logical_message(buf: bytes, in_stream: bool) -> LogicalMessage:
    reader = _Reader(buf, "LogicalMessage")
    xid = reader.xid_if(in_stream)
    flags = reader.u8("flags")
    (lsn,) = reader.unpack(_U64, "lsn")
    prefix = reader.cstring("prefix")
    length = reader.i32("content length")
    content = reader.take(length, "content")
    reader.finish()
    return LogicalMessage(xid, bool(flags & 1), Lsn(lsn), prefix, content)


def _decode_stream_abort(buf: bytes) -> StreamAbort:
    """9 bytes, or 25 when protocol 4 streams in parallel and adds the abort LSN and time."""
    size = len(buf)
    if size == _STREAM_ABORT.size + 1:
        xid, subxid = _STREAM_ABORT.unpack_from(buf, 1)
        return StreamAbort(xid, subxid, None, None)
    if size == _STREAM_ABORT_PARALLEL.size + 1:
        xid, subxid, abort_lsn, ts = _STREAM_ABORT_PARALLEL.unpack_from(buf, 1)
        return StreamAbort(xid, subxid, Lsn(abort_lsn), ts + POSTGRES_EPOCH_US)
    if size < _STREAM_ABORT.size + 1:
        raise DecodeError("StreamAbort", size, f"truncated: 9 bytes expected, {size} given")
    if size < _STREAM_ABORT_PARALLEL.size + 1:
        raise DecodeError("StreamAbort", 9, f"{size} bytes: neither 9 (xid, subxid) nor 25 (with abort lsn and time)")
    raise DecodeError("StreamAbort", 25, f"{size - 25} trailing bytes")


def _decode_prepare_like(buf: bytes, start: int, name: str) -> tuple[Lsn, Lsn, int, int, str]:
    """Begin Prepare (``start`` 1) and the flag-led Prepare, Commit Prepared, Stream Prepare (``start`` 2)."""
    reader = _Reader(buf, name)
    if start == 2:
        reader.u8("flags")
    lsn, end_lsn, ts, xid = reader.unpack(_PREPARE_HEAD, "lsns, timestamp and xid")
    gid = reader.cstring("gid")
    reader.finish()
    return Lsn(lsn), Lsn(end_lsn), ts + POSTGRES_EPOCH_US, xid, gid


def _decode_rollback_prepared(buf: bytes) -> RollbackPrepared:
    reader = _Reader(buf, "RollbackPrepared")
    reader.u8("flags")
    prepare_end, rollback_end, prepare_ts, rollback_ts, xid = reader.unpack(
        _ROLLBACK_PREPARED_HEAD, "lsns, timestamps and xid"
    )
    gid = reader.cstring("gid")
    reader.finish()
    return RollbackPrepared(
        Lsn(prepare_end),
        Lsn(rollback_end),
        prepare_ts + POSTGRES_EPOCH_US,
        rollback_ts + POSTGRES_EPOCH_US,
        xid,
        gid,
    )
