"""The publication: planned (what bringing it to exactly the captured tables takes, refused before anything
changes when this role may not), applied in one transaction, and read back (members, row filters, columns)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
import structlog
from psycopg import sql

from cdc.catalog.errors import StartupError
from cdc.event import TableInfo

log = structlog.get_logger("cdc.catalog")


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
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND "
                "attgenerated <> ''",
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
