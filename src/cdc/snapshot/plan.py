"""What a snapshot reads: the table as the stream sees it, its chunk key, and the chunks.

A table is cut into chunks by its chunk key (the primary key, else the replica
identity index, else another unique index over NOT NULL columns), at boundaries
sampled from the table so that chunks hold about the same number of rows.
Boundaries are key values in the server's text form, compared by the server
(``(a, b) > ('1'::int4, 'x'::text)``), so they stay valid under any snapshot and
an interrupted chunk can be finished later by DBLog with the same bounds.

A table without such a key is cut into ranges of heap pages (``ctid``). Those
only partition the table inside one snapshot, so they serve the initial copy and
nothing else: never resumed, never used for DBLog.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc.catalog import TableInfo, load_types
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import Column, PgType, TableSchema, TypeKind

__all__ = [
    "Chunk",
    "Chunking",
    "KeyRange",
    "KeyValue",
    "SnapshotTable",
    "TablePlan",
    "chunk_select",
    "describe_table",
    "plan_table",
    "session_setup",
]

KeyValue = tuple[str, ...]
"""A chunk key's values in the server's text output, one per key column."""

Connection = psycopg.Connection[Any]

SESSION_SETTINGS: tuple[tuple[str, str], ...] = (
    # What cdc.decoder.types expects of the text it parses (the walsender runs with the server's
    # defaults, which the start-up checks expect to be these too).
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("bytea_output", "hex"),
    ("client_encoding", "UTF8"),
    ("lc_monetary", "C"),
    ("TimeZone", "UTC"),  # timestamptz text ends in "+00": the parsers' fast path
    ("statement_timeout", "0"),
    ("idle_in_transaction_session_timeout", "0"),
)


LEAVES = """
    SELECT r.oid FROM pg_class r WHERE r.oid = %(oid)s AND r.relkind <> 'p'
    UNION ALL
    SELECT t.relid FROM pg_partition_tree(%(oid)s::oid::regclass) t WHERE t.isleaf AND t.relid <> %(oid)s::oid::regclass
"""
"""The relations holding a table's rows: itself, or the leaf partitions of a partitioned table."""


def session_setup(conn: Connection, application_name: str) -> None:
    """Session settings of every snapshot connection; run before BEGIN (they are not transactional then)."""
    for name, value in SESSION_SETTINGS:
        conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
    conn.execute(sql.SQL("SET application_name = {}").format(sql.Literal(application_name)))


class Chunking(enum.StrEnum):
    KEY = "key"  # ranges of the chunk key
    CTID = "ctid"  # ranges of heap pages; one snapshot only


@dataclass(frozen=True, slots=True)
class SnapshotTable:
    """A captured table as the snapshot reads it: the event schema and how to cut it."""

    name: str  # schema.table
    oid: int
    schema: TableSchema  # equal to the stream's TableSchema for the same columns
    chunk_key: tuple[str, ...]  # () when the table has no usable key
    chunk_key_types: tuple[str, ...]  # format_type() of each, to cast bounds with
    partitioned: bool
    row_filter: str | None = None  # the publication's WHERE for the table: a snapshot copies what it publishes

    @property
    def keyed(self) -> bool:
        return bool(self.chunk_key)

    @property
    def chunk_key_positions(self) -> tuple[int, ...]:
        names = [c.name for c in self.schema.columns]
        return tuple(names.index(k) for k in self.chunk_key)


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Rows with ``lower < key <= upper``; None is unbounded."""

    lower: KeyValue | None
    upper: KeyValue | None

    def to_json(self) -> dict[str, Any]:
        return {
            "lower": list(self.lower) if self.lower is not None else None,
            "upper": list(self.upper) if self.upper is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KeyRange:
        lower, upper = data.get("lower"), data.get("upper")
        return cls(tuple(lower) if lower is not None else None, tuple(upper) if upper is not None else None)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of one table: a key range, or (no key) a range of heap pages."""

    table: str
    index: int  # position in the table's plan, from 0
    keys: KeyRange | None  # Chunking.KEY
    pages: tuple[int, int | None] | None = None  # Chunking.CTID: [first, end) pages; end None: to the end

    @property
    def id(self) -> str:
        return f"{self.table}/{self.index}"


@dataclass(frozen=True, slots=True)
class TablePlan:
    """How a table is cut, as persisted: enough to rebuild every chunk after a restart."""

    table: str
    oid: int
    chunking: Chunking
    boundaries: tuple[KeyValue, ...]  # KEY: n-1 inner boundaries for n chunks
    pages_per_chunk: int  # CTID
    chunk_count: int
    estimated_rows: int
    chunk_key: tuple[str, ...] = ()  # KEY: the columns the boundaries are values of

    def chunks(self) -> list[Chunk]:
        if self.chunking is Chunking.KEY:
            bounds: list[KeyValue | None] = [None, *self.boundaries, None]
            return [Chunk(self.table, i, KeyRange(bounds[i], bounds[i + 1])) for i in range(len(bounds) - 1)]
        out = []
        for i in range(self.chunk_count):
            first = i * self.pages_per_chunk
            end = None if i == self.chunk_count - 1 else first + self.pages_per_chunk
            out.append(Chunk(self.table, i, None, (first, end)))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "oid": self.oid,
            "chunking": self.chunking.value,
            "boundaries": [list(b) for b in self.boundaries],
            "pages_per_chunk": self.pages_per_chunk,
            "chunk_count": self.chunk_count,
            "estimated_rows": self.estimated_rows,
            "chunk_key": list(self.chunk_key),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TablePlan:
        return cls(
            table=str(data["table"]),
            oid=int(data["oid"]),
            chunking=Chunking(data["chunking"]),
            boundaries=tuple(tuple(str(v) for v in b) for b in data["boundaries"]),
            pages_per_chunk=int(data["pages_per_chunk"]),
            chunk_count=int(data["chunk_count"]),
            estimated_rows=int(data["estimated_rows"]),
            chunk_key=tuple(str(k) for k in data.get("chunk_key", ())),
        )


# --------------------------------------------------------------------------- the catalog


def describe_table(conn: Connection, info: TableInfo, types: Mapping[int, PgType] | None = None) -> SnapshotTable:
    """The table's columns as pgoutput sends them (no dropped or generated columns) and its chunk key.

    Read inside the snapshot's transaction, the columns are those at the snapshot.
    Raises ``LookupError`` when the table no longer exists.
    """
    row = conn.execute("SELECT relkind FROM pg_class WHERE oid = %s", (info.oid,)).fetchone()
    if row is None:
        raise LookupError(f"table {info.qualified} (oid {info.oid}) no longer exists")
    partitioned = row[0] == "p"
    attrs = conn.execute(
        """
        SELECT attname, atttypid::int, atttypmod, attnotnull, format_type(atttypid, NULL), attgenerated <> ''
          FROM pg_attribute
         WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped
         ORDER BY attnum
        """,
        (info.oid,),
    ).fetchall()
    # Generated columns only where the publication sends them (PostgreSQL 18, publish_generated_columns).
    attrs = [
        a[:5] for a in attrs if (a[0] in info.published_columns if info.published_columns is not None else not a[5])
    ]
    known: dict[int, PgType] = {**BUILTIN_TYPES, **(types or {})}
    missing = {int(a[1]) for a in attrs if int(a[1]) not in known}
    if missing:
        known.update(load_types(conn, missing))
    columns = []
    sql_types: dict[str, str] = {}
    not_null: set[str] = set()
    for name, type_oid, typmod, attnotnull, type_text in attrs:
        pg_type = known.get(type_oid) or PgType(type_oid, f"oid:{type_oid}", TypeKind.UNKNOWN)
        columns.append(Column(name, pg_type, int(typmod), key=name in info.key, nullable=name not in info.not_null))
        sql_types[name] = str(type_text)
        if attnotnull:
            not_null.add(name)
    schema = TableSchema(info.schema, info.name, tuple(columns), info.oid, info.replica_identity)
    key = _chunk_key(conn, info.oid, not_null)
    return SnapshotTable(
        name=info.qualified,
        oid=info.oid,
        schema=schema,
        chunk_key=key,
        chunk_key_types=tuple(sql_types[k] for k in key),
        partitioned=partitioned,
        row_filter=info.row_filter,
    )


def _chunk_key(conn: Connection, oid: int, not_null: set[str]) -> tuple[str, ...]:
    """Columns of the primary key, else the replica identity index, else the narrowest unique
    btree index over NOT NULL plain columns; () when there is none. In index column order."""
    rows = conn.execute(
        """
        SELECT i.indisprimary, i.indisreplident,
               ARRAY(SELECT a.attname::text
                       FROM unnest(i.indkey[0:i.indnkeyatts - 1]) WITH ORDINALITY AS k(attnum, ord)
                       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                      ORDER BY k.ord),
               i.indnkeyatts
          FROM pg_index i
          JOIN pg_class ic ON ic.oid = i.indexrelid
          JOIN pg_am am ON am.oid = ic.relam
         WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indimmediate
           AND i.indpred IS NULL AND i.indexprs IS NULL AND am.amname = 'btree'
        """,
        (oid,),
    ).fetchall()
    candidates = []
    for primary, replident, cols, nkeys in rows:
        names = tuple(str(c) for c in cols)
        if len(names) != nkeys or not all(c in not_null for c in names):
            continue
        candidates.append((0 if primary else 1 if replident else 2, len(names), names))
    if not candidates:
        return ()
    return min(candidates)[2]


# --------------------------------------------------------------------------- planning


def plan_table(conn: Connection, table: SnapshotTable, chunk_rows: int) -> TablePlan:
    """Estimate the rows and cut the table into chunks of about ``chunk_rows``."""
    estimated, pages, total_pages = _estimate(conn, table.oid)
    wanted = max(1, math.ceil(estimated / chunk_rows))
    if table.keyed:
        boundaries = _sample_boundaries(conn, table, total_pages, wanted) if wanted > 1 else ()
        return TablePlan(
            table.name, table.oid, Chunking.KEY, boundaries, 0, len(boundaries) + 1, estimated, table.chunk_key
        )
    if table.partitioned or wanted == 1 or pages <= 1:
        # Partitions have pages of their own: one scan of the parent covers them all.
        return TablePlan(table.name, table.oid, Chunking.CTID, (), max(pages, 1), 1, estimated)
    count = min(wanted, pages)
    per_chunk = math.ceil(pages / count)
    count = math.ceil(pages / per_chunk)
    return TablePlan(table.name, table.oid, Chunking.CTID, (), per_chunk, count, estimated)


def _estimate(conn: Connection, oid: int) -> tuple[int, int, int]:
    """(estimated rows, heap pages of the largest partition, all heap pages) from pg_class; rows are
    counted when the table was never analyzed."""
    row = conn.execute(
        """
        SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::bigint,
               bool_or(c.reltuples < 0),
               COALESCE(max(pg_relation_size(c.oid) / current_setting('block_size')::int), 0)::bigint,
               COALESCE(sum(pg_relation_size(c.oid) / current_setting('block_size')::int), 0)::bigint
          FROM pg_class c
         WHERE c.oid IN ({LEAVES})
        """.replace("{LEAVES}", LEAVES),
        {"oid": oid},
    ).fetchone()
    assert row is not None
    estimated, never_analyzed, pages, total_pages = int(row[0]), bool(row[1]), int(row[2]), int(row[3])
    if never_analyzed:
        if total_pages <= 20_000:  # up to ~160 MB: count exactly
            counted = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_relation(conn, oid))).fetchone()
            estimated = int(counted[0]) if counted else 0
        else:
            estimated = max(estimated, total_pages * 60)
    return estimated, pages, total_pages


def _relation(conn: Connection, oid: int) -> sql.Composable:
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
        (oid,),
    ).fetchone()
    if row is None:
        raise LookupError(f"relation {oid} no longer exists")
    return sql.Identifier(str(row[0]), str(row[1]))


def _sample_boundaries(conn: Connection, table: SnapshotTable, pages: int, chunks: int) -> tuple[KeyValue, ...]:
    """``chunks - 1`` key values that cut a sample of the table into parts of equal row counts.

    The sample is whole pages (TABLESAMPLE SYSTEM), about 30 per chunk, so the
    server reads a small part of a large table; it sorts the sample and returns
    only the rows where the part number changes.
    """
    percent = min(100.0, 100.0 * max(chunks * 30, 100) / max(pages, 1))
    key_cols = [sql.Identifier(k) for k in table.chunk_key]
    outputs = [sql.Identifier(f"__cdc_k{i}") for i in range(len(key_cols))]
    sample = sql.SQL("TABLESAMPLE SYSTEM ({})").format(sql.Literal(percent)) if percent < 100.0 else sql.SQL("")
    # The outputs get names of their own: "ORDER BY id" next to an output named id would sort the text.
    query = sql.SQL(
        """
        SELECT {outputs} FROM (
            SELECT {casts}, row_number() OVER (ORDER BY {keys}) AS __cdc_rn, count(*) OVER () AS __cdc_n
              FROM {table} {sample}
        ) s
        WHERE (__cdc_rn * {chunks}) / __cdc_n > ((__cdc_rn - 1) * {chunks}) / __cdc_n
        ORDER BY __cdc_rn
        """
    ).format(
        outputs=sql.SQL(", ").join(outputs),
        casts=sql.SQL(", ").join(
            sql.SQL("{}::text AS {}").format(k, o) for k, o in zip(key_cols, outputs, strict=True)
        ),
        keys=sql.SQL(", ").join(key_cols),
        table=sql.Identifier(table.schema.schema, table.schema.name),
        sample=sample,
        chunks=sql.Literal(chunks),
    )
    rows = [tuple(str(v) for v in r) for r in conn.execute(query).fetchall()]
    boundaries: list[KeyValue] = []
    for value in rows[:-1]:  # the last is the sample's largest key: the last chunk is open-ended anyway
        if not boundaries or boundaries[-1] != value:
            boundaries.append(value)
    return tuple(boundaries)


# --------------------------------------------------------------------------- reading


def _bound(table: SnapshotTable, values: KeyValue) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(t)) for v, t in zip(values, table.chunk_key_types, strict=True)
    )


def key_predicate(table: SnapshotTable, keys: KeyRange) -> sql.Composable:
    """``(k1, k2) > (...) AND (k1, k2) <= (...)``, or TRUE for an unbounded range."""
    cols = sql.SQL(", ").join(sql.Identifier(k) for k in table.chunk_key)
    parts: list[sql.Composable] = []
    if keys.lower is not None:
        parts.append(sql.SQL("({}) > ({})").format(cols, _bound(table, keys.lower)))
    if keys.upper is not None:
        parts.append(sql.SQL("({}) <= ({})").format(cols, _bound(table, keys.upper)))
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("TRUE")


def chunk_where(table: SnapshotTable, chunk: Chunk) -> sql.Composable:
    """The rows of ``chunk`` the publication publishes: a key range, a range of heap pages, or the whole
    table, AND the publication's row filter."""
    where = _chunk_range(table, chunk)
    if table.row_filter is None:
        return where
    # The server's own deparsed expression (pg_publication_tables.rowfilter), over this table's columns.
    return sql.SQL("({}) AND ({})").format(where, sql.SQL(table.row_filter))


def _chunk_range(table: SnapshotTable, chunk: Chunk) -> sql.Composable:
    if chunk.keys is not None:
        return key_predicate(table, chunk.keys)
    if chunk.pages is not None:
        first, end = chunk.pages
        conds: list[sql.Composable] = []
        if first > 0:
            conds.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({first},0)")))
        if end is not None:
            conds.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({end},0)")))
        return sql.SQL(" AND ").join(conds) if conds else sql.SQL("TRUE")
    return sql.SQL("TRUE")


def chunk_select(table: SnapshotTable, chunk: Chunk, *, limit: int | None = None) -> sql.Composed:
    """``COPY (SELECT <columns> FROM <table> WHERE <chunk>) TO STDOUT``; with ``limit``, in key order."""
    columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.schema.columns)
    relation = sql.Identifier(table.schema.schema, table.schema.name)
    query = sql.SQL("SELECT {} FROM {} WHERE {}").format(columns, relation, chunk_where(table, chunk))
    if limit is not None:
        if not table.keyed:
            raise ValueError(f"{table.name} has no chunk key to read it in key order")
        order = sql.SQL(", ").join(sql.Identifier(k) for k in table.chunk_key)
        query = sql.SQL("{} ORDER BY {} LIMIT {}").format(query, order, sql.Literal(limit))
    return sql.SQL("COPY ({}) TO STDOUT").format(query)


def max_key(conn: Connection, table: SnapshotTable) -> KeyValue | None:
    """The largest chunk key now (None for an empty table): where a DBLog pass stops."""
    cols = [sql.Identifier(k) for k in table.chunk_key]
    row = conn.execute(
        sql.SQL("SELECT {} FROM {} ORDER BY {} LIMIT 1").format(
            sql.SQL(", ").join(
                sql.SQL("{}::text AS {}").format(c, sql.Identifier(f"__cdc_k{i}")) for i, c in enumerate(cols)
            ),
            sql.Identifier(table.schema.schema, table.schema.name),
            sql.SQL(", ").join(sql.SQL("{} DESC").format(c) for c in cols),
        )
    ).fetchone()
    return tuple(str(v) for v in row) if row is not None else None


def same_columns(a: TableSchema, b: TableSchema) -> bool:
    """Whether two schemas of a table have the same columns (names, types, modifiers) in the same order."""
    return [(c.name, c.type.oid, c.modifier) for c in a.columns] == [
        (c.name, c.type.oid, c.modifier) for c in b.columns
    ]


def key_names(columns: Sequence[Column]) -> tuple[str, ...]:
    return tuple(c.name for c in columns if c.key)
