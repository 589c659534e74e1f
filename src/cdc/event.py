"""The values that travel between the layers: table schemas, change events, transaction boundaries.

The decoder and the snapshot produce these; the outbox and the sink consume them.
Neither side sees the other's internals (protocol messages, Kafka records).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Final, Protocol

from cdc.lsn import Lsn


class Op(enum.StrEnum):
    """Debezium's operation codes of a row change (a truncate, ``t``, and a message, ``m``, are events of their own)."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"  # snapshot read


class TypeKind(enum.Enum):
    BASE = "base"
    ARRAY = "array"
    ENUM = "enum"
    DOMAIN = "domain"
    RANGE = "range"
    MULTIRANGE = "multirange"
    COMPOSITE = "composite"
    UNKNOWN = "unknown"  # the decoder does not know it: the value travels as text


@dataclass(frozen=True, slots=True)
class PgType:
    """A PostgreSQL type as the decoder resolved it from the catalog."""

    oid: int
    name: str  # pg_type.typname, e.g. "int4", "_text", "mood"
    kind: TypeKind = TypeKind.BASE
    schema: str = "pg_catalog"
    element: PgType | None = None  # arrays: element type; domains: base type; ranges: subtype
    labels: tuple[str, ...] = ()  # enums, in sort order


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: PgType
    modifier: int = -1  # atttypmod: length, precision/scale, time precision; -1 when none
    key: bool = False  # part of the event key
    nullable: bool = True

    @property
    def precision_scale(self) -> tuple[int, int] | None:
        """numeric(p, s) from the type modifier, or None when unconstrained."""
        if self.modifier < 4:
            return None
        mod = self.modifier - 4
        # The scale is an 11-bit signed field (PostgreSQL 15 allows negative scales).
        return (mod >> 16) & 0xFFFF, ((mod & 0x7FF) ^ 0x400) - 0x400


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A captured table's columns as of the event (changes with each Relation message)."""

    schema: str
    name: str
    columns: tuple[Column, ...]
    relation_id: int = 0
    replica_identity: str = "d"  # d default, f full, i index, n nothing
    qualified: str = field(init=False, repr=False, compare=False)  # "schema.name", made once: read per row

    def __post_init__(self) -> None:
        object.__setattr__(self, "qualified", f"{self.schema}.{self.name}")

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.key)


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A captured table as the catalog describes it (``cdc.catalog.describe_tables``), before any Relation.

    What the decoder and the snapshot need of a table the catalog read: its replica identity, the
    event key and the published columns. Defined here, beside ``TableSchema``, so that the decoder
    depends on no catalog or configuration code.
    """

    schema: str
    name: str
    oid: int
    replica_identity: str  # d default, f full, i index, n nothing
    key: tuple[str, ...]  # the event key columns, in table column order
    columns: tuple[str, ...]
    not_null: frozenset[str]
    partitions: frozenset[str] = frozenset()  # a partitioned table's partitions (qualified), at any depth
    # What the publication publishes of it (PostgreSQL 15+): its row filter, and its column list when the
    # list leaves columns out. Snapshots copy exactly that, so that they agree with the stream.
    row_filter: str | None = None
    published_columns: tuple[str, ...] | None = None

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


Row = dict[str, Any]


class KeyedRow(Protocol):
    """What every row offers for its key columns: a typed row (``dict``) and a row the decoder wrote in the
    sink format (``cdc.sink.rendering.RenderedRow``, whose other columns have no typed value) alike."""

    def __getitem__(self, column: str) -> Any: ...

    def get(self, column: str, default: Any = None) -> Any: ...

    def __contains__(self, column: object) -> bool: ...


AnyRow = Row | KeyedRow


@dataclass(frozen=True, slots=True)
class TransactionBlock:
    """Debezium's ``transaction`` member of a change event (``transaction_metadata: true``): the transaction's
    id as in its BEGIN and END records, the event's place in it, and its place among the same table's."""

    id: str
    total_order: int
    data_collection_order: int

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "total_order": self.total_order, "data_collection_order": self.data_collection_order}


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One row change (c, u, d) or snapshot read (r).

    ``before`` is what the replica identity gives: the key columns for a delete
    under REPLICA IDENTITY DEFAULT, the whole old row under FULL, None when the
    server sent no old tuple. ``unchanged`` names the TOASTed columns that an
    update did not send; they hold ``UNCHANGED_TOAST`` in ``after``.
    """

    op: Op
    table: TableSchema
    before: AnyRow | None  # a rendered row when the decoder writes the table's rows in the sink format
    after: AnyRow | None
    commit_lsn: Lsn  # LSN of the commit record of the transaction (snapshot: the slot's consistent point)
    lsn: Lsn  # the event's own LSN (snapshot: the consistent point)
    xid: int | None
    ordinal: int  # position within its transaction, from 1
    commit_ts_us: int  # commit time, microseconds since the Unix epoch
    snapshot: bool = False
    unchanged: frozenset[str] = field(default_factory=frozenset)
    transaction: TransactionBlock | None = None  # set by the transaction metadata stage, when it is on

    def key(self) -> Row:
        """The event key: key columns from ``after``, or from ``before`` for a delete."""
        row = self.after if self.after is not None else self.before
        assert row is not None, "a change event has a before or an after"
        return {c.name: row[c.name] for c in self.table.key_columns}

    def old_key(self) -> Row | None:
        """The key before an update, when the server sent the old tuple; else None."""
        before = self.before
        if before is None:
            return None
        return {c.name: before[c.name] for c in self.table.key_columns}


def _change_event_factory() -> Callable[..., ChangeEvent]:
    """``ChangeEvent(...)`` without the frozen dataclass's ``__init__``, which sets each of the eleven
    fields through ``object.__setattr__`` (about twice the cost of the whole row's parsing). The
    slots are filled through their descriptors; the event stays as immutable as any other."""
    new = object.__new__
    slots = [ChangeEvent.__dict__[name].__set__ for name in ChangeEvent.__slots__]
    assert list(ChangeEvent.__slots__) == [f.name for f in fields(ChangeEvent)], "fields and slots must agree"
    s_op, s_table, s_before, s_after, s_commit_lsn, s_lsn, s_xid, s_ordinal, s_ts, s_snapshot, s_unchanged, s_tx = slots

    def change_event(
        op: Op,
        table: TableSchema,
        before: AnyRow | None,
        after: AnyRow | None,
        commit_lsn: Lsn,
        lsn: Lsn,
        xid: int | None,
        ordinal: int,
        commit_ts_us: int,
        snapshot: bool,
        unchanged: frozenset[str],
    ) -> ChangeEvent:
        event: ChangeEvent = new(ChangeEvent)
        s_op(event, op)
        s_table(event, table)
        s_before(event, before)
        s_after(event, after)
        s_commit_lsn(event, commit_lsn)
        s_lsn(event, lsn)
        s_xid(event, xid)
        s_ordinal(event, ordinal)
        s_ts(event, commit_ts_us)
        s_snapshot(event, snapshot)
        s_unchanged(event, unchanged)
        s_tx(event, None)
        return event

    return change_event


change_event: Final = _change_event_factory()
"""The per-row way to build a ``ChangeEvent``: the first eleven fields, positionally, no defaults (the
transaction block is None; the transaction metadata stage sets it on a copy)."""


@dataclass(frozen=True, slots=True)
class TruncateEvent:
    tables: tuple[TableSchema, ...]
    cascade: bool
    restart_identity: bool
    commit_lsn: Lsn
    lsn: Lsn
    xid: int | None
    ordinal: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class MessageEvent:
    """A logical decoding message (``pg_logical_emit_message``)."""

    prefix: str
    content: bytes
    transactional: bool
    commit_lsn: Lsn | None  # None for a non-transactional message
    lsn: Lsn
    xid: int | None
    ordinal: int
    commit_ts_us: int | None


@dataclass(frozen=True, slots=True)
class TxBegin:
    xid: int
    commit_lsn: Lsn
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class TxCommit:
    """End of a transaction: everything up to ``end_lsn`` may be confirmed once delivered."""

    xid: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int
    event_count: int


@dataclass(frozen=True, slots=True)
class RelationEvent:
    """A captured table's columns as a Relation message announced them, inside a transaction: they hold
    from its change number ``ordinal`` on (the next change's ordinal; the message itself takes none).

    The decoder emits these only when asked (``announce_relations``); the schema history stage publishes a
    version when the column types differ from the one in force (``cdc.schema_history``)."""

    table: TableSchema
    commit_lsn: Lsn
    ordinal: int
    xid: int | None
    # The LSN of its transaction's last row change before it (0: none): the columns hold for the changes after
    # it. (Not the message's own: the server sends a Relation message with LSN 0, only a change's carries one.)
    after_lsn: int = 0


Event = ChangeEvent | TruncateEvent | MessageEvent | TxBegin | TxCommit | RelationEvent
