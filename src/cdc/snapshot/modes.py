"""What to do at start-up, from the mode, the slot and what the progress topic remembers. Pure.

=================  ===================  =============================  ==========================  ===================
mode               slot missing         slot there, initial unfinished slot there, done / unknown  slot invalidated
=================  ===================  =============================  ==========================  ===================
initial            initial snapshot(*) stream + DBLog what is left    stream (+ DBLog new tables) error, says the fix
when_needed        initial snapshot     stream + DBLog what is left    stream (+ DBLog new tables) drop it, initial
always             initial snapshot     drop it, initial snapshot      drop it, initial snapshot   drop it, initial
no_data            create it, stream(*) stream (nothing copied)        stream                      error, says the fix
initial_only       a snapshot without any slot, then stop (a slot and its records are left alone; an
                   interrupted one starts over)
=================  ===================  =============================  ==========================  ===================

(*) when the progress topic remembers the slot (it existed and is gone: a failover without a
synchronized failover slot, or a dropped slot), ``snapshot.on_slot_missing`` decides: ``fail`` (the
default) stops with what may be missing and the fix; ``snapshot`` copies every table again.

"Unknown": a slot that exists while the progress topic holds nothing for it
(created before snapshots existed, or by ``no_data``): its tables count as
covered from now on, and tables configured later get a DBLog snapshot.

An initial snapshot whose slot already has records in the table topics first
writes a truncate marker into each of them: a consumer rebuilding from offset 0
then drops the rows of the previous slot, some of which may have been deleted
in the gap between the two slots.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from cdc.catalog import StartupError
from cdc.snapshot.config import SnapshotMode
from cdc.snapshot.state import InitialStatus

log = structlog.get_logger(__name__)

__all__ = ["SlotState", "StartupPlan", "decide", "inspect_slot"]


class SlotState(enum.Enum):
    MISSING = "missing"
    PRESENT = "present"
    LOST = "lost"  # wal_status = lost: invalidated, it cannot stream any more


@dataclass(frozen=True, slots=True)
class StartupPlan:
    drop_slot: bool = False
    initial: bool = False  # create the slot with an exported snapshot and copy every table
    without_slot: bool = False  # initial_only: copy under a snapshot of a plain connection
    create_slot: bool = False  # create the slot without a snapshot
    resume: bool = False  # an interrupted initial snapshot: stream, and DBLog what is left
    new_tables: tuple[str, ...] = ()  # configured tables the topics do not cover yet: DBLog
    baseline: bool = False  # the slot is unknown to the progress topic: cover what is configured now
    stream: bool = True
    reason: str = ""


def decide(
    mode: SnapshotMode,
    slot: SlotState,
    initial_status: str | None,
    covered: Mapping[str, int],
    tables: Mapping[str, int],
    *,
    slot_name: str = "",
    on_slot_missing: str = "fail",
) -> StartupPlan:
    """The start-up plan. ``covered`` and ``tables`` map table names to oids (a recreated table is new).

    ``on_slot_missing``: what ``initial`` and ``no_data`` do when the slot is missing although the progress
    topic remembers it (it existed, so changes may have been lost since): ``fail`` or ``snapshot``."""
    if mode is SnapshotMode.INITIAL_ONLY:
        return StartupPlan(without_slot=True, stream=False, reason="initial_only")
    if slot is SlotState.LOST and mode not in (SnapshotMode.WHEN_NEEDED, SnapshotMode.ALWAYS):
        raise StartupError(
            f"slot {slot_name} was invalidated (wal_status=lost): the server can no longer give it the changes it "
            "needs (max_slot_wal_keep_size, idle_replication_slot_timeout: the slot_invalidated line says which), "
            "so changes were lost. Fix: set snapshot.mode: when_needed to take a new snapshot automatically, or drop "
            f"the slot (SELECT pg_drop_replication_slot('{slot_name}')) and restart."
        )
    if mode is SnapshotMode.ALWAYS:
        return StartupPlan(drop_slot=slot is not SlotState.MISSING, initial=True, reason="always")
    if slot is SlotState.LOST:
        return StartupPlan(drop_slot=True, initial=True, reason="slot_invalidated")
    if slot is SlotState.MISSING:
        existed = (initial_status is not None and initial_status != InitialStatus.PENDING) or bool(covered)
        if existed and mode in (SnapshotMode.INITIAL, SnapshotMode.NO_DATA):  # PENDING: before the slot
            if on_slot_missing != "snapshot":
                raise StartupError(
                    f"slot {slot_name} is gone, but it existed: the progress topic records its snapshot. The "
                    "changes committed between the last position the daemon confirmed on it (the last change "
                    "in the topics) and now may be missing from the topics; this happens after a failover to "
                    "a standby that held no synchronized copy of the slot (source.slot_failover, PostgreSQL "
                    "17+; docs/operations.md 'Beside a primary with standbys'), or when someone dropped the "
                    "slot. Fix: set snapshot.on_slot_missing: snapshot and restart to copy every table again "
                    "(consumers see truncate markers first), or restore the slot if you have one"
                )
            return StartupPlan(initial=True, reason="slot_lost_snapshot")
        if mode is SnapshotMode.NO_DATA:
            return StartupPlan(create_slot=True, baseline=True, reason="no_data")
        return StartupPlan(initial=True, reason="slot_missing")
    # The slot is there.
    if mode is SnapshotMode.NO_DATA:
        return StartupPlan(baseline=not covered, reason="no_data")
    if initial_status in (InitialStatus.PENDING, InitialStatus.COPYING):
        new = tuple(
            sorted(t for t, oid in tables.items() if covered.get(t) != oid and initial_status == InitialStatus.COPYING)
        )
        return StartupPlan(resume=True, new_tables=new, reason="initial_interrupted")
    if initial_status is None and not covered:
        return StartupPlan(baseline=True, reason="slot_without_snapshot_record")
    new = tuple(sorted(t for t, oid in tables.items() if covered.get(t) != oid))
    return StartupPlan(new_tables=new, reason="tables_added" if new else "up_to_date")


# pg_replication_slots.invalidation_reason (PostgreSQL 17+) in words.
INVALIDATION_REASONS = {
    "wal_removed": "the server removed WAL it still needed (max_slot_wal_keep_size)",
    "rows_removed": "the server removed catalog rows it still needed (on a standby: hot_standby_feedback off)",
    "wal_level_insufficient": "wal_level was lowered below logical",
    "idle_timeout": "it was not used for longer than idle_replication_slot_timeout",
}


def inspect_slot(conn: psycopg.Connection[Any], slot: str) -> SlotState:
    """The slot's state; a slot of another plugin or database is a start-up error. An invalidated slot is
    logged (``slot_invalidated``) with the server's reason where it gives one (PostgreSQL 17+)."""
    reason = "invalidation_reason" if conn.info.server_version >= 170000 else "NULL"
    row = conn.execute(
        f"SELECT plugin, database, wal_status, {reason} FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return SlotState.MISSING
    plugin, database, wal_status, invalidation = row
    if plugin != "pgoutput":
        raise StartupError(
            f"slot {slot} exists with plugin {plugin}; this connector needs pgoutput. Use another slot name."
        )
    if database != conn.info.dbname:
        raise StartupError(
            f"slot {slot} belongs to database {database}, not {conn.info.dbname}. Use another slot name."
        )
    if wal_status != "lost":
        return SlotState.PRESENT
    log.warning(
        "slot_invalidated",
        slot=slot,
        invalidation_reason=invalidation,
        cause=INVALIDATION_REASONS.get(str(invalidation), "the server can no longer give the slot's changes"),
    )
    return SlotState.LOST
