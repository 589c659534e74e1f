"""Snapshots on request under the least-privilege role: `cdc snapshot` with a signal table the owner
created, the owner's statements when there is none, a signal aimed at one connector, and old signals
left alone by a connector that starts later."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration

SIGNALS = "public.cdc_signal"


def config(tmp_path: Path, name: str, services: Any, dsn: str, slot: str, publication: str, prefix: str) -> Path:
    return write_config(
        tmp_path / f"{name}.yaml",
        source={"dsn": dsn, "slot": slot, "publication": publication},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=prefix,
        snapshot={"signal_table": SIGNALS, "signal_poll_s": 0.3},
    )


def snapshot(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "snapshot", "--config", str(cfg), "public.items"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def events(c: Connector, name: str) -> list[dict[str, Any]]:
    return [e for e in c.log_events() if e.get("event") == name]


def wait_event(c: Connector, name: str, timeout: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while not events(c, name):
        assert c.proc is not None and c.proc.poll() is None, c.output()[-4000:]
        assert time.monotonic() < deadline, f"no {name} within {timeout}s:\n{c.output()[-4000:]}"
        time.sleep(0.2)
    return events(c, name)


@pytest.fixture
def items(pg_dsn: str, publication_name: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items SELECT i, 'n' || i FROM generate_series(1, 10) i")
        conn.execute(f"CREATE PUBLICATION {publication_name} FOR TABLE items")
    return pg_dsn


def test_without_a_signal_table_the_owner_gets_the_statements_and_then_cdc_snapshot_works(
    tmp_path, services, items, least_role, slot_name, publication_name, topic_prefix
):
    role_dsn = least_role(["public.items"])
    cfg = config(tmp_path, "a", services, role_dsn, slot_name, publication_name, topic_prefix)
    refused = snapshot(cfg)
    assert refused.returncode == 1
    assert f"the signal table {SIGNALS} does not exist and role {least_role.role} may not create it" in refused.stderr
    statements = re.findall(r"((?:CREATE TABLE|GRANT) [^;]+;)", refused.stderr)
    assert len(statements) == 2, refused.stderr
    with psycopg.connect(items, autocommit=True) as conn:  # as the owner, as printed
        for statement in statements:
            conn.execute(statement)
    daemon = Connector(cfg, tmp_path / "a.log").start()
    try:
        daemon.wait_streaming(items, slot_name)
        done = snapshot(cfg)
        assert done.returncode == 0, done.stderr
        [accepted] = wait_event(daemon, "snapshot_signal_accepted")
        assert accepted["tables"] == ["public.items"]
    finally:
        assert daemon.stop() == 0


def test_a_signal_for_one_connector_is_left_alone_by_another_and_old_signals_by_a_later_one(
    tmp_path, services, items, least_role, slot_name, publication_name, topic_prefix
):
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {SIGNALS} (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))"
        )
    role_dsn = least_role(["public.items", SIGNALS])
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute(f"GRANT INSERT ON {SIGNALS} TO {least_role.role}")
    a = config(tmp_path, "a", services, role_dsn, slot_name, publication_name, topic_prefix)
    b = config(tmp_path, "b", services, role_dsn, slot_name + "_b", publication_name, topic_prefix + "_b")
    first, second = Connector(a, tmp_path / "a.log").start(), Connector(b, tmp_path / "b.log").start()
    try:
        first.wait_streaming(items, slot_name)
        second.wait_streaming(items, slot_name + "_b")
        requested = snapshot(a)  # least privilege: the table exists, so nothing is created
        assert requested.returncode == 0, requested.stderr
        [accepted] = wait_event(first, "snapshot_signal_accepted")
        [ignored] = wait_event(second, "snapshot_signal_ignored")
        assert ignored["connector"] == slot_name and ignored["signal"] == accepted["signal"]
        assert not events(second, "snapshot_signal_accepted")
    finally:
        assert first.stop() == 0 and second.stop() == 0
    # A third connector started now: the signal is older than its slot, it does not snapshot again.
    c = config(tmp_path, "c", services, role_dsn, slot_name + "_c", publication_name, topic_prefix + "_c")
    third = Connector(c, tmp_path / "c.log").start()
    try:
        third.wait_streaming(items, slot_name + "_c")
        [before] = wait_event(third, "snapshot_signals_before_slot")
        assert before["count"] == 1
        time.sleep(1.5)  # several polls of the signal table
        assert not events(third, "snapshot_signal_accepted") and not events(third, "snapshot_signal_ignored")
    finally:
        assert third.stop() == 0
