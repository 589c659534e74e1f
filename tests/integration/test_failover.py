"""A primary failover with the slot the daemon creates itself: PostgreSQL 18, a physical standby with slot
synchronization, the primary killed with SIGKILL while a writer runs, the standby promoted. The daemon
(given both hosts, target_session_attrs=primary) resumes on the new primary from the synchronized slot:
the topic's replay equals the new primary's table, nothing missing and no second snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog

from cdc.dev import postgres as dev_postgres
from tests.support.connector import Connector, write_config
from tests.support.db import scalar
from tests.support.pg18 import pg_version
from tests.support.snapshots import assert_topic_equals_table

pytestmark = pytest.mark.integration
log = structlog.get_logger("tests.failover")
PHYSICAL_SLOT = "standby_phys"


class Pair:
    def __init__(self, primary: Path, standby: Path, primary_dsn: str, standby_dsn: str) -> None:
        self.primary, self.standby = primary, standby
        self.primary_dsn, self.standby_dsn = primary_dsn, standby_dsn

    def dsn(self, dbname: str) -> str:
        p = psycopg.conninfo.conninfo_to_dict(self.primary_dsn)
        s = psycopg.conninfo.conninfo_to_dict(self.standby_dsn)
        return (
            f"host={p['host']},{s['host']} port={p['port']},{s['port']} user={p['user']} dbname={dbname} "
            "target_session_attrs=primary connect_timeout=3"
        )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    """A PostgreSQL 18 primary and its physical standby, set up as docs/operations.md says."""
    primary_state, standby_state = tmp_path / "primary", tmp_path / "standby"
    with pg_version("18"):  # for the whole test: crash and promote use the same binaries
        try:
            primary_dsn = dev_postgres.up(
                primary_state, log, {"synchronized_standby_slots": f"'{PHYSICAL_SLOT}'", "wal_sender_timeout": "'5s'"}
            )
            with psycopg.connect(primary_dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_create_physical_replication_slot(%s)", (PHYSICAL_SLOT,))
                conn.execute("CREATE DATABASE shop")
            standby_dsn = dev_postgres.standby_of(
                primary_state,
                standby_state,
                log,
                physical_slot=PHYSICAL_SLOT,
                settings={"hot_standby_feedback": "on", "sync_replication_slots": "on"},
            )
            yield Pair(primary_state, standby_state, primary_dsn, standby_dsn)
        finally:
            for state in (standby_state, primary_state):
                try:
                    dev_postgres.down(state, log)
                except Exception as exc:
                    log.warning("tests.failover.down_failed", state=str(state), error=str(exc))


class Writer(threading.Thread):
    """Inserts one row per transaction into whichever server is the primary, until stopped."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.committed = 0
        self.failures = 0

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    while not self.stop.is_set():
                        n += 1
                        conn.execute("INSERT INTO items VALUES (%s, %s)", (n, f"row {n}"))
                        self.committed += 1
                        time.sleep(0.005)
            except psycopg.OperationalError:
                self.failures += 1
                time.sleep(0.2)


def run_validate(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", str(config)], capture_output=True, text=True, timeout=60
    )


def standby_slot(standby_dsn: str, slot: str) -> tuple[bool, bool] | None:
    """(synced, temporary) of the standby's copy of the slot, or None when it has none."""
    with psycopg.connect(psycopg.conninfo.make_conninfo(standby_dsn, dbname="shop"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    return None if row is None else (bool(row[0]), bool(row[1]))


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_the_daemon_resumes_on_the_promoted_standby_with_its_own_slot(
    tmp_path, services, pair, slot_name, topic_prefix, consume_all, mode
):
    dsn = pair.dsn("shop")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    delivery: dict[str, Any] = {"mode": mode}
    if mode == "exactly_once":
        delivery["offsets_topic"] = f"{topic_prefix}.__offsets"
    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot_name, "publication": "shop_pub", "failover_check_s": 0.5},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
        delivery=delivery,
    )
    daemon = Connector(config, tmp_path / "cdc.log").start()
    writer = Writer(dsn)
    try:
        daemon.wait_streaming(psycopg.conninfo.make_conninfo(pair.primary_dsn, dbname="shop"), slot_name)
        writer.start()
        standby_port = str(psycopg.conninfo.conninfo_to_dict(pair.standby_dsn)["port"])
        deadline = time.monotonic() + 90
        while (
            not [  # the daemon reads the standby's copy of the slot: synchronized and persistent
                e
                for e in daemon.log_events()
                if e.get("event") == "failover_readiness" and e.get("port") == standby_port and e.get("ready")
            ]
        ):
            assert time.monotonic() < deadline, f"the standby never held a synchronized copy:\n{daemon.output()}"
            time.sleep(0.5)
        assert standby_slot(pair.standby_dsn, slot_name) == (True, False)
        status = subprocess.run(
            [sys.executable, "-m", "cdc.cli", "status", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        assert f"standby 127.0.0.1:{standby_port}: ready for failover" in status.stdout, status.stdout
        validate = run_validate(config)
        assert validate.returncode == 0, validate.stdout + validate.stderr
        assert "failover: every standby synchronizes the slot; the primary waits for them" in validate.stdout
        time.sleep(1.0)  # changes flowing through the synchronized slot
        dev_postgres.crash(pair.primary, log)
        killed = time.monotonic()
        dev_postgres.promote(pair.standby, log)
        promoted_at = writer.committed
        deadline = time.monotonic() + 60
        while writer.committed < promoted_at + 200:  # the writer goes on against the new primary
            assert time.monotonic() < deadline, "the writer never reached the promoted standby"
            time.sleep(0.1)
        writer.stop.set()
        writer.join(10)
        topic = f"{topic_prefix}.public.items"
        with psycopg.connect(dsn, autocommit=True) as conn:
            last = scalar(conn.execute("SELECT max(id) FROM items"))
        deadline = time.monotonic() + 90
        first_seen: float | None = None
        while True:
            ids = {json.loads(m.key())["id"] for m in consume_all([topic], timeout=30)}
            if first_seen is None and any(i > promoted_at for i in ids):
                first_seen = time.monotonic()
            if last in ids:
                break
            assert daemon.proc is not None and daemon.proc.poll() is None, daemon.output()
            assert time.monotonic() < deadline, f"row {last} never reached {topic}:\n{daemon.output()[-4000:]}"
            time.sleep(0.5)
        rows = assert_topic_equals_table(consume_all, topic, dsn, "SELECT id, name FROM items")
        assert rows > promoted_at
        events = daemon.log_events()
        # One start-up snapshot (the first start's, of the empty table) and one slot: none after the failover.
        assert [e.get("reason") for e in events if e.get("event") == "snapshot_startup"] == ["slot_missing"]
        assert len([e for e in events if e.get("event") == "slot_created"]) == 1
        assert not [m for m in consume_all([topic], timeout=30) if m.value() and json.loads(m.value())["op"] == "r"]
        log.info("tests.failover.measured", mode=mode, seconds_kill_to_new_rows=round((first_seen or 0) - killed, 1))
    finally:
        writer.stop.set()
        assert daemon.stop() == 0, daemon.output()[-4000:]


def test_without_a_failover_slot_the_daemon_stops_and_a_new_snapshot_is_the_operators_decision(
    tmp_path, services, pair, slot_name, topic_prefix, consume_all
):
    dsn = pair.dsn("shop")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items SELECT i, 'row ' || i FROM generate_series(1, 50) i")

    def config(**snapshot: Any) -> Path:
        return write_config(
            tmp_path / "cdc.yaml",
            source={"dsn": dsn, "slot": slot_name, "publication": "shop_pub", "slot_failover": False},
            tables=["public.items"],
            kafka={"bootstrap_servers": services.kafka_bootstrap},
            topic_prefix=topic_prefix,
            snapshot=snapshot,
        )

    # cdc validate reads the standbys' settings when the DSN names several hosts: without
    # hot_standby_feedback the standby's copy could be invalidated, and validate says so.
    with psycopg.connect(pair.standby_dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET hot_standby_feedback = off")
        conn.execute("SELECT pg_reload_conf()")
    wanted = write_config(
        tmp_path / "wanted.yaml",
        source={"dsn": dsn, "slot": slot_name, "publication": "shop_pub"},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    standby_port = str(psycopg.conninfo.conninfo_to_dict(pair.standby_dsn)["port"])
    refused = run_validate(wanted)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"failover: standby 127.0.0.1:{standby_port} needs hot_standby_feedback = on" in refused.stderr
    skipped = run_validate(config())  # slot_failover: false: the operator chose no failover slot
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "failover:" not in skipped.stdout + skipped.stderr

    topic = f"{topic_prefix}.public.items"
    daemon = Connector(config(), tmp_path / "cdc.log").start()
    daemon.wait_streaming(psycopg.conninfo.make_conninfo(pair.primary_dsn, dbname="shop"), slot_name)
    assert_topic_equals_table(consume_all, topic, dsn, "SELECT id, name FROM items")
    time.sleep(2.0)  # the standby replays the slot's creation: it still holds no copy of it
    assert standby_slot(pair.standby_dsn, slot_name) is None
    dev_postgres.crash(pair.primary, log)
    dev_postgres.promote(pair.standby, log)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT i, 'after the failover ' || i FROM generate_series(51, 60) i")
    code = daemon.wait_exit(120)
    assert code != 0
    assert "this server was promoted from a standby that held no synchronized copy" in daemon.output()

    again = Connector(config(), tmp_path / "again.log").start()
    assert again.wait_exit(90) == 1
    out = again.output()
    assert f"slot {slot_name} is gone, but it existed" in out and "snapshot.on_slot_missing: snapshot" in out
    assert not [e for e in again.log_events() if e.get("event") == "slot_created"]

    fixed = Connector(config(on_slot_missing="snapshot"), tmp_path / "fixed.log").start()
    try:
        fixed.wait_streaming(dsn, slot_name)
        assert [e.get("reason") for e in fixed.log_events() if e.get("event") == "snapshot_startup"] == [
            "slot_lost_snapshot"
        ]
        assert assert_topic_equals_table(consume_all, topic, dsn, "SELECT id, name FROM items") == 60
    finally:
        assert fixed.stop() == 0, fixed.output()[-4000:]
