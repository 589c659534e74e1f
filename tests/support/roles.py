"""A least-privilege role, granted exactly what docs/operations.md ('The database role') lists.

``least_role(tables)`` creates ``LOGIN REPLICATION`` with a password, ``CONNECT`` on the test's database,
``USAGE`` on ``public`` and ``SELECT`` on the given tables; it returns the role's DSN. The tables' owner
(the test's superuser connection) keeps creating publications and altering them, as in the docs.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

LeastRole = Callable[..., str]


@pytest.fixture
def least_role(pg_dsn: str, test_id: str) -> Iterator[LeastRole]:
    name = f"cdc_{test_id}"[:63]
    password = secrets.token_hex(12)
    created = False

    def make(tables: list[str] = ()) -> str:  # type: ignore[assignment]
        nonlocal created
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            if not created:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                        sql.Identifier(name), sql.Literal(password)
                    )
                )
                conn.execute(
                    sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                        sql.Identifier(conn.info.dbname), sql.Identifier(name)
                    )
                )
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(name)))
                created = True
            grant_select(conn, name, tables)
        # The dev server trusts local connections: the password is set as the docs say, but not needed.
        return psycopg.conninfo.make_conninfo(pg_dsn, user=name)

    make.role = name  # type: ignore[attr-defined]
    yield make
    if created:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def grant_select(conn: psycopg.Connection[tuple[object, ...]], role: str, tables: list[str]) -> None:
    """As the owner: what the docs say to grant for one more captured table."""
    for table in tables:
        schema, _, name = table.rpartition(".")
        conn.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(schema or "public", name), sql.Identifier(role))
        )
