"""A slot the server invalidates while the daemon streams (max_slot_wal_keep_size exceeded while the daemon
could not read): changes are lost on the server side, so the daemon stops with the cause and the fix instead
of reconnecting forever or carrying on past the gap, and the next start refuses the invalidated slot."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.connector import Connector, write_config
from tests.support.pg18 import own_server

pytestmark = pytest.mark.integration


@pytest.fixture
def small_wal_server(tmp_path: Path) -> Iterator[str]:
    """A server of its own (the suite's default version) that keeps at most 32 MB of WAL for a slot."""
    with own_server(tmp_path / "pg", {"max_slot_wal_keep_size": "'32MB'", "max_wal_size": "'64MB'"}) as dsn:
        yield dsn


def test_a_slot_invalidated_while_streaming_stops_the_daemon_with_the_cause(
    tmp_path, services, small_wal_server, slot_name, publication_name, topic_prefix
):
    dsn = small_wal_server
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE filler (id bigserial PRIMARY KEY, pad text)")  # not captured: only WAL
    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    daemon = Connector(config, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(dsn, slot_name)
        assert daemon.proc is not None
        os.kill(daemon.proc.pid, signal.SIGSTOP)  # the daemon cannot read or confirm: the slot holds WAL
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO items VALUES (1, 'lost with the slot')")
                for _ in range(6):  # ~100 MB of WAL, far past max_slot_wal_keep_size
                    conn.execute("INSERT INTO filler (pad) SELECT repeat('x', 1000) FROM generate_series(1, 15000)")
                    conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
                deadline = time.monotonic() + 60
                while True:
                    row = conn.execute(
                        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)
                    ).fetchone()
                    if row == ("lost",):
                        break
                    assert time.monotonic() < deadline, f"the slot was not invalidated: {row}"
                    conn.execute("CHECKPOINT")
                    time.sleep(0.5)
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        code = daemon.wait_exit(120)
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
    out = daemon.output()
    assert code != 0, out[-4000:]
    assert "The slot was invalidated" in out and "drop the slot and take a new snapshot" in out, out[-4000:]

    again = Connector(config, tmp_path / "again.log").start()
    assert again.wait_exit(90) != 0
    assert "was invalidated (wal_status=lost)" in again.output(), again.output()[-4000:]


@pytest.fixture
def idle_timeout_server(tmp_path: Path) -> Iterator[str]:
    """A PostgreSQL 18 server of its own that invalidates a slot unused for a second."""
    with own_server(tmp_path / "pg18", {"idle_replication_slot_timeout": "'1s'"}, major="18") as dsn:
        yield dsn


def test_a_slot_invalidated_while_the_daemon_was_stopped_is_refused_naming_the_reason(
    tmp_path, services, idle_timeout_server, slot_name, publication_name, topic_prefix
):
    dsn = idle_timeout_server
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    daemon = Connector(config, tmp_path / "cdc.log").start()
    daemon.wait_streaming(dsn, slot_name)
    assert daemon.stop() == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while True:  # idle_replication_slot_timeout acts at checkpoints
            time.sleep(1.5)
            conn.execute("CHECKPOINT")
            row = conn.execute(
                "SELECT wal_status, invalidation_reason FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)
            ).fetchone()
            if row == ("lost", "idle_timeout"):
                break
            assert time.monotonic() < deadline, f"the slot was not invalidated: {row}"

    again = Connector(config, tmp_path / "again.log").start()
    assert again.wait_exit(90) != 0
    out = again.output()
    assert f"slot {slot_name} was invalidated (wal_status=lost)" in out, out[-4000:]
    logged = [e for e in again.log_events() if e.get("event") == "slot_invalidated"]
    assert logged and logged[0]["invalidation_reason"] == "idle_timeout", out[-4000:]
    assert "idle_replication_slot_timeout" in logged[0]["cause"]
