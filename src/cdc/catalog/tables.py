"""The captured tables: patterns expanded against the database, then each table checked and its key resolved."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc.catalog.errors import StartupError
from cdc.config import Config, TableConfig
from cdc.event import TableInfo
from cdc.outbox.config import OutboxTable
from cdc.selection import Selection, SelectionError, select_tables


def candidate_tables(conn: psycopg.Connection[tuple[object, ...]]) -> list[tuple[str, str]]:
    """The tables a pattern may select: ordinary and partitioned tables outside the system schemas.

    Partitions are left out: a partitioned table is captured whole (the publication publishes its
    partitions' changes as its own, ``publish_via_partition_root``), so a pattern matching
    ``orders`` and its partitions ``orders_2024``... captures ``orders`` once.
    """
    rows = conn.execute(
        """
        SELECT n.nspname, c.relname
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
           AND n.nspname NOT IN ('pg_catalog', 'information_schema')
           AND n.nspname !~ '^pg_(toast|temp_)'
         ORDER BY 1, 2
        """
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def resolve_tables(
    conn: psycopg.Connection[tuple[object, ...]], entries: Sequence[TableConfig], exclude: Iterable[str] = ()
) -> Selection:
    """The configured entries with their patterns expanded against this database; ``exclude`` (e.g. the
    snapshot signal table) is never selected by a pattern. StartupError names each problem and its fix."""
    leave_out = set(exclude)
    candidates: list[tuple[str, str]] = []
    if any(e.name is None for e in entries):
        candidates = [c for c in candidate_tables(conn) if f"{c[0]}.{c[1]}" not in leave_out]
    try:
        selection = select_tables(entries, candidates)
    except SelectionError as e:
        raise StartupError(f"{e} (database {conn.info.dbname})") from None
    return selection


def expand_config(conn: psycopg.Connection[tuple[object, ...]], config: Config) -> tuple[Config, Selection]:
    """The configuration with only concrete tables: its pattern entries expanded against this database
    (never selecting the snapshot signal table or an outbox table: those have their own route)."""
    exclude = [config.snapshot.signal_table, *(t.name for t in config.outbox.tables)]
    selection = resolve_tables(conn, config.tables, exclude=exclude)
    return config.model_copy(update={"tables": list(selection.tables)}), selection


def describe_tables(
    conn: psycopg.Connection[tuple[object, ...]], tables: Sequence[TableConfig], *, section: str = "tables"
) -> dict[str, TableInfo]:
    """Check every captured table and resolve its key; raise StartupError listing all problems.

    ``section`` is the configuration key the tables come from, named in the errors.
    """
    problems: list[str] = []
    result: dict[str, TableInfo] = {}
    configured = {t.qualified for t in tables}
    for t in tables:
        info = _describe_table(conn, t, configured, section, problems)
        if info is not None:
            result[t.qualified] = info
    if problems:
        raise StartupError(f"cannot capture the configured {section}:\n  " + "\n  ".join(problems))
    return result


@dataclass(frozen=True, slots=True)
class _Relation:
    """A configured table's row in pg_class, with what the checks need."""

    oid: int
    replident: str  # relreplident: d(efault), i(ndex), f(ull), n(othing)
    relkind: str
    can_select: bool
    ancestors: tuple[str, ...]  # pg_partition_ancestors, nearest first; empty for a table that is no partition


def _relation(conn: psycopg.Connection[tuple[object, ...]], t: TableConfig) -> _Relation | None:
    row = conn.execute(
        """
        SELECT c.oid, c.relreplident, c.relkind,
               has_table_privilege(c.oid, 'SELECT'),
               ARRAY(SELECT an.nspname || '.' || ac.relname
                       FROM pg_partition_ancestors(c.oid) a
                       JOIN pg_class ac ON ac.oid = a.relid JOIN pg_namespace an ON an.oid = ac.relnamespace
                      WHERE a.relid <> c.oid)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %s AND c.relname = %s
        """,
        (t.schema_name, t.table_name),
    ).fetchone()
    if row is None:
        return None
    oid, replident, relkind, can_select, ancestors = row
    return _Relation(
        int(str(oid)),
        str(replident),
        str(relkind),
        bool(can_select),
        tuple(str(a) for a in ancestors or ()),  # type: ignore[attr-defined]
    )


def _describe_table(
    conn: psycopg.Connection[tuple[object, ...]],
    t: TableConfig,
    configured: set[str],
    section: str,
    problems: list[str],
) -> TableInfo | None:
    """One configured table checked and described; what keeps it from being captured goes to ``problems``."""
    rel = _relation(conn, t)
    if rel is None:
        problems.append(
            f"table {t.qualified} does not exist in database {conn.info.dbname}: create it, or remove it from "
            f"'{section}'"
        )
        return None
    refusal = _placement_refusal(t, rel, configured, section)
    if refusal is not None:
        problems.append(refusal)
        return None
    if not rel.can_select:
        problems.append(
            f"role {conn.info.user} cannot SELECT from {t.qualified}. Fix: GRANT SELECT ON {t.qualified} TO "
            f"{conn.info.user};"
        )
    cols = conn.execute(
        """
        SELECT attname, attnotnull FROM pg_attribute
         WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum
        """,
        (rel.oid,),
    ).fetchall()
    columns = tuple(str(c[0]) for c in cols)
    not_null = frozenset(str(c[0]) for c in cols if c[1])
    key = _key(conn, t, rel, columns, problems)
    if key is None:
        return None
    partitions = table_partitions(conn, rel.oid) if rel.relkind == "p" else frozenset()
    return TableInfo(t.schema_name, t.table_name, rel.oid, rel.replident, key, columns, not_null, partitions)


def _placement_refusal(t: TableConfig, rel: _Relation, configured: set[str], section: str) -> str | None:
    """Why the table cannot be captured as configured because of what it is: a partition, or no table."""
    captured_ancestors = [a for a in rel.ancestors if a in configured]
    if captured_ancestors:
        return (
            f"table {t.qualified} is a partition of {captured_ancestors[0]}, which is captured too: its changes "
            f"are published as {captured_ancestors[0]}'s (publish_via_partition_root). Fix: remove "
            f"{t.qualified} from 'tables'; {captured_ancestors[0]}'s topic carries its rows."
        )
    if rel.ancestors:
        root = rel.ancestors[-1]  # pg_partition_ancestors: nearest first
        return (
            f"table {t.qualified} is a partition of {root}: a partition's changes are published as its "
            f"partitioned table's, and partitions come and go. Fix: capture {root} instead of {t.qualified} in "
            f"'{section}' (one topic for all its partitions' rows)."
        )
    if rel.relkind not in ("r", "p"):
        return f"{t.qualified} is not an ordinary table (relkind {rel.relkind}): only tables can be captured"
    return None


def _key(
    conn: psycopg.Connection[tuple[object, ...]],
    t: TableConfig,
    rel: _Relation,
    columns: tuple[str, ...],
    problems: list[str],
) -> tuple[str, ...] | None:
    """The table's key (configured, else primary key, else replica identity index), checked against its replica
    identity; None with the reason in ``problems`` when its changes could not be captured with a key."""
    pk = _index_columns(conn, rel.oid, "indisprimary")
    identity_index = _index_columns(conn, rel.oid, "indisreplident")
    identity = {"d": pk, "i": identity_index, "f": columns, "n": ()}[rel.replident]
    if t.key is not None:
        missing = [k for k in t.key if k not in columns]
        if missing:
            problems.append(f"tables[{t.qualified}].key names columns that do not exist: {', '.join(missing)}")
            return None
        key = tuple(c for c in columns if c in t.key)
        if rel.replident != "f" and not set(key) <= set(identity):
            problems.append(
                f"the configured key of {t.qualified} ({', '.join(t.key)}) is not covered by its replica identity "
                f"({', '.join(identity) or 'nothing'}), so deletes would arrive without it. Fix: "
                f"ALTER TABLE {t.qualified} REPLICA IDENTITY FULL; or key the table by its primary key."
            )
            return None
    else:
        key = pk or identity_index
        if not key:
            problems.append(
                f"table {t.qualified} has no primary key and no replica identity index, so its rows have no key "
                f"and its deletes cannot be captured. Fix: add a primary key; or "
                f"ALTER TABLE {t.qualified} REPLICA IDENTITY FULL; and set 'key: [columns]' for it in 'tables'."
            )
            return None
    if rel.replident == "n":
        problems.append(
            f"table {t.qualified} has REPLICA IDENTITY NOTHING, so updates and deletes cannot be captured. "
            f"Fix: ALTER TABLE {t.qualified} REPLICA IDENTITY DEFAULT; (or FULL)."
        )
        return None
    if rel.replident == "d" and not pk:
        problems.append(
            f"table {t.qualified} has REPLICA IDENTITY DEFAULT but no primary key: Postgres refuses its updates "
            f"and deletes once published. Fix: add a primary key, or ALTER TABLE {t.qualified} REPLICA IDENTITY FULL;"
        )
        return None
    return key


def table_partitions(conn: psycopg.Connection[tuple[object, ...]], oid: int) -> frozenset[str]:
    """The partitions of a partitioned table, at any depth (qualified names); empty for another table."""
    return frozenset(
        str(r[0])
        for r in conn.execute(
            """
            SELECT n.nspname || '.' || c.relname FROM pg_partition_tree(%s::regclass) t
              JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE t.relid <> %s::regclass
            """,
            (oid, oid),
        )
    )


def describe_outbox_tables(
    conn: psycopg.Connection[tuple[object, ...]], tables: Sequence[OutboxTable]
) -> dict[str, TableInfo]:
    """The configured outbox tables, checked like captured tables (they join the publication, and a
    DELETE on a published table needs a replica identity), plus every configured column present."""
    if not tables:
        return {}
    result = describe_tables(conn, [TableConfig(name=t.name) for t in tables], section="outbox.tables")
    problems = []
    for i, t in enumerate(tables):
        columns = result[t.name].columns
        for role, column in t.columns.required().items():
            if column not in columns:
                problems.append(
                    f"outbox table {t.name} has no column {column} (the {role}). Fix: add it "
                    f"(ALTER TABLE {t.name} ADD COLUMN {column} ...), or set outbox.tables[{i}].columns.{role} "
                    "to the column that holds it"
                )
        for j, extra in enumerate(t.extra):
            if extra.column not in columns:
                problems.append(
                    f"outbox table {t.name} has no column {extra.column} (outbox.tables[{i}].extra[{j}]). "
                    "Fix: add the column, or remove the entry"
                )
    if problems:
        raise StartupError("the outbox tables do not fit the configuration:\n  " + "\n  ".join(problems))
    return result


def _index_columns(conn: psycopg.Connection[tuple[object, ...]], table_oid: object, flag: str) -> tuple[str, ...]:
    query = sql.SQL(
        """
        SELECT a.attname FROM pg_index i
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
         WHERE i.indrelid = %s AND i.{}
         ORDER BY a.attnum
        """
    ).format(sql.Identifier(flag))
    rows = conn.execute(query, (table_oid,)).fetchall()
    return tuple(str(r[0]) for r in rows)
