"""Operating the daemon: one instance per slot, metrics that move, reload on SIGHUP, no secret in any output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.connector import Connector, write_config
from tests.support.http import get, http_port, metric

pytestmark = pytest.mark.integration

SECRET = "Sw0rdf1sh-n3ver-in-logs"


def make_config(
    tmp_path: Path,
    services: Any,
    dsn: str,
    slot: str,
    publication: str,
    prefix: str,
    tables: list[Any],
    name: str = "cdc.yaml",
) -> Path:
    return write_config(
        tmp_path / name,
        source={"dsn": dsn, "slot": slot, "publication": publication},
        tables=tables,
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=prefix,
        status_interval_s=1.0,
    )


@pytest.fixture
def shop(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
    return pg_dsn


def test_a_second_instance_on_the_same_slot_fails_fast_with_a_clear_message(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix
):
    cfg = make_config(tmp_path, services, shop, slot_name, publication_name, topic_prefix, ["public.customers"])
    first = Connector(cfg, tmp_path / "first.log").start()
    try:
        first.wait_streaming(shop, slot_name)
        second = Connector(cfg, tmp_path / "second.log").start()
        started = time.monotonic()
        code = second.wait_exit(60)
        elapsed = time.monotonic() - started
        assert code == 1
        assert f"another cdc instance is already running for slot {slot_name}" in second.output()
        assert elapsed < 30
        with psycopg.connect(shop, autocommit=True) as conn:  # the first one's lock session, which the fix names
            pids = [
                r[0]
                for r in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"cdc-lock-{slot_name}",)
                )
            ]
        assert any(f"SELECT pg_terminate_backend({pid});" in second.output() for pid in pids), second.output()
    finally:
        assert first.stop() == 0


def test_health_readiness_and_metrics_move_with_a_workload(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix
):
    cfg = make_config(
        tmp_path, services, shop, slot_name, publication_name, topic_prefix, ["public.customers", "public.orders"]
    )
    c = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        port = http_port(c)
        c.wait_streaming(shop, slot_name)
        assert get(port, "/healthz") == (200, "ok\n")
        deadline = time.monotonic() + 20
        while get(port, "/readyz")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert get(port, "/readyz")[0] == 200
        _, before = get(port, "/metrics")
        assert metric(before, "cdc_events_total", table="public.customers", op="c") is None
        with psycopg.connect(shop, autocommit=True) as conn:
            for i in range(30):
                conn.execute("INSERT INTO customers VALUES (%s, 'x')", (i,))
            conn.execute("UPDATE customers SET name = 'y' WHERE id < 10")
            conn.execute("DELETE FROM orders")
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            _, text = get(port, "/metrics")
            if metric(text, "cdc_events_total", table="public.customers", op="u") == 10:
                break
            time.sleep(0.3)
        assert metric(text, "cdc_events_total", table="public.customers", op="c") == 30
        assert metric(text, "cdc_events_total", table="public.customers", op="u") == 10
        confirmed = metric(text, "cdc_confirmed_lsn")
        assert confirmed is not None and confirmed > 0
        assert metric(text, "cdc_slot_lag_bytes") is not None
        assert metric(text, "cdc_queue_bytes") is not None
        assert metric(text, "cdc_delivery_errors_total") == 0
        assert metric(text, "cdc_source_lag_ms") is not None
    finally:
        assert c.stop() == 0
    assert get_refused(port)


def get_refused(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


def test_sighup_adds_a_table_without_a_restart(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = make_config(tmp_path, services, shop, slot_name, publication_name, topic_prefix, ["public.customers"])
    c = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        c.wait_streaming(shop, slot_name)
        make_config(
            tmp_path, services, shop, slot_name, publication_name, topic_prefix, ["public.customers", "public.orders"]
        )
        assert c.proc is not None
        pid = c.proc.pid
        c.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(e.get("event") == "reload_tables" for e in c.log_events()):
            time.sleep(0.2)
        assert any(e.get("event") == "reload_tables" and e["added"] == ["public.orders"] for e in c.log_events()), (
            c.output()
        )
        with psycopg.connect(shop, autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (1, 42)")
        topic = f"{topic_prefix}.public.orders"
        deadline = time.monotonic() + 30
        msgs: list[Any] = []
        while time.monotonic() < deadline and not msgs:
            msgs = consume_all([topic], timeout=10.0)
            time.sleep(0.3)
        assert [json.loads(m.value())["after"] for m in msgs] == [{"id": 1, "total": 42}]
        assert c.proc.pid == pid and c.proc.poll() is None
    finally:
        assert c.stop() == 0


def test_secrets_never_appear_in_logs_errors_or_status(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix
):
    # The dev server trusts local connections, so any password is accepted: what matters is where it shows up.
    env = {"CDC_SOURCE__PASSWORD": SECRET}
    cfg = make_config(tmp_path, services, shop, slot_name, publication_name, topic_prefix, ["public.customers"])
    c = Connector(cfg, tmp_path / "cdc.log", env=env).start()
    try:
        c.wait_streaming(shop, slot_name)
        with psycopg.connect(shop, autocommit=True) as conn:
            conn.execute("INSERT INTO customers VALUES (1, 'x')")
        time.sleep(1)
    finally:
        assert c.stop() == 0
    outputs = [c.output()]
    # A failing start (unknown table), a reachable-but-wrong port, and the status command.
    bad = make_config(
        tmp_path,
        services,
        shop,
        slot_name + "x",
        publication_name + "x",
        topic_prefix,
        ["public.nope"],
        name="bad.yaml",
    )
    failing = Connector(bad, tmp_path / "bad.log", env=env).start()
    assert failing.wait_exit(60) == 1
    outputs.append(failing.output())
    wrong_port = write_config(
        tmp_path / "wrong.yaml",
        source={
            "dsn": psycopg.conninfo.make_conninfo(shop, port="1"),
            "slot": slot_name,
            "publication": publication_name,
        },
        tables=["public.customers"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    refused = Connector(wrong_port, tmp_path / "refused.log", env=env).start()
    assert refused.wait_exit(60) == 1
    outputs.append(refused.output())
    status = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "status", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert status.returncode == 0, status.stderr
    assert f"slot {slot_name}" in status.stdout and "public.customers" in status.stdout
    outputs.append(status.stdout + status.stderr)
    for text in outputs:
        assert text.strip()
        assert SECRET not in text


# --------------------------------------------------------------------------- the smaller things a new user met


def test_initial_snapshot_rows_and_a_key_change_are_counted_as_debezium_writes_them(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix
):
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("INSERT INTO customers SELECT i, 'c' || i FROM generate_series(1, 7) i")
    cfg = make_config(tmp_path, services, shop, slot_name, publication_name, topic_prefix, ["public.customers"])
    c = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        port = http_port(c)
        c.wait_streaming(shop, slot_name)
        with psycopg.connect(shop, autocommit=True) as conn:
            conn.execute("UPDATE customers SET id = 100 WHERE id = 1")  # a primary-key change
            conn.execute("UPDATE customers SET name = 'z' WHERE id = 2")  # an ordinary update
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, text = get(port, "/metrics")
            if metric(text, "cdc_events_total", table="public.customers", op="u") == 1:
                break
            time.sleep(0.3)
    finally:
        assert c.stop() == 0
    assert metric(text, "cdc_snapshot_rows_total", table="public.customers") == 7  # the initial snapshot's rows
    assert metric(text, "cdc_events_total", table="public.customers", op="d") == 1  # the key change: its delete
    assert metric(text, "cdc_events_total", table="public.customers", op="c") == 1  # and its create
    assert metric(text, "cdc_events_total", table="public.customers", op="u") == 1  # the ordinary update only


def test_during_start_up_checks_healthz_says_starting_and_readyz_is_not_ready(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix
):
    cfg = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": shop, "slot": slot_name, "publication": publication_name},
        tables=["public.customers"],
        kafka={"bootstrap_servers": "127.0.0.1:1"},  # the broker check waits 15 s, then fails the start
        topic_prefix=topic_prefix,
    )
    c = Connector(cfg, tmp_path / "cdc.log").start()
    port = http_port(c)
    assert get(port, "/healthz") == (200, "starting\n")
    assert get(port, "/readyz") == (503, "starting\n")
    assert c.wait_exit(60) == 1
    assert get_refused(port)  # a failed start ends the process, and the port with it


def test_status_names_a_missing_table_and_exits_1(tmp_path, services, shop, slot_name, publication_name, topic_prefix):
    cfg = make_config(
        tmp_path, services, shop, slot_name, publication_name, topic_prefix, ["public.customers", "public.gone"]
    )
    status = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "status", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 1, status.stdout
    assert "public.gone" in status.stdout and "MISSING: no such table" in status.stdout
    assert "None" not in status.stdout


def test_a_reload_that_needs_a_restart_names_the_keys(
    tmp_path, services, shop, slot_name, publication_name, topic_prefix
):
    cfg = make_config(tmp_path, services, shop, slot_name, publication_name, topic_prefix, ["public.customers"])
    c = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        c.wait_streaming(shop, slot_name)
        text = cfg.read_text().replace("status_interval_s: 1.0", "status_interval_s: 2.0")
        cfg.write_text(text + "limits:\n  max_inflight_bytes: 2000000\n")
        assert c.proc is not None
        c.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while not [e for e in c.log_events() if e.get("event") == "reload_needs_restart"]:
            assert time.monotonic() < deadline, c.output()
            time.sleep(0.2)
    finally:
        assert c.stop() == 0
    [warning] = [e for e in c.log_events() if e.get("event") == "reload_needs_restart"]
    assert warning["keys"] == ["limits.max_inflight_bytes", "status_interval_s"]
