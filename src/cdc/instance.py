"""One daemon per slot: a session-level advisory lock held for the daemon's lifetime.

The replication slot itself admits one reader, but a second daemon would only
find out after its start-up work, and would then retry "slot active" as if it
were its own previous connection. The lock makes it fail fast instead, and it
vanishes with the process (the server drops it with the connection).
"""

from __future__ import annotations

import hashlib
import time

import psycopg
import structlog

from cdc.catalog import StartupError
from cdc.replication import ConnectionLost

log = structlog.get_logger(__name__)


def _key(slot: str) -> int:
    digest = hashlib.blake2b(f"cdc slot {slot}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class InstanceLock:
    def __init__(self, conninfo: str, slot: str) -> None:
        self._conninfo = conninfo
        self._slot = slot
        self._key = _key(slot)
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._session: tuple[object, object] | None = None  # (backend PID, backend start) of the last lock session

    def acquire(self, wait_s: float = 5.0) -> None:
        """Take the lock, waiting briefly: a killed predecessor's backend may take a moment to go.

        A holder that is this daemon's own earlier lock session (same backend PID and start time: a
        connection lost on the client side, e.g. dropped by a NAT gateway, whose backend the server has
        not noticed yet) is ended instead of being taken for another instance.
        """
        conn = psycopg.connect(self._conninfo, autocommit=True, application_name=f"cdc-lock-{self._slot}")
        deadline = time.monotonic() + wait_s
        while True:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,)).fetchone()
            if (row and row[0]) or time.monotonic() >= deadline:
                break
            holder = self._holder(conn)
            if holder is not None and self._session is not None and (holder[0], holder[2]) == self._session:
                try:
                    conn.execute("SELECT pg_terminate_backend(%s)", (holder[0],))
                    log.warning("instance_lock_stale_session_ended", slot=self._slot, pid=holder[0])
                except psycopg.errors.InsufficientPrivilege:
                    pass  # it goes when the server notices; until the deadline, the error below
            time.sleep(0.25)
        if not row or not row[0]:
            holder = self._holder(conn)
            conn.close()
            who = (
                f" (its lock connection is backend PID {holder[0]} from {holder[1] or 'local socket'} since "
                f"{holder[2]})"
                if holder
                else ""
            )
            gone = (
                f" If that instance is gone (its host died, so the server has not noticed yet), end its session: "
                f"SELECT pg_terminate_backend({holder[0]});"
                if holder
                else ""
            )
            raise StartupError(
                f"another cdc instance is already running for slot {self._slot}{who}. One instance per slot: "
                f"stop the other one, or give this one its own slot.{gone}"
            )
        me = conn.execute(
            "SELECT pid, backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        self._session = (me[0], me[1]) if me else None
        self._conn = conn
        log.info("instance_lock_acquired", slot=self._slot)

    def _holder(self, conn: psycopg.Connection[tuple[object, ...]]) -> tuple[object, ...] | None:
        """(backend PID, client address, backend start) of the session holding the lock, if any."""
        return conn.execute(
            """
            SELECT a.pid, a.client_addr::text, a.backend_start::text FROM pg_locks l
              JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted
               AND l.classid = ((%s::bigint >> 32) & 4294967295)::oid
               AND l.objid = (%s::bigint & 4294967295)::oid AND l.objsubid = 1
            """,
            (self._key, self._key),
        ).fetchone()

    def ensure(self) -> None:
        """After a Postgres restart the lock is gone with its connection: take it again."""
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            try:
                self._conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                pass
        self.release()
        try:
            self.acquire()
        except psycopg.OperationalError as e:  # the server is still down: the caller retries
            raise ConnectionLost(f"cannot reach Postgres to take the instance lock again: {str(e).strip()}") from None

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
