"""From pgoutput messages to events: the relation cache and the typed values of each row.

Pure with respect to I/O: the catalog facts it needs (key columns, resolved
types) are handed in at construction; the only runtime input is messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from cdc.catalog import TableInfo
from cdc.decoder import pgoutput as pg
from cdc.decoder.types import BUILTIN_TYPES, ValueConversionError, converter_for
from cdc.event import (
    ChangeEvent,
    Column,
    Event,
    MessageEvent,
    Op,
    PgType,
    Row,
    TableSchema,
    TruncateEvent,
    TxBegin,
    TxCommit,
    TypeKind,
)
from cdc.lsn import Lsn
from cdc.values import UNCHANGED_TOAST

log = structlog.get_logger(__name__)


class ChangeError(Exception):
    """A message that cannot become an event; the pipeline stops rather than skip it."""


@dataclass(frozen=True, slots=True)
class _Relation:
    schema: TableSchema
    names: tuple[str, ...]
    converters: tuple[Callable[[bytes], Any], ...]
    key_names: tuple[str, ...]


class ChangeDecoder:
    """Turns a stream of decoded pgoutput messages into events, in commit order."""

    def __init__(self, tables: Mapping[str, TableInfo], types: Mapping[int, PgType]) -> None:
        self._tables = tables
        self._types: dict[int, PgType] = {**BUILTIN_TYPES, **types}
        self._relations: dict[int, _Relation] = {}
        self._xid: int | None = None
        self._commit_lsn = Lsn(0)
        self._commit_ts = 0
        self._ordinal = 0

    def reset(self) -> None:
        """Forget per-connection state: the server resends Relation messages on a new connection."""
        self._relations.clear()
        self._xid = None
        self._ordinal = 0

    def table(self, relation_id: int) -> TableSchema:
        return self._relation(relation_id).schema

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
            case pg.Relation():
                self._relations[message.relation_id] = self._build_relation(message)
                return None
            case pg.Type(type_oid=oid, namespace=ns, name=name):
                if oid not in self._types:
                    self._types[oid] = PgType(oid, name, TypeKind.UNKNOWN, ns)
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
            case _:
                raise ChangeError(
                    f"unexpected {type(message).__name__} message: streaming and two-phase decoding are not "
                    "enabled on this connection"
                )

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
        before: Row | None,
        after: Row | None,
        lsn: Lsn,
        unchanged: frozenset[str] = frozenset(),
    ) -> ChangeEvent:
        self._ordinal += 1
        return ChangeEvent(
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

    def _build_relation(self, msg: pg.Relation) -> _Relation:
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
        for c in msg.columns:
            pg_type = self._types.get(c.type_oid) or PgType(c.type_oid, f"oid:{c.type_oid}", TypeKind.UNKNOWN)
            columns.append(
                Column(c.name, pg_type, c.type_modifier, key=c.name in info.key, nullable=c.name not in info.not_null)
            )
            converters.append(converter_for(pg_type, c.type_modifier))
        schema = TableSchema(msg.namespace, msg.name, tuple(columns), msg.relation_id, str(msg.replica_identity))
        log.info("relation", table=qualified, columns=len(columns), replica_identity=str(msg.replica_identity))
        return _Relation(schema, names, tuple(converters), info.key)
