"""Start-up checks and catalog facts, read on an ordinary connection before streaming starts.

Every check runs before anything is created, so a refused start leaves nothing
half-made behind: no publication, no slot, no topic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psycopg
import structlog
from psycopg import sql

from cdc.config import Config, TableConfig
from cdc.event import PgType, TypeKind
from cdc.event import TableInfo as TableInfo  # re-exported: the catalog builds it (describe_tables)
from cdc.outbox.config import OutboxTable
from cdc.replication import failover_refusal
from cdc.selection import Selection, SelectionError, select_tables

log = structlog.get_logger(__name__)


class StartupError(Exception):
    """The source is not ready for capture; the message names the problem and the fix."""


def check_server(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """wal_level and the role's REPLICATION attribute; a warning for a server with a known data-loss bug."""
    row = conn.execute("SHOW wal_level").fetchone()
    wal_level = str(row[0]) if row else ""
    if wal_level != "logical":
        raise StartupError(
            f"the server runs with wal_level={wal_level}, logical replication needs wal_level=logical. "
            "Fix: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL."
        )
    row = conn.execute(
        "SELECT current_user, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if row is None:
        raise StartupError("cannot read the current role from pg_roles")
    user, replication, superuser = row
    if not (replication or superuser):
        raise StartupError(
            f"role {user} lacks the REPLICATION attribute needed to stream changes. "
            f"Fix: ALTER ROLE {user} REPLICATION; (as a superuser)."
        )
    warn_publication_race(conn)


# The first minor release of each major version with PostgreSQL's commit 4909b38af0 ("Fix data loss in
# logical replication", May 2025): before it, a table added to a publication while another transaction
# wrote it could have all its later changes left out of the stream.
PUBLICATION_RACE_FIXED = {13: (13, 21), 14: (14, 18), 15: (15, 13), 16: (16, 9), 17: (17, 5)}


def publication_race_fix(server_version: int) -> str | None:
    """The minor release to upgrade to when ``server_version`` (libpq's integer form) has the bug, else None."""
    major, minor = divmod(server_version, 10000)
    fixed = PUBLICATION_RACE_FIXED.get(major)
    return f"{fixed[0]}.{fixed[1]}" if fixed is not None and minor < fixed[1] else None


def warn_publication_race(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    fix = publication_race_fix(conn.info.server_version)
    if fix is not None:
        log.warning(
            "server_publication_race",
            server_version=conn.info.server_version,
            fixed_in=fix,
            effect="a table someone else adds to the publication while transactions write it may have all its later "
            "changes left out of the stream, without an error (tables the daemon adds itself are locked against it)",
            fix=f"upgrade PostgreSQL to {fix} or later; until then add tables to the publication only while nothing "
            "writes them, or let the daemon add them",
        )


def check_slot_failover(conn: psycopg.Connection[tuple[object, ...]], wanted: bool | None) -> None:
    """``source.slot_failover: true`` on a server that cannot keep a failover slot: refused before anything
    is created, with the reason."""
    if not wanted:
        return
    version = conn.info.server_version
    standby = False
    if version >= 170000:
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        standby = bool(row and row[0])
    refusal = failover_refusal(wanted, version, standby)
    if refusal is not None:
        raise StartupError(refusal)


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
    db = conn.info.dbname
    configured = {t.qualified for t in tables}
    for t in tables:
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
            problems.append(
                f"table {t.qualified} does not exist in database {db}: create it, or remove it from '{section}'"
            )
            continue
        oid, replident, relkind, can_select, ancestors = row
        captured_ancestors = [a for a in ancestors or () if a in configured]  # type: ignore[attr-defined]
        if captured_ancestors:
            problems.append(
                f"table {t.qualified} is a partition of {captured_ancestors[0]}, which is captured too: its changes "
                f"are published as {captured_ancestors[0]}'s (publish_via_partition_root). Fix: remove "
                f"{t.qualified} from 'tables'; {captured_ancestors[0]}'s topic carries its rows."
            )
            continue
        if ancestors:
            root = list(ancestors)[-1]  # type: ignore[call-overload]  # pg_partition_ancestors: nearest first
            problems.append(
                f"table {t.qualified} is a partition of {root}: a partition's changes are published as its "
                f"partitioned table's, and partitions come and go. Fix: capture {root} instead of {t.qualified} in "
                f"'{section}' (one topic for all its partitions' rows)."
            )
            continue
        if relkind not in ("r", "p"):
            problems.append(f"{t.qualified} is not an ordinary table (relkind {relkind}): only tables can be captured")
            continue
        if not can_select:
            problems.append(
                f"role {conn.info.user} cannot SELECT from {t.qualified}. Fix: GRANT SELECT ON {t.qualified} TO {conn.info.user};"
            )
        cols = conn.execute(
            """
            SELECT attname, attnotnull FROM pg_attribute
             WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum
            """,
            (oid,),
        ).fetchall()
        columns = tuple(str(c[0]) for c in cols)
        not_null = frozenset(str(c[0]) for c in cols if c[1])
        pk = _index_columns(conn, oid, "indisprimary")
        identity_index = _index_columns(conn, oid, "indisreplident")
        identity = {"d": pk, "i": identity_index, "f": columns, "n": ()}[str(replident)]
        if t.key is not None:
            missing = [k for k in t.key if k not in columns]
            if missing:
                problems.append(f"tables[{t.qualified}].key names columns that do not exist: {', '.join(missing)}")
                continue
            key = tuple(c for c in columns if c in t.key)
            if replident != "f" and not set(key) <= set(identity):
                problems.append(
                    f"the configured key of {t.qualified} ({', '.join(t.key)}) is not covered by its replica identity "
                    f"({', '.join(identity) or 'nothing'}), so deletes would arrive without it. Fix: "
                    f"ALTER TABLE {t.qualified} REPLICA IDENTITY FULL; or key the table by its primary key."
                )
                continue
        else:
            key = pk or identity_index
            if not key:
                problems.append(
                    f"table {t.qualified} has no primary key and no replica identity index, so its rows have no key "
                    f"and its deletes cannot be captured. Fix: add a primary key; or "
                    f"ALTER TABLE {t.qualified} REPLICA IDENTITY FULL; and set 'key: [columns]' for it in 'tables'."
                )
                continue
        if replident == "n":
            problems.append(
                f"table {t.qualified} has REPLICA IDENTITY NOTHING, so updates and deletes cannot be captured. "
                f"Fix: ALTER TABLE {t.qualified} REPLICA IDENTITY DEFAULT; (or FULL)."
            )
            continue
        if replident == "d" and not pk:
            problems.append(
                f"table {t.qualified} has REPLICA IDENTITY DEFAULT but no primary key: Postgres refuses its updates "
                f"and deletes once published. Fix: add a primary key, or ALTER TABLE {t.qualified} REPLICA IDENTITY FULL;"
            )
            continue
        partitions = table_partitions(conn, int(str(oid))) if relkind == "p" else frozenset()
        result[t.qualified] = TableInfo(
            t.schema_name, t.table_name, int(str(oid)), str(replident), key, columns, not_null, partitions
        )
    if problems:
        raise StartupError(f"cannot capture the configured {section}:\n  " + "\n  ".join(problems))
    return result


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


@dataclass(frozen=True, slots=True)
class PublicationPlan:
    """What bringing the publication to exactly the captured tables takes; checked before anything changes."""

    name: str
    wanted: tuple[str, ...]
    current: tuple[str, ...] | None  # None: the publication does not exist
    set_via_root: bool = False  # the existing publication needs publish_via_partition_root = true

    @property
    def in_place(self) -> bool:
        return self.current is not None and self.current == self.wanted and not self.set_via_root


def plan_publication(conn: psycopg.Connection[tuple[object, ...]], name: str, tables: Iterable[str]) -> PublicationPlan:
    """Check that the publication can be created or brought to exactly ``tables`` by this role."""
    wanted = tuple(sorted(tables))
    row = conn.execute(
        """
        SELECT p.puballtables, pg_has_role(current_user, p.pubowner, 'USAGE'), r.rolname, p.pubviaroot
          FROM pg_publication p JOIN pg_roles r ON r.oid = p.pubowner WHERE p.pubname = %s
        """,
        (name,),
    ).fetchone()
    user = conn.info.user
    if row is None:
        not_owned = [
            t
            for t in wanted
            if not conn.execute(
                "SELECT pg_has_role(current_user, c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = to_regclass(%s)",
                (t,),
            ).fetchone()[0]  # type: ignore[index]
        ]
        if not_owned:
            raise StartupError(
                f"publication {name} does not exist and role {user} cannot create it: it does not own "
                f"{', '.join(not_owned)}. Fix: have the owner run CREATE PUBLICATION {name} FOR TABLE "
                f"{', '.join(wanted)} WITH (publish_via_partition_root = true); (least privilege; the owner needs "
                f"CREATE on the database), or grant {user} the owning role."
            )
        return PublicationPlan(name, wanted, None)
    all_tables, owner_ok, owner, via_root = row
    if all_tables:
        raise StartupError(
            f"publication {name} is FOR ALL TABLES, but this connector publishes exactly the configured tables. "
            f"Fix: DROP PUBLICATION {name}; (it is recreated), or configure another publication name."
        )
    current = publication_members(conn, name)
    if current != wanted and not owner_ok:
        missing = sorted(set(wanted) - set(current))
        extra = sorted(set(current) - set(wanted))
        fixes = []
        if missing:
            fixes.append(f"ALTER PUBLICATION {name} ADD TABLE {', '.join(missing)};")
        if extra:
            fixes.append(f"ALTER PUBLICATION {name} DROP TABLE {', '.join(extra)};")
        raise StartupError(
            f"publication {name} (owned by {owner}) publishes {', '.join(current) or 'no table'}, not exactly the "
            f"configured tables, and role {user} may not change it. Fix, as {owner}: {' '.join(fixes)}"
        )
    # A partitioned table's changes must arrive under its own name, not its partitions' (which are not captured).
    partitioned = sorted(
        t
        for t in wanted
        if conn.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", (t,)).fetchone() == (True,)
    )
    set_via_root = bool(partitioned) and not via_root
    if set_via_root and not owner_ok:
        raise StartupError(
            f"publication {name} (owned by {owner}) would publish the changes of the partitioned table(s) "
            f"{', '.join(partitioned)} under their partitions' names, which are not captured. Fix, as {owner}: "
            f"ALTER PUBLICATION {name} SET (publish_via_partition_root = true);"
        )
    return PublicationPlan(name, wanted, current, set_via_root)


def publication_shape(
    conn: psycopg.Connection[tuple[object, ...]], name: str, tables: dict[str, TableInfo]
) -> dict[str, TableInfo]:
    """``tables`` with what the existing publication ``name`` publishes of each: its row filter and column
    list (PostgreSQL 15+; earlier servers have neither)."""
    if conn.info.server_version < 150000:
        return tables
    shaped = dict(tables)
    for schema, table, row_filter, columns in conn.execute(
        "SELECT schemaname, tablename, rowfilter, attnames FROM pg_publication_tables WHERE pubname = %s", (name,)
    ).fetchall():
        info = shaped.get(f"{schema}.{table}")
        if info is None:
            continue
        published = tuple(str(c) for c in columns or ())  # type: ignore[attr-defined]
        generated = {
            str(r[0])
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attgenerated <> ''",
                (info.oid,),
            )
        }
        if conn.info.server_version < 180000:  # before 18 pgoutput never sends a generated column
            published = tuple(c for c in published if c not in generated)
        plain = tuple(c for c in info.columns if c not in generated)  # what a snapshot reads by default
        shaped[info.qualified] = dataclasses.replace(
            info,
            row_filter=str(row_filter) if row_filter is not None else None,
            # 18's publish_generated_columns = stored sends stored generated columns: snapshots read them too
            published_columns=published if published and published != plain else None,
        )
    return shaped


def publication_members(conn: psycopg.Connection[tuple[object, ...]], name: str) -> tuple[str, ...]:
    """The tables a publication was given (``pg_publication_rel``), sorted: a partitioned table as itself.
    (``pg_publication_tables`` lists a partitioned table's partitions instead unless the publication
    has publish_via_partition_root, so the fix it led to, ADD TABLE of a member, failed.)"""
    return tuple(
        sorted(
            f"{r[0]}.{r[1]}"
            for r in conn.execute(
                """
                SELECT n.nspname, c.relname FROM pg_publication_rel pr
                  JOIN pg_publication p ON p.oid = pr.prpubid
                  JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE p.pubname = %s
                """,
                (name,),
            ).fetchall()
        )
    )


# How long one attempt waits for the tables it adds to the publication (see apply_publication), and how often.
PUBLICATION_LOCK_TIMEOUT_S = 2.0
PUBLICATION_LOCK_ATTEMPTS = 10


def apply_publication(conn: psycopg.Connection[tuple[object, ...]], plan: PublicationPlan) -> None:
    """Create the publication or bring it to exactly ``plan.wanted``, in one transaction.

    The tables it adds are locked first (SHARE ROW EXCLUSIVE, until the commit), so no transaction that
    writes them runs across the publication change. Before PostgreSQL 13.21, 14.18, 15.13, 16.9 and 17.5,
    decoding such a transaction cached the table as unpublished, and every later change of the table was
    left out of the stream without an error (commit 4909b38af0, "Fix data loss in logical replication").
    The lock waits for the writers in flight, and writers queue behind it for as long as the change takes.
    """
    if plan.in_place:
        return
    added = plan.wanted if plan.current is None else tuple(t for t in plan.wanted if t not in plan.current)
    for attempt in range(1, PUBLICATION_LOCK_ATTEMPTS + 1):
        try:
            with conn.transaction():
                if added:
                    conn.execute(
                        sql.SQL("SET LOCAL lock_timeout = {}").format(
                            sql.Literal(f"{int(PUBLICATION_LOCK_TIMEOUT_S * 1000)}ms")
                        )
                    )
                    conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(_table_list(added)))
                _change_publication(conn, plan)
            return
        except psycopg.errors.LockNotAvailable:
            log.warning(
                "publication_lock_wait",
                publication=plan.name,
                tables=list(added),
                attempt=attempt,
                attempts=PUBLICATION_LOCK_ATTEMPTS,
            )
    raise StartupError(
        f"could not lock {', '.join(added)} to add them to publication {plan.name}: a transaction kept writing "
        f"them for {PUBLICATION_LOCK_ATTEMPTS * PUBLICATION_LOCK_TIMEOUT_S:.0f} s. The lock keeps concurrent "
        "writes from being left out of the stream (a PostgreSQL bug before 15.13, 16.9 and 17.5). Fix: end the "
        "long transaction (pg_stat_activity, state 'idle in transaction') and start again, or reload."
    )


def _table_list(tables: Iterable[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in tables)


def _change_publication(conn: psycopg.Connection[tuple[object, ...]], plan: PublicationPlan) -> None:
    table_list = _table_list(plan.wanted)
    ident = sql.Identifier(plan.name)
    if plan.current is None:
        # Partitions' changes published as their partitioned table's: the captured table is the partitioned one.
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)").format(
                ident, table_list
            )
        )
        log.info("publication_created", publication=plan.name, tables=list(plan.wanted))
        return
    if plan.set_via_root:
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(ident))
        log.info("publication_via_partition_root", publication=plan.name)
    if plan.current != plan.wanted:
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(ident, table_list))
        log.info("publication_altered", publication=plan.name, tables=list(plan.wanted), previous=list(plan.current))


def load_types(conn: psycopg.Connection[tuple[object, ...]], oids: Iterable[int]) -> dict[int, PgType]:
    """Resolve non-built-in types (enums, domains, arrays of them, ranges) from pg_type, recursively."""
    resolved: dict[int, PgType] = {}
    pending = set(oids)
    rows_by_oid: dict[int, tuple[object, ...]] = {}
    while pending:
        rows = conn.execute(
            """
            SELECT t.oid::int, t.typname, n.nspname, t.typtype, t.typelem::int, t.typbasetype::int,
                   t.typcategory,
                   COALESCE(r.rngsubtype, 0)::int,
                   ARRAY(SELECT enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)
              FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
              LEFT JOIN pg_range r ON r.rngtypid = t.oid
             WHERE t.oid = ANY(%s)
            """,
            (list(pending),),
        ).fetchall()
        pending = set()
        for r in rows:
            oid = int(str(r[0]))
            rows_by_oid[oid] = r
            for dep in (r[4], r[5], r[7]):
                d = int(str(dep))
                if d and d not in rows_by_oid:
                    pending.add(d)

    def build(oid: int) -> PgType:
        if oid in resolved:
            return resolved[oid]
        r = rows_by_oid[oid]
        name, schema, typtype, elem, base, category, subtype, labels = (
            str(r[1]),
            str(r[2]),
            str(r[3]),
            int(str(r[4])),
            int(str(r[5])),
            str(r[6]),
            int(str(r[7])),
            r[8],
        )
        element: PgType | None = None
        if typtype == "e":
            kind = TypeKind.ENUM
        elif typtype == "d":
            kind, element = TypeKind.DOMAIN, build(base)
        elif typtype == "r":
            kind, element = TypeKind.RANGE, build(subtype) if subtype else None
        elif typtype == "m":
            kind = TypeKind.MULTIRANGE
        elif typtype == "c":
            kind = TypeKind.COMPOSITE
        elif category == "A" and elem:
            kind, element = TypeKind.ARRAY, build(elem)
        else:
            kind = TypeKind.BASE
        label_tuple = tuple(str(x) for x in labels) if isinstance(labels, list) else ()
        t = PgType(oid, name, kind, schema, element, label_tuple)
        resolved[oid] = t
        return t

    for oid in rows_by_oid:
        build(oid)
    return resolved


def column_type_oids(conn: psycopg.Connection[tuple[object, ...]], table_oids: Sequence[int]) -> set[int]:
    rows = conn.execute(
        "SELECT DISTINCT atttypid::int FROM pg_attribute WHERE attrelid = ANY(%s) AND attnum > 0 AND NOT attisdropped",
        (list(table_oids),),
    ).fetchall()
    return {int(str(r[0])) for r in rows}
