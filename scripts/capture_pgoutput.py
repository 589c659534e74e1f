"""Capture real pgoutput payloads from a PostgreSQL server, as test data for the codec.

    .venv/bin/python scripts/capture_pgoutput.py postgresql://postgres@127.0.0.1:54999/postgres

The server needs ``wal_level=logical`` and a superuser in the DSN; with
``max_prepared_transactions > 0`` the two-phase messages are captured too, and
on PostgreSQL 16+ a protocol 4 slot with ``streaming 'parallel'`` adds the long
Stream Abort. The script creates a scratch database (``pgoutput_capture``),
creates its tables, publication and slots, runs one transaction per *step*
(below), then reads each slot over a replication connection through
``psycopg.pq`` and keeps a handful of payloads of each kind, written to
``tests/data/pgoutput/<NN>_<kind>.bin`` with a ``manifest.json`` describing
each file (kind, variant, step, slot, protocol version, in_stream) and the
facts a test checks them against (relation and type oids, xids, GIDs). It
drops the slots and the database when done.

It classifies payloads from their raw bytes on purpose, without
``cdc.decoder.pgoutput``, so that the captured files do not depend on the
codec they test.
"""

from __future__ import annotations

import argparse
import json
import select
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import make_conninfo

DATABASE = "pgoutput_capture"
PUBLICATION = "capture_pub"
ORIGIN = "capture_origin"
ORIGIN_LSN = "0/ABCDEF01"
ORIGIN_TIMESTAMP = "2024-01-01 00:00:00+00"
WORK_MEM = "64kB"  # small, so that a few thousand rows make the server stream
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "pgoutput"

SCHEMA_SQL = """
CREATE SCHEMA capture;
CREATE TYPE capture.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE capture.accounts (
    id int PRIMARY KEY, name text NOT NULL, balance numeric(12, 2), active bool, opened date, note text
);
CREATE TABLE capture.audit (id int PRIMARY KEY, payload jsonb, at timestamptz);
ALTER TABLE capture.audit REPLICA IDENTITY FULL;
CREATE TABLE capture.moods (id int PRIMARY KEY, mood capture.mood);
CREATE TABLE capture.parent (id serial PRIMARY KEY, label text);
CREATE TABLE capture.child (id serial PRIMARY KEY, parent_id int REFERENCES capture.parent);
CREATE TABLE capture.docs (id int PRIMARY KEY, title text, body text);
ALTER TABLE capture.docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE capture.bulk (id int PRIMARY KEY, filler text);
INSERT INTO capture.parent (label) VALUES ('p');
INSERT INTO capture.child (parent_id) VALUES (1);
"""

# A value stored out of line (STORAGE EXTERNAL, > 2 kB), so that an update
# that leaves it alone sends it as 'u' (unchanged TOAST).
TOAST_BODY = "".join(f"{i:04d}" for i in range(1000))  # 4,000 characters

# One transaction per step, in this order. Each list holds SQL run between
# BEGIN and COMMIT (unless the step manages the transaction itself).
STEPS: dict[str, list[str]] = {
    "insert_accounts": [
        "INSERT INTO capture.accounts VALUES (1, 'alice', 100.50, true, '2024-01-31', 'first'),"
        " (2, 'bob', NULL, false, '2024-02-29', NULL)",
    ],
    "update_no_key_change": ["UPDATE capture.accounts SET balance = 250.75 WHERE id = 1"],
    "update_key_change": ["UPDATE capture.accounts SET id = 3 WHERE id = 2"],
    "delete_default": ["DELETE FROM capture.accounts WHERE id = 3"],
    "insert_audit": [
        "INSERT INTO capture.audit VALUES (10, '{\"a\": 1}', '2024-03-01 12:00:00+00')",
    ],
    "update_full": ["UPDATE capture.audit SET payload = '{\"a\": 2}' WHERE id = 10"],
    "delete_full": ["DELETE FROM capture.audit WHERE id = 10"],
    "insert_enum": ["INSERT INTO capture.moods VALUES (1, 'happy')"],
    "truncate_cascade": ["TRUNCATE capture.parent RESTART IDENTITY CASCADE"],
    "truncate_plain": ["TRUNCATE capture.moods"],
    "message_transactional": [
        "SELECT pg_logical_emit_message(true, 'capture.tx.é', '\\x00ff68656c6c6f'::bytea)",
    ],
    "message_nontransactional": [],  # run outside a transaction, see run_steps
    "origin": [],  # needs a replication origin session, see run_steps
    "toast_insert": [f"INSERT INTO capture.docs VALUES (1, 'draft', '{TOAST_BODY}')"],
    "toast_update": ["UPDATE capture.docs SET title = 'final' WHERE id = 1"],
    "streamed_commit": [
        "INSERT INTO capture.moods VALUES (2, 'ok')",
        "UPDATE capture.accounts SET name = 'alice (streamed)' WHERE id = 1",
        "DELETE FROM capture.accounts WHERE id = 4",
        "TRUNCATE capture.child",
        "SAVEPOINT doomed",
        "INSERT INTO capture.bulk SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g",
        "ROLLBACK TO SAVEPOINT doomed",
        "INSERT INTO capture.bulk SELECT g, repeat('y', 100) FROM generate_series(1, 2000) g",
        "SELECT pg_logical_emit_message(true, 'capture.stream', 'inside a stream')",
    ],
    "streamed_abort": [
        "INSERT INTO capture.bulk SELECT g, repeat('z', 100) FROM generate_series(10001, 13000) g",
    ],  # rolled back
    "prepare_commit": ["INSERT INTO capture.accounts VALUES (5, 'prepared', 5.00, true, '2024-05-05', NULL)"],
    "prepare_rollback": ["INSERT INTO capture.accounts VALUES (6, 'rolled back', 6.00, true, '2024-06-06', NULL)"],
    "prepare_streamed": [
        "INSERT INTO capture.bulk SELECT g, repeat('p', 100) FROM generate_series(20001, 23000) g",
    ],
    "done": ["SELECT pg_logical_emit_message(true, 'capture.done', '')"],
}
TWO_PHASE_STEPS = {
    "prepare_commit": "capture-commit",
    "prepare_rollback": "capture-rollback",
    "prepare_streamed": "capture-stream",
}
STREAMED_STEPS = {"streamed_commit", "streamed_abort"}


@dataclass
class SlotPlan:
    """One slot, the options it is read with, and which steps' payloads to keep from it."""

    name: str
    proto_version: int
    options: dict[str, str]
    keep_steps: set[str]
    two_phase: bool = False
    kept: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Facts:
    """What the server says about the captured transactions, written to the manifest."""

    server_version: int = 0
    relations: dict[str, int] = field(default_factory=dict)
    types: dict[str, int] = field(default_factory=dict)
    xids: dict[str, int] = field(default_factory=dict)
    gids: dict[str, str] = field(default_factory=dict)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn", help="superuser DSN of a server with wal_level=logical")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args()

    facts = Facts()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        facts.server_version = int(scalar(admin, "SHOW server_version_num"))
        if scalar(admin, "SHOW wal_level") != "logical":
            print("the server needs wal_level=logical", file=sys.stderr)
            return 2
        two_phase = int(scalar(admin, "SHOW max_prepared_transactions")) > 0
        if not two_phase:
            print("max_prepared_transactions is 0: skipping the prepared transactions (protocol 3 messages)")
        drop_scratch(admin, args.dsn)
        admin.execute(f"CREATE DATABASE {DATABASE}")

    scratch_dsn = make_conninfo(args.dsn, dbname=DATABASE)
    plans = slot_plans(facts.server_version, two_phase)
    try:
        with psycopg.connect(scratch_dsn, autocommit=True) as conn:
            conn.execute(SCHEMA_SQL)
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
            for plan in plans:
                conn.execute(
                    "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
                    (plan.name, plan.two_phase),
                )
            facts.relations = {
                f"capture.{name}": int(oid)
                for name, oid in conn.execute(
                    "SELECT relname, oid FROM pg_class WHERE relnamespace = 'capture'::regnamespace AND relkind = 'r'"
                )
            }
            facts.types = {"capture.mood": int(scalar(conn, "SELECT 'capture.mood'::regtype::oid"))}
            run_steps(conn, facts, two_phase)
        for plan in plans:
            read_slot(scratch_dsn, plan, facts)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            drop_scratch(admin, args.dsn)
    write_output(args.out, plans, facts)
    return 0


def slot_plans(server_version: int, two_phase: bool) -> list[SlotPlan]:
    publication = {"publication_names": PUBLICATION, "messages": "true"}
    every_plain_step = set(STEPS) - STREAMED_STEPS - set(TWO_PHASE_STEPS) - {"done"}
    plans = [
        SlotPlan("capture_v1", 1, {"proto_version": "1", **publication}, every_plain_step),
        SlotPlan(
            "capture_v1_binary",
            1,
            {"proto_version": "1", **publication, "binary": "true"},
            {"insert_accounts", "insert_enum", "toast_update"},
        ),
        SlotPlan("capture_v2_stream", 2, {"proto_version": "2", **publication, "streaming": "on"}, STREAMED_STEPS),
    ]
    if two_phase:
        plans.append(
            SlotPlan(
                "capture_v3_two_phase",
                3,
                {"proto_version": "3", **publication, "streaming": "on", "two_phase": "on"},
                set(TWO_PHASE_STEPS),
                two_phase=True,
            )
        )
    if server_version >= 160000:
        plans.append(
            SlotPlan(
                "capture_v4_parallel",
                4,
                {"proto_version": "4", **publication, "streaming": "parallel"},
                {"streamed_abort"},
            )
        )
    return plans


def scalar(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def drop_scratch(admin: psycopg.Connection[Any], dsn: str) -> None:
    """Drop what an earlier run may have left: slots, prepared transactions, the origin, the database."""
    for (slot,) in admin.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (DATABASE,)
    ).fetchall():
        drop_slot(admin, slot)
    leftover = admin.execute("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (DATABASE,)).fetchall()
    if leftover:  # ROLLBACK PREPARED must run in the database that prepared them
        with psycopg.connect(make_conninfo(dsn, dbname=DATABASE), autocommit=True) as scratch:
            for (gid,) in leftover:
                scratch.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    if admin.execute("SELECT 1 FROM pg_replication_origin WHERE roname = %s", (ORIGIN,)).fetchone():
        admin.execute("SELECT pg_replication_origin_drop(%s)", (ORIGIN,))
    admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")


def drop_slot(admin: psycopg.Connection[Any], slot: str) -> None:
    # Right after the replication connection closes, the walsender may still hold the slot.
    for attempt in range(50):
        try:
            admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return
        except psycopg.errors.ObjectInUse:
            if attempt == 49:
                raise
            time.sleep(0.1)


def run_steps(conn: psycopg.Connection[Any], facts: Facts, two_phase: bool) -> None:
    def current_xid() -> int:
        # The protocol carries the 32-bit xid; xid8 adds the epoch in the high bits.
        return int(scalar(conn, "SELECT pg_current_xact_id()::text::bigint")) & 0xFFFFFFFF

    for step, statements in STEPS.items():
        if step == "message_nontransactional":
            conn.execute("SELECT pg_logical_emit_message(false, 'capture.nontx', 'ping')")
            continue
        if step in TWO_PHASE_STEPS:
            if not two_phase:
                continue
            gid = TWO_PHASE_STEPS[step]
            conn.execute("BEGIN")
            facts.xids[step] = current_xid()
            for statement in statements:
                conn.execute(statement)
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
            finish = "ROLLBACK" if step == "prepare_rollback" else "COMMIT"
            conn.execute(f"{finish} PREPARED '{gid}'")
            facts.gids[step] = gid
            continue
        if step == "origin":
            conn.execute("SELECT pg_replication_origin_create(%s)", (ORIGIN,))
            conn.execute("SELECT pg_replication_origin_session_setup(%s)", (ORIGIN,))
            conn.execute("BEGIN")
            facts.xids[step] = current_xid()
            conn.execute("SELECT pg_replication_origin_xact_setup(%s, %s)", (ORIGIN_LSN, ORIGIN_TIMESTAMP))
            conn.execute("INSERT INTO capture.accounts VALUES (4, 'from origin', 4.00, true, '2024-04-04', NULL)")
            conn.execute("COMMIT")
            conn.execute("SELECT pg_replication_origin_session_reset()")
            continue
        conn.execute("BEGIN")
        facts.xids[step] = current_xid()
        for statement in statements:
            conn.execute(statement)
        conn.execute("ROLLBACK" if step == "streamed_abort" else "COMMIT")


# --- reading a slot -------------------------------------------------------------------------------

XLOG_DATA = struct.Struct(">cQQq")  # 'w', wal start, wal end, send time
KEEPALIVE = struct.Struct(">cQqB")  # 'k', wal end, send time, reply requested
STANDBY_STATUS = struct.Struct(">cQQQqB")
XID = struct.Struct(">I")
KIND_NAMES = {
    b"B": "Begin",
    b"C": "Commit",
    b"O": "Origin",
    b"R": "Relation",
    b"Y": "Type",
    b"I": "Insert",
    b"U": "Update",
    b"D": "Delete",
    b"T": "Truncate",
    b"M": "LogicalMessage",
    b"S": "StreamStart",
    b"E": "StreamStop",
    b"c": "StreamCommit",
    b"A": "StreamAbort",
    b"b": "BeginPrepare",
    b"P": "Prepare",
    b"K": "CommitPrepared",
    b"r": "RollbackPrepared",
    b"p": "StreamPrepare",
}
# Offset of the xid in the messages that open or close a transaction or a stream block.
XID_OFFSET = {b"B": 17, b"S": 1, b"c": 1, b"A": 1, b"b": 25, b"P": 26, b"K": 26, b"r": 34, b"p": 26}
# Keep only the first Begin and Commit of a slot: the others look alike.
ONCE_PER_SLOT = {"Begin", "Commit"}


class Tracker:
    """Follows transactions and stream blocks in a slot's payloads and picks the ones to keep."""

    def __init__(self, plan: SlotPlan, facts: Facts) -> None:
        self.plan = plan
        self.step_of_xid = {xid: step for step, xid in facts.xids.items()}
        self.in_stream = False
        self.txn_step: str | None = None
        self.stream_step: str | None = None
        self.stream_xid: int | None = None
        self.counts: dict[tuple[str, ...], int] = {}
        self.finished = False

    def feed(self, payload: bytes, wal_start: int) -> None:
        tag = payload[:1]
        kind = KIND_NAMES.get(tag, f"unknown-{tag!r}")
        in_stream = self.in_stream
        xid = XID.unpack_from(payload, XID_OFFSET[tag])[0] if tag in XID_OFFSET else None
        if tag in (b"B", b"b"):
            self.txn_step = self.step_of_xid.get(xid)  # type: ignore[arg-type]
        if tag == b"S":
            self.in_stream = True
            self.stream_step = self.step_of_xid.get(xid)  # type: ignore[arg-type]
            self.stream_xid = xid
        step: str | None
        if tag in (b"S", b"E") or (in_stream and tag != b"O"):
            step = self.stream_step
        elif xid is not None and tag not in (b"B", b"b"):
            step = self.step_of_xid.get(xid)
        elif tag == b"M" and self.txn_step is None:
            step = "message_nontransactional"
        else:
            step = self.txn_step
        if tag == b"E":
            self.in_stream = False
        if tag in (b"C", b"P", b"K", b"r"):  # the end of a transaction, or of its first phase
            if tag == b"C" and self.txn_step == "done":
                self.finished = True
            self.txn_step = None

        variant = self.variant(tag, payload, in_stream)
        if in_stream and tag in b"RYIUDTM" and XID.unpack_from(payload, 1)[0] != self.stream_xid:
            variant = "_".join(filter(None, [variant, "subtransaction"]))  # changes carry the subxact's xid
        once = kind in ONCE_PER_SLOT and step != "origin"  # the origin sets the commit timestamp
        key = (kind,) if once else (str(step), kind, variant, str(in_stream))
        limit = 2 if (step, kind) == ("insert_accounts", "Insert") else 1  # both rows, one with NULLs
        if step not in self.plan.keep_steps or self.counts.get(key, 0) >= limit:
            return
        self.counts[key] = self.counts.get(key, 0) + 1
        self.plan.kept.append(
            {
                "kind": kind,
                "variant": variant,
                "step": step,
                "in_stream": in_stream,
                "payload": payload,
                "wal_start": wal_start,
            }
        )

    @staticmethod
    def variant(tag: bytes, payload: bytes, in_stream: bool) -> str:
        head = 1 + (4 if in_stream else 0)
        if tag in (b"U", b"D"):
            marker = payload[head + 4 : head + 5]
            return {b"K": "old_key", b"O": "old", b"N": "new_only"}.get(marker, "unknown")
        if tag == b"M":
            return "transactional" if payload[head] & 1 else "nontransactional"
        if tag == b"S":
            return "first_segment" if payload[5] == 1 else "next_segment"
        if tag == b"A":
            xid, subxid = struct.unpack_from(">II", payload, 1)
            scope = "transaction" if xid == subxid else "subtransaction"
            return scope + ("_parallel" if len(payload) > 9 else "")
        if tag == b"T":
            return {0: "plain", 1: "cascade", 2: "restart_identity", 3: "cascade_restart_identity"}.get(
                payload[head + 4], "other"
            )
        return ""


def read_slot(scratch_dsn: str, plan: SlotPlan, facts: Facts, timeout: float = 120.0) -> None:
    conninfo = make_conninfo(scratch_dsn, replication="database", options=f"-c logical_decoding_work_mem={WORK_MEM}")
    conn = pq.PGconn.connect(conninfo.encode())
    if conn.status != pq.ConnStatus.OK:
        raise RuntimeError(f"replication connection failed: {conn.get_error_message()!r}")
    try:
        shown = conn.exec_(b"SHOW logical_decoding_work_mem")
        if shown.status != pq.ExecStatus.TUPLES_OK or shown.get_value(0, 0) != WORK_MEM.encode():
            raise RuntimeError(f"logical_decoding_work_mem is not {WORK_MEM} on the replication connection")
        options = ", ".join(f"{name} '{value}'" for name, value in plan.options.items())
        result = conn.exec_(f"START_REPLICATION SLOT {plan.name} LOGICAL 0/0 ({options})".encode())
        if result.status != pq.ExecStatus.COPY_BOTH:
            raise RuntimeError(f"START_REPLICATION on {plan.name} failed: {result.error_message!r}")
        tracker = Tracker(plan, facts)
        deadline = time.monotonic() + timeout
        received = 0
        while not tracker.finished:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{plan.name}: no end marker after {timeout}s ({received} messages)")
            size, data = conn.get_copy_data(1)
            if size == 0:
                conn.consume_input()
                if conn.is_busy():
                    select.select([conn.socket], [], [], 1.0)
                continue
            if size < 0:
                raise RuntimeError(f"{plan.name}: copy ended: {conn.get_error_message()!r}")
            frame = bytes(data)
            if frame[:1] == b"w":
                _, wal_start, _, _ = XLOG_DATA.unpack_from(frame)
                received += 1
                tracker.feed(frame[XLOG_DATA.size :], wal_start)
            elif frame[:1] == b"k":
                _, wal_end, _, reply = KEEPALIVE.unpack_from(frame)
                if reply:
                    conn.put_copy_data(STANDBY_STATUS.pack(b"r", wal_end, 0, 0, pg_now_us(), 0))
                    conn.flush()
        print(f"{plan.name}: {received} messages read, {len(plan.kept)} kept")
        conn.put_copy_end()
        conn.flush()
        while True:
            size, _ = conn.get_copy_data(0)
            if size < 0:
                break
        while conn.get_result() is not None:
            pass
    finally:
        conn.finish()


def pg_now_us() -> int:
    return int((time.time() - 946_684_800) * 1_000_000)


def format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def write_output(out: Path, plans: list[SlotPlan], facts: Facts) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.bin"), out / "manifest.json"]:
        old.unlink(missing_ok=True)
    files = []
    number = 0
    for plan in plans:
        for kept in plan.kept:
            number += 1
            slug = snake(kept["kind"]) + (f"_{kept['variant']}" if kept["variant"] else "")
            if kept["in_stream"] and kept["kind"] != "StreamStop":
                slug = "in_stream_" + slug
            name = f"{number:02d}_{slug}.bin"
            (out / name).write_bytes(kept["payload"])
            files.append(
                {
                    "file": name,
                    "kind": kept["kind"],
                    "variant": kept["variant"],
                    "step": kept["step"],
                    "in_stream": kept["in_stream"],
                    "proto_version": plan.proto_version,
                    "slot": plan.name,
                    "options": {k: v for k, v in plan.options.items() if k != "publication_names"},
                    "wal_start": format_lsn(kept["wal_start"]),
                }
            )
    manifest = {
        "about": "pgoutput payloads (bytes after the XLogData header) captured by scripts/capture_pgoutput.py",
        "server_version": facts.server_version,
        "logical_decoding_work_mem": WORK_MEM,
        "relations": facts.relations,
        "types": facts.types,
        "xids": facts.xids,
        "gids": facts.gids,
        "origin": {"name": ORIGIN, "lsn": ORIGIN_LSN, "timestamp": ORIGIN_TIMESTAMP},
        "toast_body_length": len(TOAST_BODY),
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    total = sum(p.stat().st_size for p in out.glob("*.bin"))
    print(f"wrote {len(files)} files ({total:,} bytes) and manifest.json to {out}")


def snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


if __name__ == "__main__":
    sys.exit(main())
