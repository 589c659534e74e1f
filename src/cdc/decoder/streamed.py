"""Streamed in-progress transactions (protocol 2+, ``streaming 'on'``): spooled, then released at their commit.

A streamed transaction arrives in Stream Start/Stop blocks before it commits,
interleaved with other transactions: its payloads go to the spool
(``cdc.decoder.spool``) untouched, and its Stream Commit releases all of its
events, read back from disk lazily, as TxBegin, the changes with their
ordinals, then TxCommit, exactly as if it had not been streamed. Changes of
rolled-back subtransactions are left out; a Stream Abort of the whole
transaction deletes its file. ``ChangeDecoder`` (``cdc.decoder.changes``) holds
a ``StreamedTransactions`` for this part of its work; the two share the
transaction in decoding and the relation cache through one ``TxState``.

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
from collections.abc import Callable, Generator, Iterable
from dataclasses import replace
from typing import Final

import structlog

from cdc.decoder import pgoutput as pg
from cdc.decoder.errors import ChangeError
from cdc.decoder.fast import FastChange
from cdc.decoder.spool import Spool, SpooledTransaction
from cdc.decoder.state import TxState
from cdc.event import Event, TxBegin, TxCommit
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
    handling of stream blocks, Stream Commit (a lazy replay) and Stream Abort.

    ``tx`` is the decoder's; ``fast_change`` its fast path over the same ``tx``; ``events`` its general path
    for one decoded message of a transaction; ``next_seq`` numbers a Relation message in receipt order,
    streamed or not.
    """

    def __init__(
        self,
        tx: TxState,
        spool: Spool | None,
        fast_change: FastChange,
        events: Callable[[pg.Message, Lsn], tuple[Event, ...]],
        next_seq: Callable[[], int],
    ) -> None:
        self._tx = tx
        self._spool = spool
        self._fast_change = fast_change
        self._events = events
        self._next_seq = next_seq
        self.block: Streamed | None = None  # the transaction of the open Stream Start block
        self._streamed: dict[int, Streamed] = {}
        self.replaying = False  # a Stream Commit's events are being read: no payload may be fed meanwhile
        self._replay_in_progress: Generator[Event, None, None] | None = None

    def reset(self) -> None:
        """Forget every streamed transaction (a new connection: the server streams them again)."""
        unfinished, self._replay_in_progress = self._replay_in_progress, None
        if unfinished is not None:
            # Left mid-way (the connection failed while its events went out): end it now, so that
            # it puts the relation cache back before the decoder clears it, not later, at garbage collection.
            unfinished.close()
        self.block = None
        self._streamed.clear()
        self.replaying = False
        if self._spool is not None:
            self._spool.discard_all()

    def in_block(self, block: Streamed, payload: bytes | memoryview, lsn: Lsn) -> Iterable[Event]:
        kind = payload[0] if len(payload) else -1
        if kind == STREAM_STOP:
            pg.decode(payload, in_stream=True)  # checks it is exactly one byte
            self.block = None
            return NO_EVENTS
        if kind in IN_STREAM_CHANGE or kind in IN_STREAM_SCHEMA:
            if kind == MESSAGE and len(payload) > 5 and not payload[5] & 1:
                # A non-transactional logical message belongs to no transaction: it goes out now.
                return self._events(pg.decode(payload, in_stream=True), lsn)
            if len(payload) < 5:
                pg.decode(payload, in_stream=True)  # raises DecodeError naming the message
            (subxid,) = XID.unpack_from(payload, 1)
            if kind == RELATION:
                if len(payload) < 9:
                    pg.decode(payload, in_stream=True)
                _, relation_id = RELATION_ID_IN_STREAM.unpack_from(payload, 1)
                block.relation_seqs[relation_id] = self._next_seq()
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

    def stream_control(self, message: pg.Message, lsn: Lsn) -> Iterable[Event]:
        match message:
            case pg.StreamStart(xid=xid, first_segment=first):
                if self._tx.xid is not None:
                    raise ChangeError(
                        f"a Stream Start of transaction {xid} arrived inside transaction {self._tx.xid} "
                        "(protocol violation)"
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
                self.block = streamed
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
                self.replaying = True  # until the replay has run to its end
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
        tx = self._tx
        shared = tx.relations
        own = dict(shared)  # this transaction's view of the tables: its own Relation messages win
        tx.relations = own
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
            tx.begin(commit.xid, commit.commit_lsn, commit.commit_ts_us)
            yield from self._changes(file)
            count = tx.end()
            # What the server now takes as sent: each table's last Relation in this transaction,
            # unless a later one arrived meanwhile.
            for relation_id, seq in streamed.relation_seqs.items():
                current = shared.get(relation_id)
                mine = own.get(relation_id)
                if mine is not None and (current is None or current.seq < seq):
                    shared[relation_id] = replace(mine, seq=seq)
            yield TxCommit(commit.xid, commit.commit_lsn, commit.end_lsn, commit.commit_ts_us, count)
        finally:
            tx.relations = shared
            self.replaying = False
            self._replay_in_progress = None
            tx.end()
            self._forget(streamed)

    def _changes(self, file: SpooledTransaction) -> Generator[Event, None, None]:
        """The events of the spooled payloads, those of rolled-back subtransactions left out."""
        fast_change = self._fast_change
        events = self._events
        decode = pg.decode
        for payload, lsn, aborted in file.replay():
            kind = payload[0]
            if aborted and kind in IN_STREAM_CHANGE:
                continue
            if kind == INSERT or kind == UPDATE or kind == DELETE:
                fast = fast_change(kind, payload, 5, lsn)  # the xid takes bytes 1 to 4
                if fast is not None:
                    yield fast
                    continue
            yield from events(decode(payload, in_stream=True), lsn)


class Streamed:
    """A streamed transaction not yet committed or aborted: its spool file and its Relation messages."""

    __slots__ = ("file", "relation_seqs")

    def __init__(self, file: SpooledTransaction) -> None:
        self.file = file
        self.relation_seqs: dict[int, int] = {}  # relation id -> receipt order of its last Relation here
