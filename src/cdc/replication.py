"""The replication transport: CopyBoth frames over psycopg's libpq layer, keepalives, standby status.

This module frames bytes and reports positions; it does not decode pgoutput
(``cdc.decoder.pgoutput`` does) and knows nothing of Kafka. The positions it
reports to the server never move backwards, and the flush position moves only
when the pipeline says everything up to it is durable (``confirm``).
"""

from __future__ import annotations

import select
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import psycopg
import structlog
from psycopg import pq
from psycopg.pq.abc import PGconn, PGresult

from cdc.lsn import Lsn

log = structlog.get_logger(__name__)

_XLOGDATA_HEADER = struct.Struct(">QQq")  # after the 'w' byte: wal start, wal end, send time
_KEEPALIVE = struct.Struct(">QqB")  # after the 'k' byte: wal end, send time, reply requested
_STATUS = struct.Struct(">cQQQqB")
_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in microseconds since the Unix epoch
XLOGDATA_HEADER_SIZE = 1 + _XLOGDATA_HEADER.size  # 25: the pgoutput payload starts here
_WAL_START_AT_1 = struct.Struct(">Q").unpack_from
_NEW_LSN: Final = int.__new__

# pgoutput sends values in their text output, which these settings shape; a database or role default
# (ALTER DATABASE ... SET DateStyle = 'SQL, DMY') would otherwise reach the walsender and change what
# cdc.decoder.types parses. Set on every replication connection, after the user's own options.
OUTPUT_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "1",  # shortest exact text of floats (a database default of 0 rounds them)
    "bytea_output": "hex",
    "lc_monetary": "C",
    # timestamptz is an instant whatever the zone; in UTC its text always ends in "+00", which
    # cdc.decoder.types parses on a fast path.
    "TimeZone": "UTC",
}


class ReplicationError(Exception):
    """The replication connection cannot go on; the message says why and what to do."""


class ConnectionLost(ReplicationError):
    """The connection dropped (network, server restart): reconnect and resume from the slot."""


class SlotBusy(ReplicationError):
    """Another connection still holds the slot (often a previous one of ours not yet gone): retry."""


class SlotGone(ReplicationError):
    """The slot was dropped or invalidated: it cannot be resumed."""


def _now_pg_us() -> int:
    return time.time_ns() // 1000 - _PG_EPOCH_US


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _error_text(conn: PGconn, res: PGresult | None) -> str:
    """The server's error for a result, else the connection's, as text."""
    if res is not None and res.error_message:
        return res.error_message.decode(errors="replace").strip()
    raw: bytes | str = conn.get_error_message()
    return (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip()


@dataclass(frozen=True, slots=True)
class SlotInfo:
    name: str
    consistent_point: Lsn
    snapshot_name: str | None


def protocol_for(server_version_num: int, *, streaming: bool) -> tuple[int, dict[str, str]]:
    """The pgoutput protocol version and START_REPLICATION options for a server version.

    The newest protocol the server speaks: 1 before PostgreSQL 14, 2 on 14
    (streaming of in-progress transactions), 3 on 15 (adds two-phase), 4 on 16+
    (adds parallel streaming). With ``streaming`` and a server of 14 or later,
    ``streaming 'on'``: large transactions arrive in blocks before they commit
    and the decoder spools them. ``two_phase`` is never asked for (prepared
    transactions then arrive once, at COMMIT PREPARED, like any other), nor
    ``streaming 'parallel'``, which serves parallel apply workers and brings a
    single reader nothing but a longer Stream Abort. ``messages`` and
    ``publication_names`` are ``ReplicationStream.start``'s business.
    """
    if server_version_num < 140000:
        return 1, {}
    if server_version_num < 150000:
        proto = 2
    elif server_version_num < 160000:
        proto = 3
    else:
        proto = 4
    return proto, ({"streaming": "on"} if streaming else {})


def classify_error(message: str) -> ReplicationError:
    """Map a server error text to the kind of failure the caller must handle."""
    text = message.strip()
    if "is active for PID" in text:
        return SlotBusy(text)
    if "does not exist" in text and "replication slot" in text:
        return SlotGone(
            f"{text}. The slot was dropped, or this server was promoted from a standby that held no "
            "synchronized copy of it (source.slot_failover, PostgreSQL 17+): changes since the last confirmed "
            "position may be missing. Restarting stops again at start-up unless snapshot.on_slot_missing: snapshot "
            "(a new slot and a new snapshot) is set."
        )
    if (
        "can no longer get changes from replication slot" in text
        or "invalidated" in text
        or ("requested WAL segment" in text and "has already been removed" in text)
    ):
        return SlotGone(
            f"{text}. The slot was invalidated (max_slot_wal_keep_size removed WAL it needed); "
            "changes were lost on the server side: drop the slot and take a new snapshot."
        )
    return ReplicationError(text)


def _copy_ended(conn: PGconn, res: PGresult | None) -> ReplicationError:
    """Why the server ended the copy: a shutdown or a killed walsender (reconnect) or a real error."""
    if conn.status != pq.ConnStatus.OK:
        return ConnectionLost(f"replication connection lost: {_error_text(conn, res) or 'closed by the server'}")
    if res is None or res.status == pq.ExecStatus.COMMAND_OK:
        # A walsender that shuts down cleanly (fast shutdown, restart) ends the copy without an error.
        return ConnectionLost("the server ended replication: it is shutting down or restarting")
    message = _error_text(conn, res) or "the server ended replication"
    error = classify_error(message)
    severity = res.error_field(pq.DiagnosticField.SEVERITY_NONLOCALIZED)
    if type(error) is ReplicationError and severity in (b"FATAL", b"PANIC"):
        # The walsender is gone (pg_terminate_backend, shutdown, crash): its session ended, not the slot.
        return ConnectionLost(f"replication connection lost: {message}")
    return error


def failover_refusal(wanted: bool | None, server_version: int, standby: bool) -> str | None:
    """Why ``source.slot_failover: true`` cannot be met on this server, or None (the setting unset or false
    is never refused: the slot is then a failover slot where the server supports one)."""
    if not wanted:
        return None
    if server_version < 170000:
        return (
            f"source.slot_failover is true, but the server is PostgreSQL {server_version // 10000}: failover "
            "slots (kept on standbys through a promotion) need PostgreSQL 17 or newer. Fix: upgrade the "
            "server, or set source.slot_failover: false (after a failover the slot is then gone)"
        )
    if standby:
        return (
            "source.slot_failover is true, but the server is a standby, where a failover slot cannot be "
            "created. Fix: connect to the primary (a multi-host DSN with target_session_attrs=primary), or "
            "set source.slot_failover: false"
        )
    return None


class ReplicationStream:
    """One replication connection: create the slot, stream from it, report positions."""

    def __init__(
        self,
        conninfo: str,
        *,
        status_interval: float = 10.0,
        on_keepalive: Callable[[Lsn], None] | None = None,
        slot_failover: bool | None = None,
    ) -> None:
        """``slot_failover``: a failover slot (PostgreSQL 17+, kept on standbys that synchronize slots) when
        True; None: one where the server supports it and this is a primary; False: never."""
        self._conninfo = conninfo
        self._slot_failover = slot_failover
        self._status_interval = status_interval
        self._on_keepalive = on_keepalive
        self._conn: PGconn | None = None
        self._received = 0  # a plain int: it moves with every frame, an Lsn per frame costs
        self._flushed = Lsn(0)
        self._sent_flushed = Lsn(0)
        self._last_status = 0.0
        self._streaming = False
        self.last_message: float | None = None  # monotonic time of the last XLogData or keepalive (metrics)

    # -- connection -----------------------------------------------------------------------------

    def connect(self) -> None:
        params = psycopg.conninfo.conninfo_to_dict(self._conninfo)
        pinned = " ".join(f"-c {name}={value}" for name, value in OUTPUT_SETTINGS.items())
        options = f"{params['options']} {pinned}" if params.get("options") else pinned
        conninfo = psycopg.conninfo.make_conninfo(
            self._conninfo,
            replication="database",
            application_name=params.get("application_name") or "cdc",
            client_encoding="UTF8",  # pgoutput converts text to the client encoding; types.py reads UTF-8
            options=options,
        )
        conn = pq.PGconn.connect(conninfo.encode())
        if conn.status != pq.ConnStatus.OK:
            msg = _error_text(conn, None)
            conn.finish()
            if "no pg_hba.conf entry for replication" in msg:
                msg += ". Allow replication connections for this user in pg_hba.conf."
            elif "replication role" in msg or "REPLICATION attribute" in msg:
                msg += ". Grant it: ALTER ROLE <user> REPLICATION."
            raise ConnectionLost(f"cannot open a replication connection: {msg}")
        self._conn = conn
        self._streaming = False

    @property
    def server_version(self) -> int:
        return int(self._require().server_version)

    def _require(self) -> PGconn:
        if self._conn is None:
            raise ReplicationError("the replication connection is not open")
        return self._conn

    def _command(self, sql: str) -> PGresult:
        conn = self._require()
        res = conn.exec_(sql.encode())
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.COPY_BOTH):
            message = _error_text(conn, res)
            if conn.status != pq.ConnStatus.OK:
                raise ConnectionLost(message.strip())
            raise classify_error(message)
        return res

    def _query_value(self, sql: str) -> str | None:
        res = self._command(sql)
        if res.ntuples == 0:
            return None
        value = res.get_value(0, 0)
        return None if value is None else value.decode()

    def failover_wanted(self) -> bool:
        """Whether the slot is to be a failover slot on this server (see ``slot_failover``); refuses a
        request the server cannot meet."""
        version = self.server_version
        if self._slot_failover is False:
            return False
        standby = version >= 170000 and self._query_value("SELECT pg_is_in_recovery()") == "t"
        refusal = failover_refusal(self._slot_failover, version, standby)
        if refusal is not None:
            raise ReplicationError(refusal)
        return version >= 170000 and not standby

    def create_slot(self, slot: str, *, export_snapshot: bool = False) -> SlotInfo:
        """CREATE_REPLICATION_SLOT with pgoutput; the snapshot, if exported, lives until the next command."""
        mode = "export" if export_snapshot else "nothing"
        failover = self.failover_wanted()
        options = f"SNAPSHOT '{mode}'" + (", FAILOVER true" if failover else "")
        res = self._command(f"CREATE_REPLICATION_SLOT {_quote_ident(slot)} LOGICAL pgoutput ({options})")
        point = Lsn.parse((res.get_value(0, 1) or b"").decode())
        snap = res.get_value(0, 2)
        log.info("slot_created", slot=slot, consistent_point=str(point), failover=failover)
        return SlotInfo(slot, point, snap.decode() if snap else None)

    def ensure_failover(self, slot: str) -> None:
        """Make an existing slot a failover slot where one is wanted (a slot made before the setting, or by
        a snapshot's connection): ALTER_REPLICATION_SLOT, while no one streams from it."""
        if not self.failover_wanted():
            return
        current = self._query_value(
            f"SELECT failover FROM pg_catalog.pg_replication_slots WHERE slot_name = {_quote_literal(slot)}"
        )
        if current is None or current == "t":
            return  # missing: START_REPLICATION names it; already a failover slot
        try:
            self._command(f"ALTER_REPLICATION_SLOT {_quote_ident(slot)} (FAILOVER true)")
        except ConnectionLost:
            raise
        except ReplicationError as e:
            raise ReplicationError(
                f"slot {slot} is not a failover slot and could not be made one ({e}). Fix: run "
                f"ALTER_REPLICATION_SLOT {slot} (FAILOVER true) on a replication connection as the slot's role "
                '(psql "dbname=<db> replication=database"), or set source.slot_failover: false'
            ) from e
        log.info("slot_failover_enabled", slot=slot)

    def start(
        self,
        slot: str,
        publication: str,
        start_lsn: Lsn,
        *,
        proto_version: int = 1,
        messages: bool = True,
        options: Mapping[str, str] | None = None,
    ) -> None:
        """START_REPLICATION with pgoutput.

        ``messages`` adds ``messages 'true'`` (logical messages: heartbeats,
        outbox, watermarks); ``options`` are further pgoutput options, as
        ``protocol_for`` returns them (``{"streaming": "on"}``).
        """
        self.ensure_failover(slot)
        opts = [f"proto_version '{proto_version}'", f"publication_names {_quote_literal(_quote_ident(publication))}"]
        if messages:
            opts.append("messages 'true'")
        for name, value in (options or {}).items():
            if not name.replace("_", "").isalnum():
                raise ReplicationError(f"not a pgoutput option name: {name!r}")
            opts.append(f"{name} {_quote_literal(value)}")
        self._command(f"START_REPLICATION SLOT {_quote_ident(slot)} LOGICAL {start_lsn} ({', '.join(opts)})")
        self._streaming = True
        self._received = max(self._received, start_lsn)
        self._flushed = max(self._flushed, start_lsn)
        self._sent_flushed = self._flushed
        self._last_status = time.monotonic()
        log.info(
            "replication_started",
            slot=slot,
            publication=publication,
            start_lsn=str(start_lsn),
            proto_version=proto_version,
            options=dict(options or {}),
        )

    # -- reading --------------------------------------------------------------------------------

    def read(self, timeout: float) -> tuple[Lsn, memoryview] | None:
        """The next XLogData frame as its WAL start and its pgoutput payload, or None on timeout.

        Keepalives are handled here: answered at once when the server asks, and
        reported through ``on_keepalive``. Status updates go out on the interval.
        """
        conn = self._conn
        if conn is None:
            raise ReplicationError("the replication connection is not open")
        deadline = 0.0
        consumed = False
        while True:
            try:
                n, data = conn.get_copy_data(1)
            except psycopg.OperationalError as e:
                raise ConnectionLost(f"replication connection lost: {e}") from None
            if n > 0:
                kind = data[0]
                if kind == 0x77:  # 'w' XLogData
                    self.last_message = time.monotonic()
                    start = _WAL_START_AT_1(data, 1)[0]
                    if start > self._received:
                        self._received = start
                    view = data if type(data) is memoryview else memoryview(data)
                    # An unsigned 64-bit field is in Lsn's range: int.__new__ skips its check (per frame).
                    return _NEW_LSN(Lsn, start), view[XLOGDATA_HEADER_SIZE:]
                if kind == 0x6B:  # 'k' primary keepalive
                    self.last_message = time.monotonic()
                    wal_end, _, reply = _KEEPALIVE.unpack_from(data, 1)
                    if self._on_keepalive is not None:
                        self._on_keepalive(Lsn(wal_end))
                    if reply:
                        self.send_status(force=True)
                    continue
                raise ReplicationError(f"unexpected CopyData message type {chr(kind)!r} from the server")
            if n == 0:
                self.send_status_if_due()
                if not consumed:
                    # libpq's buffer is empty, the socket may not be: read it before sleeping.
                    self._consume(conn)
                    consumed = True
                    continue
                now = time.monotonic()
                if deadline == 0.0:
                    deadline = now + timeout
                remaining = min(deadline - now, self._status_interval)
                if remaining <= 0:
                    return None
                ready, _, _ = select.select([conn.socket], [], [], remaining)
                consumed = False
                if not ready and time.monotonic() >= deadline:
                    return None
                continue
            # n == -1: the server ended the copy; -2: an error
            self._streaming = False  # nothing more to send or end on this connection
            raise _copy_ended(conn, conn.get_result())

    @staticmethod
    def _consume(conn: PGconn) -> None:
        try:
            conn.consume_input()
        except psycopg.OperationalError as e:
            raise ConnectionLost(f"replication connection lost: {e}") from None

    # -- positions ------------------------------------------------------------------------------

    @property
    def flushed(self) -> Lsn:
        return self._flushed

    def confirm(self, lsn: Lsn) -> None:
        """Everything up to ``lsn`` is durable downstream; tell the server soon (never backwards)."""
        if lsn > self._flushed:
            self._flushed = lsn
            if lsn > self._received:
                self._received = lsn

    def send_status_if_due(self) -> None:
        now = time.monotonic()
        elapsed = now - self._last_status
        if elapsed >= self._status_interval:
            # Ask for a keepalive back: its WAL end lets an idle pipeline confirm past WAL that held
            # nothing for it (other tables, other databases), so the slot does not pin WAL.
            self.send_status(reply=True)
        elif self._flushed > self._sent_flushed and elapsed >= 0.2:
            self.send_status()

    def send_status(self, *, force: bool = False, reply: bool = False) -> None:
        if not self._streaming or self._conn is None:
            return
        conn = self._conn
        msg = _STATUS.pack(b"r", self._received, self._flushed, self._flushed, _now_pg_us(), 1 if reply else 0)
        try:
            if conn.put_copy_data(msg) != 1 or conn.flush() < 0:
                raise ConnectionLost(f"cannot send a status update: {_error_text(conn, None)}")
        except psycopg.OperationalError as e:
            raise ConnectionLost(f"cannot send a status update: {e}") from None
        self._sent_flushed = self._flushed
        self._last_status = time.monotonic()

    # -- stopping -------------------------------------------------------------------------------

    def close(self) -> None:
        """Send the final position, end the copy, close. Safe to call twice or after a failure."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        try:
            if self._streaming and conn.status == pq.ConnStatus.OK:
                msg = _STATUS.pack(b"r", self._received, self._flushed, self._flushed, _now_pg_us(), 0)
                conn.put_copy_data(msg)
                conn.put_copy_end()
                conn.flush()
                # Drain what the server still sends until it ends the copy.
                deadline = time.monotonic() + 5.0
                while time.monotonic() < deadline:
                    n, _ = conn.get_copy_data(0)
                    if n < 0:
                        break
                while conn.get_result() is not None:
                    pass
        except psycopg.OperationalError as e:
            log.warning("replication_close_unclean", error=str(e))
        finally:
            conn.finish()
            self._streaming = False
            log.info("replication_closed", flushed=str(self._flushed))
