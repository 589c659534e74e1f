"""The server's side of the start-up checks: wal_level, the role's REPLICATION attribute, failover slots,
and a warning for a server with a known data-loss bug."""

from __future__ import annotations

import psycopg
import structlog

from cdc.catalog.errors import StartupError
from cdc.replication import failover_refusal

log = structlog.get_logger("cdc.catalog")


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
