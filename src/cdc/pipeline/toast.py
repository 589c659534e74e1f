"""Unchanged TOASTed values filled before a transaction's records are produced.

Under REPLICA IDENTITY DEFAULT (or INDEX), pgoutput leaves out of an UPDATE every
value stored out of line (TOAST) that the update did not change; the decoder marks
those columns ``unchanged`` and leaves ``UNCHANGED_TOAST`` in ``after``. Under FULL
the decoder takes them from the old row, and nothing reaches this module. A record
written with Debezium's placeholder would be the last record of its key once the
log cleaner has run, and the value would then exist nowhere in the topic.

``ToastFill`` sits between the decoder and the loop's handling of each event
(``cdc.pipeline.loop``), for the tables whose ``toast`` mode is ``fill``:

1. An event that needs filling is held, and so is every event after it, commits
   included, so that everything still reaches the chain and delivery in commit order.
2. Once the stream has no frame waiting (the loop asks without blocking while events
   are held), or ``toast.fill_batch`` events are held, the held rows' keys are read
   in one query per table (``ValueReader``), the values are filled in, and the held
   events go on in their order. Under a backlog of small transactions one query thus
   serves many of them; a caught-up stream releases each transaction at once.
3. A held transaction's BEGIN and COMMIT reach delivery only with its rows: the
   position confirmed to PostgreSQL and the exactly-once Kafka transaction cover the
   filled records as they cover every other (invariants 1 and 2 are the loop's,
   unchanged). Held events that a lost session never released come again from the
   slot.

What a reader sees (docs/operations.md, "Unchanged TOASTed values"):

- the value read is the row's current one, which may be newer than the event: a
  later transaction that changed the column committed before the read. That later
  transaction's own records follow, so the last record of every key is exact;
- when the row is gone (deleted, or its key changed, before the read), the columns
  keep the placeholder, the event is counted in ``cdc_toast_unresolved_total`` and
  logged (``toast_fill_row_gone``). The delete (and its tombstone) that removed the row
  follows on the same key, so compaction never leaves that placeholder as a key's
  last record.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

import psycopg
import structlog
from psycopg import sql

from cdc.config import Config
from cdc.decoder.types import ValueConversionError, converter_for
from cdc.event import ChangeEvent, Column, Event, TableSchema, TypeKind
from cdc.lsn import Lsn
from cdc.replication import ConnectionLost
from cdc.selection import entry_for
from cdc.values import Infinity

log = structlog.get_logger("cdc.pipeline")

Key = tuple[Any, ...]

_KEYS_PER_QUERY: Final = 1000  # a query's parameters stay far below the protocol's 65,535 with wide keys


class ToastFillError(Exception):
    """A fill that cannot be done for a reason no retry mends; the message names the table and the fix."""


class ValueReader(Protocol):
    """Where filled values come from: the source table, read by key (``SourceReader``), or a dict in tests."""

    def read(
        self, table: TableSchema, columns: Sequence[str], keys: Sequence[Key], at_least: int, xids: Sequence[int]
    ) -> dict[Key, dict[str, Any]]:
        """The current typed values of ``columns`` for each key whose row exists; a key that is absent from
        the result has no row any more. The state read includes the events' own transactions (``xids``) and
        every one up to ``at_least`` (their commit LSN): never older than the events."""
        ...

    def close(self) -> None: ...


@dataclass
class ToastCounts:
    """What the fill did, per table: values filled, events left with the placeholder, queries and their time."""

    filled: Counter[str]
    unresolved: Counter[str]
    queries: Counter[str]
    seconds: defaultdict[str, float]

    @classmethod
    def new(cls) -> ToastCounts:
        return cls(Counter(), Counter(), Counter(), defaultdict(float))


class ToastFill:
    """Holds events from the first unchanged TOASTed value on, fills them, then dispatches them in order.

    The loop hands it an event (``take``) when it is holding, or when the event is a row change with
    unchanged values; every other event the loop dispatches itself. ``dispatch`` is the loop's own
    handling of one event (the chain, delivery's begin and commit), so a held transaction's commit
    reaches delivery only after its filled rows. ``fills(table)`` says whether a table's unchanged values
    are filled (its ``toast`` mode). ``start`` takes a session's dispatch and drops what an earlier
    session held (the server sends it again from the slot)."""

    def __init__(
        self,
        reader: ValueReader,
        fills: Callable[[TableSchema], bool],
        batch: int,
        counts: ToastCounts,
    ) -> None:
        self._reader = reader
        self._fills = fills
        self._batch = batch
        self._counts = counts
        self._held: list[Event] = []
        self.holding = False  # whether events are held: the loop reads it per event
        self._dispatch: Callable[[Event], None] = _not_started

    def start(self, dispatch: Callable[[Event], None]) -> None:
        self._dispatch = dispatch
        self._held = []
        self.holding = False

    def take(self, event: Event) -> None:
        """An event while holding (kept in order), or a row change with unchanged values (held if its table
        fills them, else dispatched at once)."""
        held = self._held
        if not held and not (type(event) is ChangeEvent and self._fills(event.table)):
            self._dispatch(event)
            return
        held.append(event)
        self.holding = True
        if len(held) >= self._batch:
            self.flush()

    def flush(self) -> None:
        """Fill what is held, then dispatch it in order."""
        held, self._held = self._held, []
        self.holding = False
        if not held:
            return
        filled = self._fill([e for e in held if type(e) is ChangeEvent and e.unchanged and self._fills(e.table)])
        dispatch = self._dispatch
        for event in held:
            dispatch(filled.get(id(event), event) if type(event) is ChangeEvent else event)

    def close(self) -> None:
        self._reader.close()

    def _fill(self, events: list[ChangeEvent]) -> dict[int, ChangeEvent]:
        """The filled copy of each event, by the id of the original."""
        by_id: dict[int, list[ChangeEvent]] = {}
        for event in events:
            by_id.setdefault(id(event.table), []).append(event)
        by_table: dict[TableSchema, list[ChangeEvent]] = {}  # equal schemas of several decodings: one query
        for group in by_id.values():
            by_table.setdefault(group[0].table, []).extend(group)
        result: dict[int, ChangeEvent] = {}
        for group in by_table.values():
            table = group[0].table
            key_names = tuple(c.name for c in table.key_columns)
            columns = sorted({name for e in group for name in e.unchanged})
            keys = list(dict.fromkeys(_key(e, key_names) for e in group))
            commit_lsn = max(e.commit_lsn for e in group)
            xids = sorted({e.xid for e in group if e.xid is not None})
            name = table.qualified
            found: dict[Key, dict[str, Any]] = {}
            for at in range(0, len(keys), _KEYS_PER_QUERY):
                started = time.perf_counter()
                found.update(self._reader.read(table, columns, keys[at : at + _KEYS_PER_QUERY], int(commit_lsn), xids))
                self._counts.queries[name] += 1
                self._counts.seconds[name] += time.perf_counter() - started
            gone: list[Key] = []
            for event in group:
                values = found.get(_key(event, key_names))
                if values is None:
                    gone.append(_key(event, key_names))
                    self._counts.unresolved[name] += 1
                    continue
                after = dict(event.after)  # type: ignore[arg-type]  # an event with unchanged columns has a typed after
                for column in event.unchanged:
                    after[column] = values[column]
                self._counts.filled[name] += len(event.unchanged)
                result[id(event)] = replace(event, after=after, unchanged=frozenset())
            if gone:
                log.warning(
                    "toast_fill_row_gone",
                    table=name,
                    events=len(gone),
                    first_key=dict(zip(key_names, gone[0], strict=True)),
                    note="deleted or re-keyed before it was read: these records keep toast.placeholder; the delete "
                    "that follows on the same key supersedes them",
                )
        return result


def _not_started(event: Event) -> None:
    raise RuntimeError("ToastFill.start(dispatch) was not called for this session")


def _key(event: ChangeEvent, names: tuple[str, ...]) -> Key:
    after = event.after
    assert after is not None, "an update has an after row"
    return tuple(after[n] for n in names)


# -- the source ----------------------------------------------------------------------------------------

# Key types whose typed value (cdc.values) is a count from the epoch: how to turn that count back into the type.
_EPOCH_OFFSETS: Final[dict[str, str]] = {
    "date": "DATE '1970-01-01' + {}::int4",
    "timestamp": "TIMESTAMP '1970-01-01 00:00:00' + {}::int8 * INTERVAL '1 microsecond'",
    "timestamptz": "TIMESTAMPTZ '1970-01-01 00:00:00+00' + {}::int8 * INTERVAL '1 microsecond'",
    "time": "TIME '00:00:00' + {}::int8 * INTERVAL '1 microsecond'",
}
# Key types whose typed value's str() is text the type's input function reads back (bytea: see _key_text).
_TEXT_KEYS: Final = frozenset(
    {
        "int2",
        "int4",
        "int8",
        "oid",
        "numeric",
        "money",
        "text",
        "varchar",
        "bpchar",
        "name",
        "uuid",
        "bool",
        "bytea",
        "float4",
        "float8",
        "inet",
        "cidr",
        "macaddr",
        "macaddr8",
        "bit",
        "varbit",
        "citext",
    }
)


def _base(column: Column) -> str:
    base = column.type
    while base.kind is TypeKind.DOMAIN and base.element is not None:
        base = base.element
    return "enum" if base.kind is TypeKind.ENUM else base.name


def key_type_supported(column: Column) -> bool:
    """Whether a key column's typed value can be written back in SQL to find its row."""
    base = _base(column)
    return base == "enum" or base in _TEXT_KEYS or base in _EPOCH_OFFSETS


def _key_text(value: Any) -> str:
    """A key's typed value as text its column type reads (epoch types: the count, or infinity)."""
    if isinstance(value, Infinity):
        return value.value
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _key_expression(column: Column, position: int) -> sql.Composable:
    """The key column's value from the ``position``-th unnested text array, in the column's type."""
    text = sql.Identifier(f"k{position}")
    target = sql.SQL("{}.{}").format(sql.Identifier(column.type.schema), sql.Identifier(column.type.name))
    epoch = _EPOCH_OFFSETS.get(_base(column))
    if epoch is None:
        return sql.SQL("CAST({} AS {})").format(text, target)
    counted = sql.SQL(epoch).format(text)
    return sql.SQL(
        "CAST(CASE WHEN {t} IN ('infinity', '-infinity') THEN CAST({t} AS {ty}) ELSE {c} END AS {ty})"
    ).format(t=text, ty=target, c=counted)


_VISIBLE: Final = """
    WITH snap AS (SELECT txid_current_snapshot() AS s),
    ids AS (
        SELECT ((txid_snapshot_xmax(s) >> 32) << 32) | x AS id, txid_snapshot_xmax(s) AS xmax, s
          FROM snap, unnest(CAST({xids} AS int8[])) AS u(x)
    ),
    v AS (
        SELECT coalesce(bool_and(txid_visible_in_snapshot(
                   CASE WHEN id > xmax AND id - xmax >= 2147483648 THEN id - 4294967296 ELSE id END, s)), true) AS ok
          FROM ids
    )
"""
"""Whether the statement's own snapshot sees every one of the events' transactions (32-bit xids, placed in the
epoch of the snapshot's xmax). The walsender can send a transaction before its commit is visible to other
sessions (the commit record is flushed before the transaction leaves the proc array): read then, a row that
transaction inserted would look gone, and a value it changed would be its old one."""


def fill_query(table: TableSchema, columns: Sequence[Column]) -> sql.Composed:
    """One query for any number of keys: whether the events' transactions are visible (first column), then,
    only if they are, each key's row: the keys' text arrays unnested, cast to the key types, joined on the
    key (an index lookup per key on the primary key), in the same snapshot."""
    key_columns = table.key_columns
    arrays = sql.SQL(", ").join(sql.SQL("CAST({} AS text[])").format(sql.Placeholder()) for _ in key_columns)
    names = sql.SQL(", ").join(sql.Identifier(f"k{i}") for i in range(len(key_columns)))
    wanted = sql.SQL(", ").join(_key_expression(c, i) for i, c in enumerate(key_columns))
    return sql.SQL(
        _VISIBLE
        + "SELECT v.ok, r.* FROM v LEFT JOIN LATERAL (SELECT {keys}, {cols} FROM {table} WHERE v.ok AND ({keys}) IN "
        "(SELECT {wanted} FROM unnest({arrays}) AS u({names}))) AS r ON true"
    ).format(
        xids=sql.Placeholder(),
        keys=sql.SQL(", ").join(sql.Identifier(c.name) for c in key_columns),
        cols=sql.SQL(", ").join(sql.Identifier(c.name) for c in columns),
        table=sql.Identifier(table.schema, table.name),
        wanted=wanted,
        arrays=arrays,
        names=names,
    )


class SourceReader:
    """Reads unchanged TOASTed columns from the source table, by key, on a connection of its own.

    The values come back in the server's text output (the same session settings as the snapshot's), and
    each goes through the decoder's own converter for its column: a filled value is exactly what pgoutput
    would have sent. Keys go to the server as text arrays and are matched after the same conversion."""

    def __init__(
        self, conninfo: str, session_setup: Callable[[Any, str], None], *, replay_wait_s: float = 60.0
    ) -> None:
        self._conninfo = conninfo
        self._setup = session_setup
        self._replay_wait_s = replay_wait_s
        self._conn: psycopg.Connection[Any] | None = None
        self._standby = False  # the server connected to is in recovery: wait for its replay, see _caught_up
        self._converters: dict[tuple[Any, int], Callable[[bytes], Any]] = {}
        self._queries: dict[tuple[TableSchema, tuple[str, ...]], bytes] = {}

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10)
                self._setup(conn, "cdc-toast-fill")
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
                self._standby = bool(row and row[0])
            except psycopg.OperationalError as e:
                raise ConnectionLost(f"cannot connect to read unchanged TOASTed values: {str(e).strip()}") from None
            self._conn = conn
        return conn

    def _caught_up(self, conn: psycopg.Connection[Any], at_least: int) -> None:
        """On a standby (a multi-host DSN that reached one, or decoding on a standby), wait until it has
        replayed the events' commit: a value read before that could be older than the event."""
        deadline = time.monotonic() + self._replay_wait_s
        while True:
            row = conn.execute(
                "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(Lsn(at_least)),)
            ).fetchone()
            assert row is not None
            if not row[0]:
                self._standby = False  # promoted
                return
            if row[1]:
                return
            if time.monotonic() > deadline:
                raise ConnectionLost(
                    f"the server that unchanged TOASTed values are read from is a standby that has not replayed "
                    f"{Lsn(at_least)} within {self._replay_wait_s:.0f}s; reconnecting"
                )
            time.sleep(0.01)

    def read(
        self, table: TableSchema, columns: Sequence[str], keys: Sequence[Key], at_least: int, xids: Sequence[int]
    ) -> dict[Key, dict[str, Any]]:
        key_columns = table.key_columns
        unsupported = [c for c in key_columns if not key_type_supported(c)]
        if unsupported:
            c = unsupported[0]
            raise ToastFillError(
                f"cannot read unchanged TOASTed values of {table.qualified} back by key: its key column {c.name!r} "
                f"has type {c.type.schema}.{c.type.name}, which the fill cannot write in a query. Fix: "
                f"ALTER TABLE {table.qualified} REPLICA IDENTITY FULL; or set 'toast: placeholder' for it in 'tables'"
            )
        by_name = {c.name: c for c in table.columns}
        wanted = [by_name[c] for c in columns]
        conn = self._connection()
        query = self._queries.get((table, tuple(columns)))
        if query is None:
            query = self._queries[(table, tuple(columns))] = fill_query(table, wanted).as_bytes(conn)
        params: list[Any] = [list(xids), *([_key_text(key[i]) for key in keys] for i in range(len(key_columns)))]
        try:
            if self._standby:
                self._caught_up(conn, at_least)
            result = self._visible_result(conn, query, params, table)
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as e:
            # Dropped (or renamed) since the event: the values cannot be read, as for a deleted row.
            log.warning("toast_fill_relation_gone", table=table.qualified, error=str(e).strip())
            self._queries.clear()
            return {}
        except psycopg.OperationalError as e:
            raise ConnectionLost(f"lost the connection that reads unchanged TOASTed values: {str(e).strip()}") from None
        assert result is not None
        found: dict[Key, dict[str, Any]] = {}
        n_keys = len(key_columns)
        convert_key = [self._converter(c) for c in key_columns]
        convert = [self._converter(c) for c in wanted]
        get = result.get_value
        for r in range(result.ntuples):
            if get(r, 1) is None:  # the one row of no match (key columns are never NULL)
                continue
            try:
                key = tuple(_typed(convert_key[i], get(r, 1 + i)) for i in range(n_keys))
                found[key] = {c.name: _typed(convert[j], get(r, 1 + n_keys + j)) for j, c in enumerate(wanted)}
            except ValueConversionError as e:
                # The column's type changed since the event (ALTER TABLE ... TYPE): not this event's value.
                log.warning("toast_fill_type_changed", table=table.qualified, error=str(e))
        return found

    def _visible_result(
        self, conn: psycopg.Connection[Any], query: bytes, params: list[Any], table: TableSchema
    ) -> Any:
        """The query's result once its snapshot sees the events' transactions (a few milliseconds at most after
        the walsender sent them; ``replay_wait_s`` without it reconnects)."""
        deadline = time.monotonic() + self._replay_wait_s
        waits = 0
        while True:
            with conn.cursor() as cur:
                cur.execute(query, params, prepare=True)
                result = cur.pgresult
            assert result is not None
            if result.get_value(0, 0) == b"t":
                if waits:
                    log.info("toast_fill_waited_for_commit", table=table.qualified, waits=waits)
                return result
            waits += 1
            if time.monotonic() > deadline:
                raise ConnectionLost(
                    f"the transactions {params[0]} were sent by the server but are not visible to a new snapshot after "
                    f"{self._replay_wait_s:.0f}s; reconnecting"
                )
            time.sleep(0.001)

    def _converter(self, column: Column) -> Callable[[bytes], Any]:
        known = self._converters.get((column.type, column.modifier))
        if known is None:
            known = self._converters[(column.type, column.modifier)] = converter_for(column.type, column.modifier)
        return known

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _typed(convert: Callable[[bytes], Any], raw: bytes | None) -> Any:
    return None if raw is None else convert(raw)


# -- what start-up and ``cdc validate`` say -----------------------------------------------------------


@dataclass(frozen=True)
class ToastExposure:
    """A captured table with TOASTable columns whose replica identity does not carry them in updates."""

    table: str
    identity: str  # d default, i index
    columns: tuple[str, ...]
    mode: str  # the toast mode in force for it

    def describe(self) -> str:
        ident = {"d": "DEFAULT", "i": "USING INDEX"}.get(self.identity, self.identity)
        what = (
            "filled by re-reading the row by key (one query per table and batch of transactions)"
            if self.mode == "fill"
            else "written as toast.placeholder (Debezium's bytes): a compacted topic can lose these values"
        )
        return (
            f"{self.table}: REPLICA IDENTITY {ident}, TOASTable columns {', '.join(self.columns)}; an UPDATE that "
            f"leaves them alone does not send them: toast: {self.mode}, {what}. Alternative: "
            f"ALTER TABLE {self.table} REPLICA IDENTITY FULL; (every UPDATE and DELETE then logs the whole old "
            "row in WAL, large values included)"
        )


TOASTABLE_COLUMNS: Final = """
    SELECT a.attname FROM pg_attribute a
     WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attlen = -1 AND a.attstorage <> 'p'
     ORDER BY a.attnum
"""
"""Columns whose values may be stored out of line: variable length, storage other than PLAIN."""


def toast_exposure(
    conn: psycopg.Connection[Any], tables: Mapping[str, Any], mode_of: Callable[[str], str]
) -> list[ToastExposure]:
    """Every captured table (``TableInfo`` by name) with TOASTable published columns and an identity other
    than FULL, with the mode in force for it."""
    found = []
    for name, info in sorted(tables.items()):
        if info.replica_identity == "f":
            continue
        published = set(info.published_columns or info.columns)
        columns = tuple(str(r[0]) for r in conn.execute(TOASTABLE_COLUMNS, (info.oid,)).fetchall())
        columns = tuple(c for c in columns if c in published)
        if columns:
            found.append(ToastExposure(name, info.replica_identity, columns, mode_of(name)))
    return found


def toast_mode(config: Config, table: str) -> str:
    """The ``toast`` mode in force for a table (schema.name): its entry's, else ``toast.mode``."""
    schema, _, name = table.partition(".")
    entry = entry_for(config.tables, schema, name)
    return (entry.toast if entry is not None else None) or config.toast.mode
