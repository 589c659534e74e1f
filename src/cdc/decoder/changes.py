"""From pgoutput messages to events, in commit order: the relation cache and the typed values of each row.

``ChangeDecoder.feed(payload, lsn)`` takes every pgoutput payload the server
sends and returns the events it releases. A message of an ordinary
transaction releases its event at once. A streamed transaction (protocol 2+,
``streaming 'on'``) is ``cdc.decoder.streamed``'s part of the work.

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
  columns (``announce_relations``: each also a RelationEvent, for the schema history).
  A rewrite (ALTER ... TYPE ... USING) is not decoded: rows it changed and
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
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import structlog

from cdc.decoder import pgoutput as pg
from cdc.decoder.errors import ChangeError
from cdc.decoder.fast import compiled_fast_changes
from cdc.decoder.fast import row_parser as _row_parser
from cdc.decoder.rows import Decline, RowParser, RowRenderer
from cdc.decoder.spool import Spool
from cdc.decoder.streamed import DELETE, INSERT, NO_EVENTS, UPDATE, Streamed, StreamedTransactions
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
    RelationEvent,
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
    rendered: bool = False  # ``parse`` is the renderer's: its rows are in the sink format


_U32: Final = struct.Struct(">I")
_NEW: Final = 0x4E  # 'N'
_OLD_KEY: Final = 0x4B  # 'K'
_OLD: Final = 0x4F  # 'O'
_NOTHING_UNCHANGED: Final[frozenset[str]] = frozenset()


_Slow = Decline  # the fast path declines a message; the general path decodes it (and raises whatever is wrong)


# A value the bare parsers reject declines too: the general path converts it again and names the column.
_FAST_PATH_DECLINES: Final = (_Slow, ValueConversionError, IndexError, struct.error, *PARSE_ERRORS)


class ChangeDecoder(StreamedTransactions):
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
        renderer: RowRenderer | None = None,
        announce_relations: bool = False,
    ) -> None:
        self._tables = tables
        # A RelationEvent for each Relation message of a captured table inside a transaction (the schema
        # history stage publishes the column types from it); off, a Relation only updates the cache.
        self._announce = announce_relations
        self._then: Event | None = None  # an event handle() releases after the one it returned
        self._renderer = renderer
        self._types: dict[int, PgType] = {**CATALOG_TEXT_TYPES, **BUILTIN_TYPES, **types}
        self._relations: dict[int, _Relation] = {}
        # Relations announced but not captured: a table added to the publication but not (yet) to the
        # configuration, or a partition whose changes the publication sends as its partitioned table's
        # (publish_via_partition_root: pgoutput announces both). Kept, so that a table adopted later
        # (``update_tables``) is decoded from the same message.
        self._uncaptured: dict[int, pg.Relation] = {}
        # Changes skipped per uncaptured table (metric cdc_uncaptured_changes_total; the reloader adopts or
        # reports each table once it appears here).
        self.uncaptured: Counter[str] = Counter()
        self._partitions = _partitions_of(tables)
        self._oids = {name: info.oid for name, info in tables.items() if info.oid}  # what the catalog said
        self.recreated: set[str] = set()  # tables seen under a new oid (the reloader snapshots them)
        self._xid: int | None = None
        self._commit_lsn = Lsn(0)
        self._commit_ts = self._ordinal = self._last_lsn = 0  # _last_lsn: of the transaction's last row change
        self._spool = spool
        self._seq = 0  # Relation messages received so far, streamed or not
        self._block: Streamed | None = None  # the transaction of the open Stream Start block
        self._streamed: dict[int, Streamed] = {}
        self._replaying = False
        self._replay_in_progress: Generator[Event, None, None] | None = None
        fast = compiled_fast_changes()
        if fast is not None:
            # The fast path compiled (cdc.decoder._changes): this method's work, _change's and change_event's
            # in one call; the same events, the same declines.
            self._fast_change = fast(  # type: ignore[method-assign]
                self,
                self._reference_fast_change,
                ChangeEvent,
                (Op.CREATE, Op.UPDATE, Op.DELETE),
                _key_of,
                _FAST_PATH_DECLINES,
                _NOTHING_UNCHANGED,
            )

    def update_tables(self, tables: Mapping[str, TableInfo], types: Mapping[int, PgType]) -> None:
        """A reloaded table list; Relation messages that follow use it."""
        self._tables = tables
        self._types.update(types)
        self._partitions = _partitions_of(tables)
        self._oids = {name: info.oid for name, info in tables.items() if info.oid}
        for relation_id, message in list(self._uncaptured.items()):
            if f"{message.namespace}.{message.name}" in tables:  # adopted: decode it from now on
                del self._uncaptured[relation_id]
                self._seq += 1
                self._relations[relation_id] = self._build_relation(message, self._seq)

    def set_renderer(self, renderer: RowRenderer | None) -> None:
        """Ask ``renderer`` again for every known table (what may be rendered changed: a reload)."""
        self._renderer = renderer
        for relation_id, rel in list(self._relations.items()):
            parse = self._parser(rel.schema, rel.names)
            self._relations[relation_id] = replace(rel, parse=parse, rendered=getattr(parse, "rendered", False))

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
        self._then = None
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
        if kind == INSERT or kind == UPDATE or kind == DELETE:
            fast = self._fast_change(kind, buf, 1, lsn)
            if fast is not None:
                return (fast,)
        message = pg.decode(buf)
        mtype = type(message)
        if mtype is pg.StreamStart or mtype is pg.StreamCommit or mtype is pg.StreamAbort or mtype is pg.StreamStop:
            return self._stream_control(message, lsn)
        event = self.handle(message, lsn)
        if event is None:
            return NO_EVENTS
        then, self._then = self._then, None  # a recreated table's truncate marker, then its columns
        return (event,) if then is None else (event, then)

    # -- one message of an ordinary transaction ---------------------------------------------------

    def handle(self, message: pg.Message, lsn: Lsn) -> Event | None:
        """The event for one message (None for messages that only update state)."""
        match message:
            case pg.Insert(relation_id=rid) | pg.Update(relation_id=rid) | pg.Delete(relation_id=rid) if (
                rid in self._uncaptured
            ):
                self._skip(rid)
                return None
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
                self._xid, self._commit_lsn, self._commit_ts, self._ordinal, self._last_lsn = xid, commit_lsn, ts, 0, 0
                return TxBegin(xid, commit_lsn, ts)
            case pg.Commit(commit_lsn=commit_lsn, end_lsn=end_lsn, commit_ts_us=ts):
                xid = self._xid if self._xid is not None else 0
                count = self._ordinal
                self._xid, self._ordinal = None, 0
                return TxCommit(xid, commit_lsn, end_lsn, ts, count)
            case pg.Relation(namespace=ns, name=name) if f"{ns}.{name}" not in self._tables:
                self._relations.pop(message.relation_id, None)
                self._uncaptured[message.relation_id] = message
                return None
            case pg.Relation():
                self._seq += 1
                self._uncaptured.pop(message.relation_id, None)
                rel = self._relations[message.relation_id] = self._build_relation(message, self._seq)
                qualified = rel.schema.qualified
                columns_event = (
                    RelationEvent(rel.schema, self._commit_lsn, self._ordinal + 1, self._xid, self._last_lsn)
                    if self._announce and self._xid is not None
                    else None
                )
                if self._oids.get(qualified, message.relation_id) != message.relation_id:
                    # The same name, another table: it was dropped and created again while we streamed. Its
                    # topic still holds the old table's rows (a DROP sends no deletes): a truncate marker
                    # first; the reloader then snapshots the new table (decoder.recreated).
                    self._oids[qualified] = message.relation_id
                    self.recreated.add(qualified)
                    log.warning("table_recreated", table=qualified, oid=message.relation_id)
                    self._ordinal += 1
                    if columns_event is not None:  # the new table's columns hold from the change after the marker
                        self._then = RelationEvent(
                            rel.schema, self._commit_lsn, self._ordinal + 1, self._xid, self._last_lsn
                        )
                    return TruncateEvent(
                        (rel.schema,), False, False, self._commit_lsn, lsn, self._xid, self._ordinal, self._commit_ts
                    )
                return columns_event
            case pg.Type(type_oid=oid, namespace=ns, name=name):
                if oid not in self._types:
                    announced = _announced_type(oid, ns, name)
                    self._types[oid] = announced
                    log.info("type_announced", type=f"{announced.schema}.{name}", oid=oid, kind=announced.kind.value)
                return None
            case pg.Truncate(relation_ids=rids, cascade=cascade, restart_identity=restart):
                for r in rids:
                    if r in self._uncaptured:
                        self._skip(r)
                captured = [r for r in rids if r not in self._uncaptured]
                if not captured:
                    return None
                self._ordinal += 1
                schemas = tuple(self._relation(r).schema for r in captured)
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

    def _reference_fast_change(self, kind: int, buf: bytes, at: int, lsn: Lsn) -> ChangeEvent | None:
        return ChangeDecoder._fast_change(self, kind, buf, at, lsn)

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
            if kind == INSERT:
                if marker != _NEW:
                    return None
                after, end = parse(buf, at + 5)
                before = None
                op = Op.CREATE
            elif kind == UPDATE:
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
        self._last_lsn = lsn
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
        for name, convert, raw in zip(rel.names, rel.converters, values, strict=False):
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

    def _skip(self, relation_id: int) -> None:
        """A change of a table the publication sends but the configuration does not capture: counted, so
        the reloader adopts the table (a configured pattern matches it) or reports it once. A partition of
        a captured table is another matter: its rows belong in that table's topic."""
        message = self._uncaptured[relation_id]
        qualified = f"{message.namespace}.{message.name}"
        if qualified in self._partitions:
            raise ChangeError(
                f"the publication sent changes of {qualified} as its own, but it is a partition of a captured "
                "table, whose topic must carry them: the publication lacks publish_via_partition_root. Fix: "
                "ALTER PUBLICATION <publication> SET (publish_via_partition_root = true); and restart."
            )
        self.uncaptured[qualified] += 1

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
        rendered = getattr(parse, "rendered", False)
        log.info(
            "relation",
            table=qualified,
            columns=len(columns),
            replica_identity=str(msg.replica_identity),
            rendered=rendered,
        )
        key_is_identity = all(c.is_key == (c.name in info.key) for c in msg.columns)
        return _Relation(schema, names, tuple(converters), key_names, seq, parse, key_is_identity, rendered)

    def _parser(self, schema: TableSchema, names: tuple[str, ...]) -> RowParser:
        """The fast path's row parser: the renderer's, when it renders the table, else typed values."""
        parsers = [parser_for(c.type) for c in schema.columns]
        rendered = self._renderer.parser(schema, parsers) if self._renderer is not None else None
        return rendered if rendered is not None else _row_parser(names, parsers)


def _partitions_of(tables: Mapping[str, TableInfo]) -> frozenset[str]:
    return frozenset(p for info in tables.values() for p in info.partitions)


def _key_of(old: AnyRow, rel: _Relation) -> AnyRow:
    """The before row of an old-key tuple (REPLICA IDENTITY DEFAULT/INDEX): its key columns.

    A rendered one is kept whole when the replica identity is the configured key: its other columns
    were sent as NULL ('n'), so it is what the key columns alone serialize to (every other column
    null). Otherwise the tuple holds identity columns outside the key, which the typed path leaves
    out: the message declines to it."""
    if rel.rendered:
        if not rel.key_is_identity:
            raise _Slow
        return old
    return {k: old[k] for k in rel.key_names}


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
