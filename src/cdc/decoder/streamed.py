"""Streamed in-progress transactions (protocol 2+, ``streaming 'on'``): spooled, then released at their commit.

A streamed transaction arrives in Stream Start/Stop blocks before it commits,
interleaved with other transactions: its payloads go to the spool
(``cdc.decoder.spool``) untouched, and its Stream Commit releases all of its
events, read back from disk lazily, as TxBegin, the changes with their
ordinals, then TxCommit, exactly as if it had not been streamed. Changes of
rolled-back subtransactions are left out; a Stream Abort of the whole
transaction deletes its file. ``ChangeDecoder`` (``cdc.decoder.changes``) takes
this part of its work from ``StreamedTransactions``.

Relation messages inside a stream block describe the table as that streamed
transaction sees it, so they are applied when the transaction is replayed, to a
copy of the relation cache used for its changes. The server counts such a
message as sent for later transactions too once the streamed transaction
commits (pgoutput's ``cleanup_rel_sync_cache``) and sends those no Relation
again, so at the end of the replay each table's last in-stream Relation
becomes the table's entry in the cache, unless a Relation for the table
arrived after it (a later schema, seen by the transactions in between, for
instance after DDL that ran once the streamed transaction had rolled back the
savepoint holding its lock). Receipt order decides, with a counter.
"""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterable
from dataclasses import replace
from typing import Any, Final

import structlog

from cdc.decoder import pgoutput as pg
from cdc.decoder.errors import ChangeError
from cdc.decoder.spool import Spool, SpooledTransaction
from cdc.event import ChangeEvent, Event, TxBegin, TxCommit
from cdc.lsn import Lsn

log = structlog.get_logger("cdc.decoder.changes")

XID: Final = struct.Struct(">I")
RELATION_ID_IN_STREAM: Final = struct.Struct(">II")  # xid, relation id (after the type byte)
NO_EVENTS: Final[tuple[Event, ...]] = ()

# Type bytes of the messages a stream block carries, each followed by a (sub)transaction xid.
IN_STREAM_CHANGE: Final = frozenset(b"IUDTM")  # data: left out when their subtransaction aborted
IN_STREAM_SCHEMA: Final = frozenset(b"RY")  # Relation, Type: applied whatever became of their subtransaction
STREAM_STOP: Final = 0x45  # 'E'
ORIGIN: Final = 0x4F  # 'O'
MESSAGE: Final = 0x4D  # 'M'
RELATION: Final = 0x52  # 'R'
INSERT: Final = 0x49  # 'I'
UPDATE: Final = 0x55  # 'U'
DELETE: Final = 0x44  # 'D'


class StreamedTransactions:
    """The streamed-transaction part of ``ChangeDecoder``: what it keeps per connection, and the
    handling of stream blocks, Stream Commit (a lazy replay) and Stream Abort."""

    # Set by ChangeDecoder.__init__ (per-connection state, cleared by its reset()).
    _relations: dict[int, Any]  # relation id -> the decoder's relation entry (with its ``seq``)
    _spool: Spool | None
    _seq: int  # Relation messages received so far, streamed or not
    _block: Streamed | None  # the transaction of the open Stream Start block
    _streamed: dict[int, Streamed]
    _replaying: bool
    _replay_in_progress: Generator[Event, None, None] | None
    _xid: int | None
    _commit_lsn: Lsn
    _commit_ts: int
    _ordinal: int
    _last_lsn: int
    _then: Event | None  # an event handle() releases after the one it returned

    def handle(self, message: pg.Message, lsn: Lsn) -> Event | None:
        raise NotImplementedError

    def _fast_change(self, kind: int, buf: bytes, at: int, lsn: Lsn) -> ChangeEvent | None:
        raise NotImplementedError

    def _in_block(self, block: Streamed, payload: bytes | memoryview, lsn: Lsn) -> Iterable[Event]:
        kind = payload[0] if len(payload) else -1
        if kind == STREAM_STOP:
            pg.decode(payload, in_stream=True)  # checks it is exactly one byte
            self._block = None
            return NO_EVENTS
        if kind in IN_STREAM_CHANGE or kind in IN_STREAM_SCHEMA:
            if kind == MESSAGE and len(payload) > 5 and not payload[5] & 1:
                # A non-transactional logical message belongs to no transaction: it goes out now.
                event = self.handle(pg.decode(payload, in_stream=True), lsn)
                return NO_EVENTS if event is None else (event,)
            if len(payload) < 5:
                pg.decode(payload, in_stream=True)  # raises DecodeError naming the message
            (subxid,) = XID.unpack_from(payload, 1)
            if kind == RELATION:
                if len(payload) < 9:
                    pg.decode(payload, in_stream=True)
                _, relation_id = RELATION_ID_IN_STREAM.unpack_from(payload, 1)
                self._seq += 1
                block.relation_seqs[relation_id] = self._seq
            block.file.append(payload, lsn, subxid)
            return NO_EVENTS
        if kind == ORIGIN:
            pg.decode(payload, in_stream=True)  # checked, not needed: events carry no origin
            return NO_EVENTS
        message = pg.decode(payload, in_stream=True)
        raise ChangeError(
            f"a {type(message).__name__} message arrived inside the stream block of transaction {block.file.xid} "
            "(protocol violation)"
        )

    def _stream_control(self, message: pg.Message, lsn: Lsn) -> Iterable[Event]:
        match message:
            case pg.StreamStart(xid=xid, first_segment=first):
                if self._xid is not None:
                    raise ChangeError(
                        f"a Stream Start of transaction {xid} arrived inside transaction {self._xid} (protocol violation)"
                    )
                streamed = self._streamed.get(xid)
                if first or streamed is None:
                    if not first:
                        raise ChangeError(
                            f"a stream block of transaction {xid} arrived without its first block: its earlier "
                            "changes were not received (protocol violation)"
                        )
                    if streamed is not None:
                        streamed.file.discard()
                    streamed = Streamed(self._require_spool(xid).begin(xid))
                    self._streamed[xid] = streamed
                self._block = streamed
                return NO_EVENTS
            case pg.StreamStop():
                raise ChangeError("a Stream Stop arrived outside a stream block (protocol violation)")
            case pg.StreamAbort(xid=xid, subxid=subxid):
                streamed = self._streamed.get(xid)
                if subxid == xid:
                    if streamed is not None:
                        del self._streamed[xid]
                        self._forget(streamed)
                    log.debug("streamed_transaction_aborted", xid=xid)
                elif streamed is not None:
                    streamed.file.abort_subtransaction(subxid)
                return NO_EVENTS
            case pg.StreamCommit(xid=xid):
                streamed = self._streamed.pop(xid, None)
                if streamed is None:
                    raise ChangeError(
                        f"a Stream Commit of transaction {xid} arrived, but none of its stream blocks did "
                        "(protocol violation)"
                    )
                assert isinstance(message, pg.StreamCommit)
                self._replaying = True  # until the replay has run to its end
                replay = self._replay(streamed, message)
                self._replay_in_progress = replay
                return replay
            case _:
                raise AssertionError(f"not a stream control message: {message!r}")

    def _require_spool(self, xid: int) -> Spool:
        if self._spool is None:
            raise ChangeError(
                f"the server streams in-progress transaction {xid}, but this decoder has no spool: "
                "give it one, or do not ask for streaming 'on'"
            )
        return self._spool

    def _forget(self, streamed: Streamed) -> None:
        if self._spool is not None:
            self._spool.pop(streamed.file.xid)
        streamed.file.discard()

    def _replay(self, streamed: Streamed, commit: pg.StreamCommit) -> Generator[Event, None, None]:
        """The streamed transaction's events, read back from its file as they are consumed."""
        shared = self._relations
        own = dict(shared)  # this transaction's view of the tables: its own Relation messages win
        self._relations = own
        handle = self.handle
        decode = pg.decode
        file = streamed.file
        log.info(
            "streamed_transaction_committed",
            xid=commit.xid,
            commit_lsn=str(commit.commit_lsn),
            records=file.records,
            spooled_bytes=file.bytes,
        )
        try:
            yield TxBegin(commit.xid, commit.commit_lsn, commit.commit_ts_us)
            self._xid, self._commit_lsn, self._commit_ts, self._ordinal, self._last_lsn = (
                commit.xid,
                commit.commit_lsn,
                commit.commit_ts_us,
                0,
                0,
            )
            fast_change = self._fast_change
            for payload, lsn, aborted in file.replay():
                kind = payload[0]
                if aborted and kind in IN_STREAM_CHANGE:
                    continue
                if kind == INSERT or kind == UPDATE or kind == DELETE:
                    fast = fast_change(kind, payload, 5, lsn)  # the xid takes bytes 1 to 4
                    if fast is not None:
                        yield fast
                        continue
                event = handle(decode(payload, in_stream=True), lsn)
                if event is not None:
                    yield event
                    then = self._then
                    if then is not None:
                        self._then = None
                        yield then
            count = self._ordinal
            self._xid, self._ordinal = None, 0
            # What the server now takes as sent: each table's last Relation in this transaction,
            # unless a later one arrived meanwhile.
            for relation_id, seq in streamed.relation_seqs.items():
                current = shared.get(relation_id)
                mine = own.get(relation_id)
                if mine is not None and (current is None or current.seq < seq):
                    shared[relation_id] = replace(mine, seq=seq)
            yield TxCommit(commit.xid, commit.commit_lsn, commit.end_lsn, commit.commit_ts_us, count)
        finally:
            self._relations = shared
            self._replaying = False
            self._replay_in_progress = None
            self._xid, self._ordinal = None, 0
            self._forget(streamed)


class Streamed:
    """A streamed transaction not yet committed or aborted: its spool file and its Relation messages."""

    __slots__ = ("file", "relation_seqs")

    def __init__(self, file: SpooledTransaction) -> None:
        self.file = file
        self.relation_seqs: dict[int, int] = {}  # relation id -> receipt order of its last Relation here
