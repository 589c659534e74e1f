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

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import structlog

from cdc.compiled import CHOSEN
from cdc.decoder import pgoutput as pg
from cdc.decoder.errors import ChangeError
from cdc.decoder.fast import FastChange, build_fast_change
from cdc.decoder.fast import row_parser as _row_parser
from cdc.decoder.rows import RowParser, RowRenderer
from cdc.decoder.spool import Spool
from cdc.decoder.state import DecodedRelation, TxState
from cdc.decoder.streamed import DELETE, INSERT, NO_EVENTS, UPDATE, StreamedTransactions
from cdc.decoder.types import (
    BUILTIN_TYPES,
    CATALOG_TEXT_TYPES,
    EXTENSION_TYPE_NAMES,
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

if TYPE_CHECKING:
    from cdc.decoder._changes import FastChanges

log = structlog.get_logger(__name__)

CHOSEN_FAST_CHANGES: Final[type[FastChanges] | None] = CHOSEN.compiled("decoder", "FastChanges")
"""The compiled fast path ``cdc.compiled`` chose for this process, or None: the reference (not built, or
``CDC_PURE_PYTHON``)."""


class ChangeDecoder:
    """Turns the pgoutput messages of a replication connection into events, in commit order.

    ``feed`` takes raw payloads (streamed transactions need a ``spool``);
    ``handle`` takes one decoded message of an ordinary transaction. ``fast_changes`` is the compiled fast
    path of row changes (``cdc.decoder._changes``), or None: its reference (``cdc.decoder.fast``); by default
    the process's choice.
    """

    def __init__(
        self,
        tables: Mapping[str, TableInfo],
        types: Mapping[int, PgType],
        *,
        spool: Spool | None = None,
        renderer: RowRenderer | None = None,
        announce_relations: bool = False,
        fast_changes: type[FastChanges] | None = CHOSEN_FAST_CHANGES,
    ) -> None:
        self._tables = tables
        # A RelationEvent for each Relation message of a captured table inside a transaction (the schema
        # history stage publishes the column types from it); off, a Relation only updates the cache.
        self._announce = announce_relations
        self._then: Event | None = None  # an event handle() releases after the one it returned
        self._renderer = renderer
        self._types: dict[int, PgType] = {**CATALOG_TEXT_TYPES, **BUILTIN_TYPES, **types}
        # The transaction in decoding and the relation cache, shared with the fast path and the streamed part.
        self._tx = TxState()
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
        self._seq = 0  # Relation messages received so far, streamed or not
        # Insert, Update and Delete of the common shapes, parsed and made into events in one call (compiled
        # or not: the same events, the same declines); None: the general path decodes the message.
        self._fast_change = build_fast_change(self._tx, fast_changes)
        self._streamed = StreamedTransactions(self._tx, spool, self._fast_change, self._events, self._next_seq)

    def update_tables(self, tables: Mapping[str, TableInfo], types: Mapping[int, PgType]) -> None:
        """A reloaded table list; Relation messages that follow use it."""
        self._tables = tables
        self._types.update(types)
        self._partitions = _partitions_of(tables)
        self._oids = {name: info.oid for name, info in tables.items() if info.oid}
        for relation_id, message in list(self._uncaptured.items()):
            if f"{message.namespace}.{message.name}" in tables:  # adopted: decode it from now on
                del self._uncaptured[relation_id]
                self._tx.relations[relation_id] = self._build_relation(message, self._next_seq())

    def set_renderer(self, renderer: RowRenderer | None) -> None:
        """Ask ``renderer`` again for every known table (what may be rendered changed: a reload)."""
        self._renderer = renderer
        relations = self._tx.relations
        for relation_id, rel in list(relations.items()):
            parse = self._parser(rel.schema, rel.names)
            relations[relation_id] = replace(rel, parse=parse, rendered=getattr(parse, "rendered", False))

    def reset(self) -> None:
        """Forget per-connection state: the server resends Relation messages and streamed transactions."""
        self._streamed.reset()  # first: an unfinished replay puts the relation cache back
        self._tx.relations.clear()
        self._uncaptured.clear()
        self._tx.end()
        self._then = None

    def table(self, relation_id: int) -> TableSchema:
        return self._relation(relation_id).schema

    @property
    def tx(self) -> TxState:
        """The transaction being decoded and the relation cache (read-only for callers: the decoder moves it)."""
        return self._tx

    @property
    def fast_change(self) -> FastChange:
        """The fast path chosen at construction: the compiled ``FastChanges`` or the reference's bound method."""
        return self._fast_change

    # -- raw payloads, streamed transactions included ---------------------------------------------

    def feed(self, payload: bytes | memoryview, lsn: Lsn) -> Iterable[Event]:
        """The events one pgoutput payload releases, in commit order.

        Usually zero or one. A Stream Commit releases the whole streamed
        transaction, read back from the spool as the result is iterated: iterate
        it to the end before feeding the next payload. ``payload`` may be a
        memoryview into a buffer that is reused afterwards.
        """
        streamed = self._streamed
        if streamed.replaying:
            raise ChangeError(
                "a payload was fed while the events of a streamed transaction were still being read: "
                "iterate the result of feed() to the end first"
            )
        block = streamed.block
        if block is not None:
            return streamed.in_block(block, payload, lsn)
        buf = payload.tobytes() if isinstance(payload, memoryview) else payload  # tobytes: 4x cheaper than bytes()
        kind = buf[0] if buf else -1
        if kind == INSERT or kind == UPDATE or kind == DELETE:
            fast = self._fast_change(kind, buf, 1, lsn)
            if fast is not None:
                return (fast,)
        message = pg.decode(buf)
        mtype = type(message)
        if mtype is pg.StreamStart or mtype is pg.StreamCommit or mtype is pg.StreamAbort or mtype is pg.StreamStop:
            return streamed.stream_control(message, lsn)
        return self._events(message, lsn)

    def _events(self, message: pg.Message, lsn: Lsn) -> tuple[Event, ...]:
        """What ``handle`` returns, and the event it releases after it, if any."""
        event = self.handle(message, lsn)
        if event is None:
            return NO_EVENTS
        then, self._then = self._then, None  # a recreated table's truncate marker, then its columns
        return (event,) if then is None else (event, then)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- one message of an ordinary transaction ---------------------------------------------------

    def handle(self, message: pg.Message, lsn: Lsn) -> Event | None:
        """The event for one message (None for messages that only update state)."""
        handler = _HANDLERS.get(type(message))
        if handler is None:
            raise ChangeError(
                f"unexpected {type(message).__name__} message: two-phase decoding is not enabled on this "
                "connection (prepared transactions arrive at COMMIT PREPARED)"
            )
        return handler(self, message, lsn)

    def _on_begin(self, message: pg.Begin, lsn: Lsn) -> Event | None:
        self._tx.begin(message.xid, message.final_lsn, message.commit_ts_us)
        return TxBegin(message.xid, message.final_lsn, message.commit_ts_us)

    def _on_commit(self, message: pg.Commit, lsn: Lsn) -> Event | None:
        tx = self._tx
        xid = tx.xid if tx.xid is not None else 0
        return TxCommit(xid, message.commit_lsn, message.end_lsn, message.commit_ts_us, tx.end())

    def _on_insert(self, message: pg.Insert, lsn: Lsn) -> Event | None:
        if message.relation_id in self._uncaptured:
            self._skip(message.relation_id)
            return None
        rel = self._relation(message.relation_id)
        return self._change(Op.CREATE, rel, None, self._row(rel, message.new), lsn)

    def _on_update(self, message: pg.Update, lsn: Lsn) -> Event | None:
        if message.relation_id in self._uncaptured:
            self._skip(message.relation_id)
            return None
        rel = self._relation(message.relation_id)
        after = self._row(rel, message.new)
        before = None
        old = message.old
        if old is not None:
            before = self._row(rel, old)
        elif message.old_key is not None:
            before = self._key_row(rel, message.old_key)
        unchanged = frozenset(n for n, v in after.items() if v is UNCHANGED_TOAST)
        if unchanged and before is not None and old is not None:
            # REPLICA IDENTITY FULL: the old tuple holds the real values.
            for name in list(unchanged):
                value = before.get(name, UNCHANGED_TOAST)
                if value is not UNCHANGED_TOAST:
                    after[name] = value
            unchanged = frozenset(n for n, v in after.items() if v is UNCHANGED_TOAST)
        return self._change(Op.UPDATE, rel, before, after, lsn, unchanged)

    def _on_delete(self, message: pg.Delete, lsn: Lsn) -> Event | None:
        if message.relation_id in self._uncaptured:
            self._skip(message.relation_id)
            return None
        rel = self._relation(message.relation_id)
        if message.old is not None:
            before = self._row(rel, message.old)
        elif message.old_key is not None:
            before = self._key_row(rel, message.old_key)
        else:
            raise ChangeError(
                f"a delete on {rel.schema.qualified} arrived without an old key "
                "(REPLICA IDENTITY NOTHING?): set REPLICA IDENTITY DEFAULT or FULL"
            )
        return self._change(Op.DELETE, rel, before, None, lsn)

    def _on_relation(self, message: pg.Relation, lsn: Lsn) -> Event | None:
        relations = self._tx.relations
        if f"{message.namespace}.{message.name}" not in self._tables:
            relations.pop(message.relation_id, None)
            self._uncaptured[message.relation_id] = message
            return None
        self._uncaptured.pop(message.relation_id, None)
        rel = relations[message.relation_id] = self._build_relation(message, self._next_seq())
        tx = self._tx
        announce = self._announce and tx.xid is not None
        qualified = rel.schema.qualified
        if self._oids.get(qualified, message.relation_id) == message.relation_id:
            return RelationEvent(rel.schema, tx.commit_lsn, tx.ordinal + 1, tx.xid, tx.last_lsn) if announce else None
        # The same name, another table: it was dropped and created again while we streamed. Its topic still
        # holds the old table's rows (a DROP sends no deletes): a truncate marker first; the reloader then
        # snapshots the new table (decoder.recreated).
        self._oids[qualified] = message.relation_id
        self.recreated.add(qualified)
        log.warning("table_recreated", table=qualified, oid=message.relation_id)
        tx.ordinal += 1
        if announce:  # the new table's columns hold from the change after the marker
            self._then = RelationEvent(rel.schema, tx.commit_lsn, tx.ordinal + 1, tx.xid, tx.last_lsn)
        return TruncateEvent((rel.schema,), False, False, tx.commit_lsn, lsn, tx.xid, tx.ordinal, tx.commit_ts)

    def _on_type(self, message: pg.Type, lsn: Lsn) -> Event | None:
        oid = message.type_oid
        if oid not in self._types:
            announced = _announced_type(oid, message.namespace, message.name)
            self._types[oid] = announced
            log.info("type_announced", type=f"{announced.schema}.{message.name}", oid=oid, kind=announced.kind.value)
        return None

    def _on_truncate(self, message: pg.Truncate, lsn: Lsn) -> Event | None:
        for r in message.relation_ids:
            if r in self._uncaptured:
                self._skip(r)
        captured = [r for r in message.relation_ids if r not in self._uncaptured]
        if not captured:
            return None
        tx = self._tx
        tx.ordinal += 1
        schemas = tuple(self._relation(r).schema for r in captured)
        return TruncateEvent(
            schemas,
            message.cascade,
            message.restart_identity,
            tx.commit_lsn,
            lsn,
            tx.xid,
            tx.ordinal,
            tx.commit_ts,
        )

    def _on_logical_message(self, message: pg.LogicalMessage, lsn: Lsn) -> Event | None:
        tx = self._tx
        if not message.transactional:
            return MessageEvent(message.prefix, message.content, False, None, message.lsn, None, 0, None)
        tx.ordinal += 1
        return MessageEvent(
            message.prefix, message.content, True, tx.commit_lsn, message.lsn, tx.xid, tx.ordinal, tx.commit_ts
        )

    def _on_origin(self, message: pg.Origin, lsn: Lsn) -> Event | None:
        return None

    def _on_stream_control(self, message: pg.Message, lsn: Lsn) -> Event | None:
        raise ChangeError(
            f"a {type(message).__name__} message was handed to handle(), which takes the messages of "
            "ordinary transactions: feed() the raw payloads of a streaming connection"
        )

    # -- helpers --------------------------------------------------------------------------------

    def _relation(self, relation_id: int) -> DecodedRelation:
        try:
            return self._tx.relations[relation_id]
        except KeyError:
            raise ChangeError(
                f"a change for relation {relation_id} arrived before its Relation message (protocol violation)"
            ) from None

    def _change(
        self,
        op: Op,
        rel: DecodedRelation,
        before: AnyRow | None,
        after: AnyRow | None,
        lsn: Lsn,
        unchanged: frozenset[str] = frozenset(),
    ) -> ChangeEvent:
        tx = self._tx
        ordinal = tx.ordinal = tx.ordinal + 1
        tx.last_lsn = lsn
        return change_event(
            op, rel.schema, before, after, tx.commit_lsn, lsn, tx.xid, ordinal, tx.commit_ts, False, unchanged
        )

    def _row(self, rel: DecodedRelation, data: pg.TupleData) -> Row:
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

    def _key_row(self, rel: DecodedRelation, data: pg.TupleData) -> Row:
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

    def _build_relation(self, msg: pg.Relation, seq: int) -> DecodedRelation:
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
        return DecodedRelation(schema, names, tuple(converters), key_names, seq, parse, key_is_identity, rendered)

    def _parser(self, schema: TableSchema, names: tuple[str, ...]) -> RowParser:
        """The fast path's row parser: the renderer's, when it renders the table, else typed values."""
        parsers = [parser_for(c.type) for c in schema.columns]
        rendered = self._renderer.parser(schema, parsers) if self._renderer is not None else None
        return rendered if rendered is not None else _row_parser(names, parsers)


def _partitions_of(tables: Mapping[str, TableInfo]) -> frozenset[str]:
    return frozenset(p for info in tables.values() for p in info.partitions)


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


_HANDLERS: Final[dict[type, Callable[[ChangeDecoder, Any, Lsn], Event | None]]] = {
    pg.Begin: ChangeDecoder._on_begin,
    pg.Commit: ChangeDecoder._on_commit,
    pg.Insert: ChangeDecoder._on_insert,
    pg.Update: ChangeDecoder._on_update,
    pg.Delete: ChangeDecoder._on_delete,
    pg.Relation: ChangeDecoder._on_relation,
    pg.Type: ChangeDecoder._on_type,
    pg.Truncate: ChangeDecoder._on_truncate,
    pg.LogicalMessage: ChangeDecoder._on_logical_message,
    pg.Origin: ChangeDecoder._on_origin,
    pg.StreamStart: ChangeDecoder._on_stream_control,
    pg.StreamStop: ChangeDecoder._on_stream_control,
    pg.StreamCommit: ChangeDecoder._on_stream_control,
    pg.StreamAbort: ChangeDecoder._on_stream_control,
}
"""``handle``'s dispatch by message class; any other message (two-phase decoding's) is an error."""
