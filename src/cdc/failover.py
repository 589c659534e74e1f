"""Failover readiness: whether each standby named in the source DSN holds a copy of the slot that survives a
promotion (PostgreSQL 17+ slot synchronization: ``synced`` and not ``temporary`` in its
``pg_replication_slots``), and how far its copy is behind the primary's.

``cdc status`` reads it once; the daemon (``FailoverWatch``) every ``interval`` seconds, logging
``failover_readiness`` when a standby's state changes and keeping the last reading for /metrics.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.lsn import Lsn

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class HostSlot:
    """One host of the DSN and what it holds of the slot."""

    host: str
    port: str
    role: str  # "primary", "standby" or "unreachable"
    synced: bool | None = None  # standby: its copy is kept by slot synchronization
    temporary: bool | None = None  # standby: a copy not yet persisted (dropped at promotion)
    confirmed_flush_lsn: str | None = None
    behind_bytes: int | None = None  # standby: the primary's confirmed position minus its copy's
    error: str | None = None

    @property
    def ready(self) -> bool:
        """A promotion of this standby keeps the slot."""
        return self.role == "standby" and bool(self.synced) and self.temporary is False

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "role": self.role,
            "ready": self.ready,
            "synced": self.synced,
            "temporary": self.temporary,
            "confirmed_flush_lsn": self.confirmed_flush_lsn,
            "behind_bytes": self.behind_bytes,
            "error": self.error,
        }


def hosts(conninfo: str) -> list[tuple[str, str]]:
    """(host, port) of each host the DSN names, ports paired as libpq pairs them."""
    params = conninfo_to_dict(conninfo)
    names = str(params.get("host") or params.get("hostaddr") or "").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(names)
    return list(zip(names, ports, strict=False))


def each_host(conninfo: str, application_name: str, timeout_s: int) -> list[tuple[str, str, str]]:
    """(host, port, a conninfo reaching that host alone, whatever its role) for each host the DSN names."""
    return [
        (
            host,
            port,
            make_conninfo(
                conninfo,
                host=host,
                port=port,
                target_session_attrs="any",
                connect_timeout=timeout_s,
                application_name=application_name,
            ),
        )
        for host, port in hosts(conninfo)
    ]


def read(conninfo: str, slot: str, *, timeout_s: int = 3) -> list[HostSlot]:
    """Each host's role and copy of ``slot``; a host that does not answer is ``unreachable``."""
    found: list[HostSlot] = []
    for host, port, info in each_host(conninfo, "cdc-failover", timeout_s):
        try:
            with psycopg.connect(info, autocommit=True) as conn:
                standby = bool(conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,))
                columns = "synced, temporary" if standby and conn.info.server_version >= 170000 else "NULL, temporary"
                row = conn.execute(
                    f"SELECT {columns}, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,),
                ).fetchone()
        except psycopg.Error as e:
            found.append(HostSlot(host, port, "unreachable", error=str(e).strip().splitlines()[0]))
            continue
        if not standby:
            found.append(HostSlot(host, port, "primary", confirmed_flush_lsn=row[2] if row else None))
        elif row is None:
            found.append(HostSlot(host, port, "standby", synced=False, temporary=None))
        else:
            found.append(
                HostSlot(host, port, "standby", synced=bool(row[0]), temporary=bool(row[1]), confirmed_flush_lsn=row[2])
            )
    primary = next((h.confirmed_flush_lsn for h in found if h.role == "primary" and h.confirmed_flush_lsn), None)
    if primary is None:
        return found
    out = []
    for h in found:
        if h.role == "standby" and h.confirmed_flush_lsn:
            behind = max(0, int(Lsn.parse(primary)) - int(Lsn.parse(h.confirmed_flush_lsn)))
            h = HostSlot(h.host, h.port, h.role, h.synced, h.temporary, h.confirmed_flush_lsn, behind, h.error)
        out.append(h)
    return out


def setup_problems(conninfo: str, *, timeout_s: int = 3) -> tuple[list[str], list[str]]:
    """What keeps a failover slot from surviving a promotion, read from each host's settings (the table in
    docs/operations.md, "Beside a primary with standbys"): (problems, one line per missing setting naming the
    fix; notes, hosts before PostgreSQL 17, where no slot survives a failover whatever is set). For
    ``cdc validate``: unlike ``read``, it needs no slot yet."""
    problems: list[str] = []
    notes: list[str] = []
    standby_slots: list[str] = []
    primary_sync: str | None = None
    for host, port, info in each_host(conninfo, "cdc-validate", timeout_s):
        where = f"{host}:{port}"
        try:
            with psycopg.connect(info, autocommit=True) as conn:
                version = conn.info.server_version
                standby = bool(conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,))
                names = ["hot_standby_feedback", "primary_slot_name", "primary_conninfo"]
                if version >= 170000:
                    names += ["sync_replication_slots", "synchronized_standby_slots"]
                settings = {
                    str(r[0]): str(r[1] or "")
                    for r in conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (names,))
                }
        except psycopg.Error as e:
            problems.append(f"failover: host {where} does not answer ({str(e).strip().splitlines()[0]})")
            continue
        if version < 170000:
            notes.append(
                f"failover: host {where} runs PostgreSQL {version // 10000}: the slot cannot survive a failover to or "
                "from it (failover slots need 17 or newer)"
            )
            continue
        if not standby:
            primary_sync = settings.get("synchronized_standby_slots", "")
            continue
        fixes = []
        if settings.get("sync_replication_slots") != "on":
            fixes.append("sync_replication_slots = on (without it the standby never copies the slot)")
        if settings.get("hot_standby_feedback") != "on":
            fixes.append("hot_standby_feedback = on (without it the copy can be invalidated)")
        slot = settings.get("primary_slot_name", "")
        if not slot:
            fixes.append(
                "primary_slot_name = '<its physical slot on the primary>' (slot synchronization refuses to run)"
            )
        else:
            standby_slots.append(slot)
        if "dbname=" not in settings.get("primary_conninfo", ""):
            fixes.append("dbname=... in primary_conninfo (slot synchronization cannot connect)")
        for fix in fixes:
            problems.append(f"failover: standby {where} needs {fix}")
    if primary_sync is not None:
        listed = {s.strip() for s in primary_sync.split(",") if s.strip()}
        for slot in standby_slots:
            if slot not in listed and "*" not in listed:
                problems.append(
                    f"failover: the primary needs synchronized_standby_slots to list {slot} (without it the daemon may "
                    "publish changes the standby has not received, which a promotion then loses from the database)"
                )
    return problems, notes


class FailoverWatch:
    """Reads ``read()`` every ``interval_s`` on a thread of its own while the daemon runs (only for a DSN
    naming more than one host); logs each standby's readiness when it changes."""

    def __init__(self, conninfo: str, slot: str, interval_s: float = 30.0) -> None:
        self._conninfo = conninfo
        self._slot = slot
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[tuple[str, str], tuple[str, bool]] = {}
        self.latest: list[HostSlot] = []

    @staticmethod
    def wanted(conninfo: str) -> bool:
        return len(hosts(conninfo)) > 1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cdc-failover-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def check(self) -> list[HostSlot]:
        self.latest = current = read(self._conninfo, self._slot)
        for h in current:
            state = (h.role, h.ready)
            if self._last.get((h.host, h.port)) != state:
                self._last[(h.host, h.port)] = state
                event = log.info if h.ready or h.role == "primary" else log.warning
                event("failover_readiness", slot=self._slot, **h.as_dict())
        return current

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as e:
                log.warning("failover_readiness_unavailable", slot=self._slot, error=str(e))
            self._stop.wait(self._interval)
