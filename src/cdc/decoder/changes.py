"""From pgoutput messages to events, in commit order: the relation cache and the typed values of each row.

``ChangeDecoder.feed(payload, lsn)`` takes every pgoutput payload the server
sends and returns the events it releases. A message of an ordinary
transaction releases its event at once. A streamed transaction (protocol 2+,
``streaming 'on'``) arrives in Stream Start/Stop blocks before it commits,
interleaved with other transactions: its payloads go to the spool
(``cdc.decoder.spool``) untouched, and its Stream Commit releases all of its
events, read back from disk lazily, as TxBegin, the changes with their
ordinals, then TxCommit, exactly as if it had not been streamed. Changes of
rolled-back subtransactions are left out; a Stream Abort of the whole
transaction deletes its file.

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

Pure with respect to I/O but for the injected spool: the catalog facts it
needs (key columns, resolved types) are handed in at construction; the only
runtime input is messages; the decoder never queries the catalog mid-stream.
Types created after start-up arrive as Type messages with a name only: such
columns travel as their text, with the type's name and kind UNKNOWN. Resolving
them fully (an enum's labels, a domain's base type) needs the catalog, read
again at the next start-up; a domain over a built-in type is the exception, see
``_announced_type``.

Schema changes while streaming, as PostgreSQL reports them:

- ADD / DROP / RENAME COLUMN, ALTER COLUMN TYPE: the server sends a new Relation
  message before the next change of the table; the events after it carry the new
  columns. A rewrite (ALTER ... TYPE ... USING) is not decoded: rows it changed and
  no later statement touched keep their old values in the events (re-snapshot the
  table for those).
- Renaming or dropping a configured key column stops with ChangeError (the key
  of the table's events would change): configure the new key and restart.
- DROP TABLE of a captured table sends nothing: its earlier changes were
  delivered, the other tables flow on; the next start-up refuses the
  configuration until the table leaves 'tables'.
- TRUNCATE becomes one TruncateEvent naming every truncated table, with the
  CASCADE and RESTART IDENTITY flags.

Row changes of the common shape (text columns, no unchanged TOAST) take a fast
path: a parser generated per relation reads and converts a tuple in one pass
(``_row_parser``); anything else, malformed input included, goes through
``pgoutput.decode`` and ``handle``, which raise the precise error. A property test
holds the two paths to the same results.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import structlog

from cdc.decoder import pgoutput as pg
from cdc.decoder.spool import Spool, SpooledTransaction
from cdc.decoder.types import (
    BUILTIN_TYPES,
    CATALOG_TEXT_TYPES,
    EXTENSION_TYPE_NAMES,
    PARSE_ERRORS,
    ValueConversionError,
    converter_for,
    parser_for,
)
from cdc.event import (
    AnyRow,
    ChangeEvent,
    Column,
    Event,
    MessageEvent,
    Op,
    PgType,
    RenderedRow,
    RowRendering,
    Row,
    TableInfo,
    TableSchema,
    TruncateEvent,
    TxBegin,
    TxCommit,
    TypeKind,
    change_event,
)
from cdc.lsn import Lsn
from cdc.values import UNCHANGED_TOAST

log = structlog.get_logger(__name__)


class ChangeError(Exception):
    """A message that cannot become an event; the pipeline stops rather than skip it."""


RowParser = Callable[[bytes, int], tuple[AnyRow, int]]
Rendering = Callable[[TableSchema], RowRendering | None]
"""Asked once per Relation message: how to write the table's rows in the sink format, or None (typed rows)."""


@dataclass(frozen=True, slots=True)
class _Relation:
    schema: TableSchema
    names: tuple[str, ...]
    converters: tuple[Callable[[bytes], Any], ...]
    key_names: tuple[str, ...]
    seq: int = 0  # receipt order of the Relation message it came from
    parse: RowParser | None = None  # the fast path's row parser (see _row_parser)
    # The replica identity's columns are the configured key's: an old-key tuple ('K') then holds exactly
    # the key columns, so a rendered one is the typed path's before row.
    key_is_identity: bool = True


_XID: Final = struct.Struct(">I")
_U32: Final = struct.Struct(">I")
_RELATION_ID_IN_STREAM: Final = struct.Struct(">II")  # xid, relation id (after the type byte)
_NO_EVENTS: Final[tuple[Event, ...]] = ()

# Type bytes of the messages a stream block carries, each followed by a (sub)transaction xid.
_IN_STREAM_CHANGE: Final = frozenset(b"IUDTM")  # data: left out when their subtransaction aborted
_IN_STREAM_SCHEMA: Final = frozenset(b"RY")  # Relation, Type: applied whatever became of their subtransaction
_STREAM_STOP: Final = 0x45  # 'E'
_ORIGIN: Final = 0x4F  # 'O'
_MESSAGE: Final = 0x4D  # 'M'
_RELATION: Final = 0x52  # 'R'
_INSERT: Final = 0x49  # 'I'
_UPDATE: Final = 0x55  # 'U'
_DELETE: Final = 0x44  # 'D'
_NEW: Final = 0x4E  # 'N'
_OLD_KEY: Final = 0x4B  # 'K'
_OLD: Final = 0x4F  # 'O'
_NOTHING_UNCHANGED: Final[frozenset[str]] = frozenset()


class _Slow(Exception):
    """The fast path declines a message; the general path decodes it (and raises whatever is wrong with it)."""


# A value the bare parsers reject declines too: the general path converts it again and names the column.
_FAST_PATH_DECLINES: Final = (_Slow, ValueConversionError, IndexError, struct.error, *PARSE_ERRORS)


class ChangeDecoder:
    """Turns the pgoutput messages of a replication connection into events, in commit order.

    ``feed`` takes raw payloads (streamed transactions need a ``spool``);
    ``handle`` takes one decoded message of an ordinary transaction.
    """

    def __init__(
        self,
        tables: Mapping[str, TableInfo],
        types: Mapping[int, PgType],
        *,
        spool: Spool | None = None,
        rendering: Rendering | None = None,
    ) -> None:
        self._tables = tables
        self._rendering = rendering
        self._types: dict[int, PgType] = {**CATALOG_TEXT_TYPES, **BUILTIN_TYPES, **types}
        self._relations: dict[int, _Relation] = {}
        # Relations announced but not captured: a partition whose changes the publication sends as its
        # partitioned table's (publish_via_partition_root: pgoutput announces both). Only a change of one is an error.
        self._uncaptured: dict[int, str] = {}
        self._xid: int | None = None
        self._commit_lsn = Lsn(0)
        self._commit_ts = 0
        self._ordinal = 0
        self._spool = spool
        self._seq = 0  # Relation messages received so far, streamed or not
        self._block: _Streamed | None = None  # the transaction of the open Stream Start block
        self._streamed: dict[int, _Streamed] = {}
        self._replaying = False
        self._replay_in_progress: Generator[Event, None, None] | None = None

    def update_tables(self, tables: Mapping[str, TableInfo], types: Mapping[int, PgType]) -> None:
        """A reloaded table list; Relation messages that follow use it."""
        self._tables = tables
        self._types.update(types)

    def set_rendering(self, rendering: Rendering | None) -> None:
        """Ask ``rendering`` again for every known table (what may be rendered changed: a reload)."""
        self._rendering = rendering
        for relation_id, rel in list(self._relations.items()):
            self._relations[relation_id] = replace(rel, parse=self._parser(rel.schema, rel.names))

    def reset(self) -> None:
        """Forget per-connection state: the server resends Relation messages and streamed transactions."""
        unfinished, self._replay_in_progress = self._replay_in_progress, None
        if unfinished is not None:
            # Left mid-way (the connection failed while its events went out): end it now, so that
            # it puts the relation cache back before the cache is cleared, not later, at garbage collection.
            unfinished.close()
        self._relations.clear()
        self._uncaptured.clear()
        self._xid = None
        self._ordinal = 0
        self._block = None
        self._streamed.clear()
        self._replaying = False
        if self._spool is not None:
            self._spool.discard_all()

    def table(self, relation_id: int) -> TableSchema:
        return self._relation(relation_id).schema

    # -- raw payloads, streamed transactions included ---------------------------------------------

    def feed(self, payload: bytes | memoryview, lsn: Lsn) -> Iterable[Event]:
        """The events one pgoutput payload releases, in commit order.

        Usually zero or one. A Stream Commit releases the whole streamed
        transaction, read back from the spool as the result is iterated: iterate
        it to the end before feeding the next payload. ``payload`` may be a
        memoryview into a buffer that is reused afterwards.
        """
        if self._replaying:
            raise ChangeError(
                "a payload was fed while the events of a streamed transaction were still being read: "
                "iterate the result of feed() to the end first"
            )
        block = self._block
        if block is not None:
            return self._in_block(block, payload, lsn)
        buf = payload.tobytes() if isinstance(payload, memoryview) else payload  # tobytes: 4x cheaper than bytes()
        kind = buf[0] if buf else -1
        if kind == _INSERT or kind == _UPDATE or kind == _DELETE:
            fast = self._fast_change(kind, buf, 1, lsn)
            if fast is not None:
                return (fast,)
        message = pg.decode(buf)
        mtype = type(message)
        if mtype is pg.StreamStart or mtype is pg.StreamCommit or mtype is pg.StreamAbort or mtype is pg.StreamStop:
            return self._stream_control(message, lsn)
        event = self.handle(message, lsn)
        return _NO_EVENTS if event is None else (event,)

    def _in_block(self, block: _Streamed, payload: bytes | memoryview, lsn: Lsn) -> Iterable[Event]:
        kind = payload[0] if len(payload) else -1
        if kind == _STREAM_STOP:
            pg.decode(payload, in_stream=True)  # checks it is exactly one byte
            self._block = None
            return _NO_EVENTS
        if kind in _IN_STREAM_CHANGE or kind in _IN_STREAM_SCHEMA:
            if kind == _MESSAGE and len(payload) > 5 and not payload[5] & 1:
                # A non-transactional logical message belongs to no transaction: it goes out now.
                event = self.handle(pg.decode(payload, in_stream=True), lsn)
                return _NO_EVENTS if event is None else (event,)
            if len(payload) < 5:
                pg.decode(payload, in_stream=True)  # raises DecodeError naming the message
            (subxid,) = _XID.unpack_from(payload, 1)
            if kind == _RELATION:
                if len(payload) < 9:
                    pg.decode(payload, in_stream=True)
                _, relation_id = _RELATION_ID_IN_STREAM.unpack_from(payload, 1)
                self._seq += 1
                block.relation_seqs[relation_id] = self._seq
            block.file.append(payload, lsn, subxid)
            return _NO_EVENTS
        if kind == _ORIGIN:
            pg.decode(payload, in_stream=True)  # checked, not needed: events carry no origin
            return _NO_EVENTS
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
                    streamed = _Streamed(self._require_spool(xid).begin(xid))
                    self._streamed[xid] = streamed
                self._block = streamed
                return _NO_EVENTS
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
                return _NO_EVENTS
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

    def _forget(self, streamed: _Streamed) -> None:
        if self._spool is not None:
            self._spool.pop(streamed.file.xid)
        streamed.file.discard()

    def _replay(self, streamed: _Streamed, commit: pg.StreamCommit) -> Generator[Event, None, None]:
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
            self._xid, self._commit_lsn, self._commit_ts, self._ordinal = (
                commit.xid,
                commit.commit_lsn,
                commit.commit_ts_us,
                0,
            )
            fast_change = self._fast_change
            for payload, lsn, aborted in file.replay():
                kind = payload[0]
                if aborted and kind in _IN_STREAM_CHANGE:
                    continue
                if kind == _INSERT or kind == _UPDATE or kind == _DELETE:
                    fast = fast_change(kind, payload, 5, lsn)  # the xid takes bytes 1 to 4
                    if fast is not None:
                        yield fast
                        continue
                event = handle(decode(payload, in_stream=True), lsn)
                if event is not None:
                    yield event
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

    # -- one message of an ordinary transaction ---------------------------------------------------

    def handle(self, message: pg.Message, lsn: Lsn) -> Event | None:
        """The event for one message (None for messages that only update state)."""
        match message:
            case pg.Insert(relation_id=rid, new=new):
                rel = self._relation(rid)
                return self._change(Op.CREATE, rel, None, self._row(rel, new), lsn)
            case pg.Update(relation_id=rid, old_key=old_key, old=old, new=new):
                rel = self._relation(rid)
                after = self._row(rel, new)
                before = None
                if old is not None:
                    before = self._row(rel, old)
                elif old_key is not None:
                    before = self._key_row(rel, old_key)
                unchanged = frozenset(n for n, v in after.items() if v is UNCHANGED_TOAST)
                if unchanged and before is not None and old is not None:
                    # REPLICA IDENTITY FULL: the old tuple holds the real values.
                    for name in list(unchanged):
                        value = before.get(name, UNCHANGED_TOAST)
                        if value is not UNCHANGED_TOAST:
                            after[name] = value
                    unchanged = frozenset(n for n, v in after.items() if v is UNCHANGED_TOAST)
                return self._change(Op.UPDATE, rel, before, after, lsn, unchanged)
            case pg.Delete(relation_id=rid, old_key=old_key, old=old):
                rel = self._relation(rid)
                if old is not None:
                    before = self._row(rel, old)
                elif old_key is not None:
                    before = self._key_row(rel, old_key)
                else:
                    raise ChangeError(
                        f"a delete on {rel.schema.qualified} arrived without an old key "
                        "(REPLICA IDENTITY NOTHING?): set REPLICA IDENTITY DEFAULT or FULL"
                    )
                return self._change(Op.DELETE, rel, before, None, lsn)
            case pg.Begin(final_lsn=commit_lsn, commit_ts_us=ts, xid=xid):
                self._xid, self._commit_lsn, self._commit_ts, self._ordinal = xid, commit_lsn, ts, 0
                return TxBegin(xid, commit_lsn, ts)
            case pg.Commit(commit_lsn=commit_lsn, end_lsn=end_lsn, commit_ts_us=ts):
                xid = self._xid if self._xid is not None else 0
                count = self._ordinal
                self._xid, self._ordinal = None, 0
                return TxCommit(xid, commit_lsn, end_lsn, ts, count)
            case pg.Relation(namespace=ns, name=name) if f"{ns}.{name}" not in self._tables:
                self._relations.pop(message.relation_id, None)
                self._uncaptured[message.relation_id] = f"{ns}.{name}"
                return None
            case pg.Relation():
                self._seq += 1
                self._uncaptured.pop(message.relation_id, None)
                self._relations[message.relation_id] = self._build_relation(message, self._seq)
                return None
            case pg.Type(type_oid=oid, namespace=ns, name=name):
                if oid not in self._types:
                    announced = _announced_type(oid, ns, name)
                    self._types[oid] = announced
                    log.info("type_announced", type=f"{announced.schema}.{name}", oid=oid, kind=announced.kind.value)
                return None
            case pg.Truncate(relation_ids=rids, cascade=cascade, restart_identity=restart):
                self._ordinal += 1
                schemas = tuple(self._relation(r).schema for r in rids)
                return TruncateEvent(
                    schemas, cascade, restart, self._commit_lsn, lsn, self._xid, self._ordinal, self._commit_ts
                )
            case pg.LogicalMessage(transactional=tx, lsn=msg_lsn, prefix=prefix, content=content):
                if tx:
                    self._ordinal += 1
                return MessageEvent(
                    prefix,
                    content,
                    tx,
                    self._commit_lsn if tx else None,
                    msg_lsn,
                    self._xid if tx else None,
                    self._ordinal if tx else 0,
                    self._commit_ts if tx else None,
                )
            case pg.Origin():
                return None
            case pg.StreamStart() | pg.StreamStop() | pg.StreamCommit() | pg.StreamAbort():
                raise ChangeError(
                    f"a {type(message).__name__} message was handed to handle(), which takes the messages of "
                    "ordinary transactions: feed() the raw payloads of a streaming connection"
                )
            case _:
                raise ChangeError(
                    f"unexpected {type(message).__name__} message: two-phase decoding is not enabled on this "
                    "connection (prepared transactions arrive at COMMIT PREPARED)"
                )

    # -- the fast path of row changes -------------------------------------------------------------

    def _fast_change(self, kind: int, buf: bytes, at: int, lsn: Lsn) -> ChangeEvent | None:
        """Insert, Update or Delete parsed and converted in one pass; None: let the general path do it.

        Takes the common shapes only (text columns, no unchanged TOAST, a known relation) and
        yields exactly what ``handle(pg.decode(buf))`` would; anything else, malformed input
        included, goes the general way, which raises the precise error.
        """
        try:
            (relation_id,) = _U32.unpack_from(buf, at)
            rel = self._relations.get(relation_id)
            if rel is None or rel.parse is None:
                return None
            parse = rel.parse
            marker = buf[at + 4]
            if kind == _INSERT:
                if marker != _NEW:
                    return None
                after, end = parse(buf, at + 5)
                before = None
                op = Op.CREATE
            elif kind == _UPDATE:
                before = None
                pos = at + 5
                if marker == _OLD_KEY or marker == _OLD:
                    old, pos = parse(buf, pos)
                    before = old if marker == _OLD else _key_of(old, rel)
                    marker = buf[pos]
                    pos += 1
                if marker != _NEW:
                    return None
                after, end = parse(buf, pos)
                op = Op.UPDATE
            else:
                if marker == _OLD_KEY:
                    old, end = parse(buf, at + 5)
                    before = _key_of(old, rel)
                elif marker == _OLD:
                    before, end = parse(buf, at + 5)
                else:
                    return None
                after = None
                op = Op.DELETE
            if end != len(buf):
                return None
        except _FAST_PATH_DECLINES:
            return None
        return self._change(op, rel, before, after, lsn, _NOTHING_UNCHANGED)

    # -- helpers --------------------------------------------------------------------------------

    def _relation(self, relation_id: int) -> _Relation:
        try:
            return self._relations[relation_id]
        except KeyError:
            if relation_id in self._uncaptured:
                raise ChangeError(
                    f"the publication sent changes of {self._uncaptured[relation_id]}, which is not a configured "
                    "table. Fix: add it to 'tables', or remove it from the publication."
                ) from None
            raise ChangeError(
                f"a change for relation {relation_id} arrived before its Relation message (protocol violation)"
            ) from None

    def _change(
        self,
        op: Op,
        rel: _Relation,
        before: AnyRow | None,
        after: AnyRow | None,
        lsn: Lsn,
        unchanged: frozenset[str] = frozenset(),
    ) -> ChangeEvent:
        self._ordinal += 1
        return change_event(
            op,
            rel.schema,
            before,
            after,
            self._commit_lsn,
            lsn,
            self._xid,
            self._ordinal,
            self._commit_ts,
            False,
            unchanged,
        )

    def _row(self, rel: _Relation, data: pg.TupleData) -> Row:
        values = data.values
        if len(values) != len(rel.names):
            raise ChangeError(
                f"a row of {rel.schema.qualified} has {len(values)} columns, its Relation message {len(rel.names)}"
            )
        row: Row = {}
        for name, convert, raw in zip(rel.names, rel.converters, values):
            if raw is None:
                row[name] = None
            elif raw is pg.UNCHANGED:
                row[name] = UNCHANGED_TOAST
            else:
                assert isinstance(raw, bytes)
                try:
                    row[name] = convert(raw)
                except ValueConversionError as e:
                    raise ChangeError(f"column {rel.schema.qualified}.{name}: {e}") from None
        return row

    def _key_row(self, rel: _Relation, data: pg.TupleData) -> Row:
        """The old key of REPLICA IDENTITY DEFAULT/INDEX: only identity columns are real, the rest are 'n'."""
        full = self._row(rel, data)
        return {c.name: full[c.name] for c in rel.schema.columns if c.key}

    def _build_relation(self, msg: pg.Relation, seq: int) -> _Relation:
        qualified = f"{msg.namespace}.{msg.name}"
        info = self._tables.get(qualified)
        if info is None:
            raise ChangeError(
                f"the publication sent changes of {qualified}, which is not a configured table. "
                "Fix: add it to 'tables', or remove it from the publication."
            )
        names = tuple(c.name for c in msg.columns)
        missing = [k for k in info.key if k not in names]
        if missing:
            raise ChangeError(
                f"key column(s) {', '.join(missing)} of {qualified} no longer exist (renamed or dropped). "
                "Fix: configure the new key columns for the table and restart."
            )
        columns = []
        converters = []
        parsers = []
        for c in msg.columns:
            pg_type = self._types.get(c.type_oid) or PgType(c.type_oid, f"oid:{c.type_oid}", TypeKind.UNKNOWN)
            columns.append(
                Column(c.name, pg_type, c.type_modifier, key=c.name in info.key, nullable=c.name not in info.not_null)
            )
            converters.append(converter_for(pg_type, c.type_modifier))
            parsers.append(parser_for(pg_type))
        schema = TableSchema(msg.namespace, msg.name, tuple(columns), msg.relation_id, str(msg.replica_identity))
        key_names = tuple(c.name for c in columns if c.key)
        parse = self._parser(schema, names)
        log.info(
            "relation",
            table=qualified,
            columns=len(columns),
            replica_identity=str(msg.replica_identity),
            rendered=getattr(parse, "rendered", False),
        )
        key_is_identity = all(c.is_key == (c.name in info.key) for c in msg.columns)
        return _Relation(schema, names, tuple(converters), key_names, seq, parse, key_is_identity)

    def _parser(self, schema: TableSchema, names: tuple[str, ...]) -> RowParser:
        """The fast path's row parser: JSON text when the sink renders the table, else typed values."""
        parsers = [parser_for(c.type) for c in schema.columns]
        rendering = self._rendering(schema) if self._rendering is not None else None
        if rendering is None:
            return _row_parser(names, parsers)
        if rendering.names != names:
            raise ChangeError(f"the rendering of {schema.qualified} names other columns than its Relation message")
        return _render_parser(rendering, parsers)


def _row_parser(names: tuple[str, ...], converters: list[Callable[[bytes], Any]]) -> RowParser:
    """A function reading one tuple (text and NULL columns only) into a row, generated for one relation.

    ``parse(buf, pos)`` reads the TupleData at ``pos`` (its column count) and returns the row and
    the offset after it: the column loop unrolled, the converters bound as locals, several times
    faster than TupleData plus a loop. It raises ``_Slow`` on what it does not handle (unchanged
    TOAST, binary columns, another column count). Bounds are checked once: lengths are read
    unsigned, so a bad one overshoots, and the next column's type byte then raises IndexError, or
    the offset returned is past the end, which the caller checks.
    """
    count = len(names)
    params = "".join(f", c{i}=c{i}" for i in range(count))
    lines = [
        f"def parse(buf, pos, Slow=Slow, u32=u32{params}):",
        f"    if buf[pos] != {count >> 8} or buf[pos + 1] != {count & 0xFF}:",
        "        raise Slow",
        "    pos += 2",
    ]
    for i in range(count):
        lines += [
            "    kind = buf[pos]",
            "    if kind == 116:",  # 't'
            "        start = pos + 5",
            "        pos = start + u32(buf, pos + 1)[0]",
            f"        v{i} = c{i}(buf[start:pos])",
            "    elif kind == 110:",  # 'n'
            f"        v{i} = None",
            "        pos += 1",
            "    else:",
            "        raise Slow",
        ]
    lines.append("    return {" + ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names)) + "}, pos")
    namespace: dict[str, Any] = {"Slow": _Slow, "u32": _U32.unpack_from}
    namespace.update({f"c{i}": convert for i, convert in enumerate(converters)})
    exec("\n".join(lines), namespace)  # noqa: S102 - the source is built here, names only through repr()
    parse: RowParser = namespace["parse"]
    return parse


def _key_of(old: AnyRow, rel: _Relation) -> AnyRow:
    """The before row of an old-key tuple (REPLICA IDENTITY DEFAULT/INDEX): its key columns.

    A rendered one is kept whole when the replica identity is the configured key: its other columns
    were sent as NULL ('n'), so it is what the key columns alone serialize to (every other column
    null). Otherwise the tuple holds identity columns outside the key, which the typed path leaves
    out: the message declines to it."""
    if type(old) is RenderedRow:
        if not rel.key_is_identity:
            raise _Slow
        return old
    assert isinstance(old, dict)
    return {k: old[k] for k in rel.key_names}


def _render_parser(rendering: RowRendering, parsers: list[Callable[[bytes], Any]]) -> RowParser:
    """Like ``_row_parser``, generated for one relation, but returns a ``RenderedRow``: the row and its key
    in the sink format's bytes, and the key's typed values. A column with a direct renderer goes from its
    text to its encoding; any other is parsed to its typed value first (the same value the typed path
    makes) and written by ``rendering.typed``. Renderers raise ValueError on text they do not cover, and
    a NULL the format cannot render here raises ``_Slow``: either declines the whole message to the
    general path."""
    names = rendering.names
    count = len(names)
    keys = dict(zip(rendering.key_index, range(len(rendering.key_index)), strict=True))  # column -> key position
    namespace: dict[str, Any] = {
        "Slow": _Slow,
        "u32": _U32.unpack_from,
        "Row": RenderedRow,
        "fmt": rendering.row_format,
        "kfmt": rendering.key_format,
    }
    lines = ["    if buf[pos] != %d or buf[pos + 1] != %d:" % (count >> 8, count & 0xFF), "        raise Slow", "    pos += 2"]
    key_parts: list[str] = []
    for i in range(count):
        direct = rendering.render[i]
        null = rendering.null[i]
        j = keys.get(i)
        namespace[f"c{i}"] = parsers[i]
        namespace[f"t{i}"] = rendering.typed[i]
        namespace[f"n{i}"] = null
        lines += ["    kind = buf[pos]", "    if kind == 116:", "        start = pos + 5", "        pos = start + u32(buf, pos + 1)[0]"]
        if direct is not None:
            namespace[f"r{i}"] = direct
            if j is None:
                lines.append(f"        v{i} = r{i}(buf[start:pos])")
            else:
                lines += [f"        x{i} = buf[start:pos]", f"        v{i} = r{i}(x{i})", f"        k{i} = c{i}(x{i})"]
        else:
            lines += [f"        k{i} = c{i}(buf[start:pos])", f"        v{i} = t{i}(k{i})"]
        lines.append("    elif kind == 110:")
        lines.append(f"        v{i} = n{i}" if null is not None else "        raise Slow")
        if j is not None:
            lines.append(f"        k{i} = None")
        lines += ["        pos += 1", "    else:", "        raise Slow"]
        if j is not None:
            key_null = rendering.key_null[j]
            if direct is not None and key_null == null:
                key_parts.append(f"v{i}")  # the same encoding as in the row
            else:
                namespace[f"kt{j}"] = rendering.key_typed[j]
                namespace[f"kn{j}"] = key_null
                if key_null is None:
                    lines += [f"    if k{i} is None:", "        raise Slow"]
                    key_parts.append(f"kt{j}(k{i})")
                else:
                    key_parts.append(f"(kn{j} if k{i} is None else kt{j}(k{i}))")
    key_names = [names[i] for i in rendering.key_index]
    values = ", ".join(f"v{i}" for i in range(count)) + ("," if count == 1 else "")
    typed_key = "{" + ", ".join(f"{n!r}: k{i}" for n, i in zip(key_names, rendering.key_index, strict=True)) + "}"
    key_values = ", ".join(key_parts) + ("," if len(key_parts) == 1 else "")
    lines.append(f"    return Row(fmt % ({values}), {typed_key}, kfmt % ({key_values})), pos")
    params = "".join(f", {name}={name}" for name in namespace)
    source = "\n".join([f"def parse(buf, pos{params}):", *lines])
    exec(source, namespace)  # noqa: S102 - column names enter the source only through repr()
    parse: RowParser = namespace["parse"]
    parse.rendered = True  # type: ignore[attr-defined]  # the relation log says which path a table takes
    return parse


_CATALOG_BY_NAME: Final[dict[str, PgType]] = {
    t.name: t for t in (*CATALOG_TEXT_TYPES.values(), *BUILTIN_TYPES.values()) if t.kind is not TypeKind.ARRAY
}


def _announced_type(oid: int, namespace: str, name: str) -> PgType:
    """A type first met in a Type message (created after start-up): the server sends a name, no more.

    For a domain it sends the domain's OID with its base type's name; the empty namespace stands for
    pg_catalog. A domain over a built-in type is therefore known exactly (by the base's name); an
    extension type converted by name (hstore) is a base type; anything else (an enum, a composite, an
    array of those) travels as its text, kind UNKNOWN, until a restart reads the catalog.
    """
    if namespace in ("", "pg_catalog"):
        base = _CATALOG_BY_NAME.get(name)
        if base is not None:
            return PgType(oid, name, TypeKind.DOMAIN, "pg_catalog", element=base)
        return PgType(oid, name, TypeKind.UNKNOWN, "pg_catalog")
    kind = TypeKind.BASE if name in EXTENSION_TYPE_NAMES else TypeKind.UNKNOWN
    return PgType(oid, name, kind, namespace)


class _Streamed:
    """A streamed transaction not yet committed or aborted: its spool file and its Relation messages."""

    __slots__ = ("file", "relation_seqs")

    def __init__(self, file: SpooledTransaction) -> None:
        self.file = file
        self.relation_seqs: dict[int, int] = {}  # relation id -> receipt order of its last Relation here
