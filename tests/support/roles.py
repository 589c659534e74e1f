"""A least-privilege role, granted exactly what docs/operations.md ('The database role') lists.

``least_role(tables)`` creates ``LOGIN REPLICATION`` with a password, ``CONNECT`` on the test's database,
``USAGE`` on ``public`` and ``SELECT`` on the given tables; it returns the role's DSN. The tables' owner
(the test's superuser connection) keeps creating publications and altering them, as in the docs.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence

import psycopg
import pytest
from psycopg import sql


class LeastRole:
    """``least_role(tables)``: the role, created at the first call, granted SELECT on ``tables``; returns its DSN.
    ``least_role.role`` is its name."""

    def __init__(self, dsn: str, role: str) -> None:
        self.dsn = dsn
        self.role = role
        self.password = secrets.token_hex(12)
        self.created = False

    def __call__(self, tables: Sequence[str] = ()) -> str:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            if not self.created:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                        sql.Identifier(self.role), sql.Literal(self.password)
                    )
                )
                conn.execute(
                    sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                        sql.Identifier(conn.info.dbname), sql.Identifier(self.role)
                    )
                )
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(self.role)))
                self.created = True
            grant_select(conn, self.role, tables)
        # The dev server trusts local connections: the password is set as the docs say, but not needed.
        return psycopg.conninfo.make_conninfo(self.dsn, user=self.role)


@pytest.fixture
def least_role(pg_dsn: str, test_id: str) -> Iterator[LeastRole]:
    made = LeastRole(pg_dsn, f"cdc_{test_id}"[:63])
    yield made
    if made.created:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(made.role)))
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (made.role,))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(made.role)))


def grant_select(conn: psycopg.Connection[tuple[object, ...]], role: str, tables: Sequence[str]) -> None:
    """As the owner: what the docs say to grant for one more captured table."""
    for table in tables:
        schema, _, name = table.rpartition(".")
        conn.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(schema or "public", name), sql.Identifier(role))
        )
