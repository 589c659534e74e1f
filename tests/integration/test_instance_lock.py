"""The one-instance-per-slot lock when its own connection is lost on the client side only."""

from __future__ import annotations

import os
import socket
from typing import Any

import psycopg
import pytest

from cdc.catalog import StartupError
from cdc.instance import InstanceLock

pytestmark = pytest.mark.integration


def lock_holders(dsn: str, slot: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = %s",
                (f"cdc-lock-{slot}",),
            )
        ]


def lose_client_side(conn: psycopg.Connection[Any]) -> int:
    """Break ``conn`` for the client while its server session lives on, as when a NAT gateway drops an
    idle flow: a duplicate of the socket stays open (returned; close it to let the session go), and
    libpq's descriptor number now names one end of a socket pair whose other end is closed."""
    fd = conn.pgconn.socket
    kept = os.dup(fd)
    mine, other = socket.socketpair()
    other.close()
    os.dup2(mine.fileno(), fd)
    mine.close()
    return kept


def test_a_lock_session_lost_on_the_client_side_is_ended_and_the_lock_taken_again(pg_dsn: str, slot_name: str) -> None:
    lock = InstanceLock(pg_dsn, slot_name)
    lock.acquire()
    assert lock._conn is not None
    [first] = lock_holders(pg_dsn, slot_name)
    kept = lose_client_side(lock._conn)
    try:
        assert lock_holders(pg_dsn, slot_name) == [first]  # the server still sees the old session holding it
        lock.ensure()  # at a reconnect: before, "another cdc instance is already running" (fatal)
        [second] = lock_holders(pg_dsn, slot_name)
        assert second != first
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first,)).fetchone() == (0,)
    finally:
        os.close(kept)
        lock.release()


def test_another_instances_lock_session_is_not_ended(pg_dsn: str, slot_name: str) -> None:
    mine = InstanceLock(pg_dsn, slot_name)
    mine.acquire()
    mine.release()  # this daemon had a lock session of its own; meanwhile another instance took the lock
    other = InstanceLock(pg_dsn, slot_name)
    other.acquire()
    try:
        [held] = lock_holders(pg_dsn, slot_name)
        with pytest.raises(StartupError, match=f"already running for slot {slot_name}.*PID {held}"):
            mine.ensure()
        assert lock_holders(pg_dsn, slot_name) == [held]
    finally:
        other.release()
