"""The rules and the dashboard against a real Prometheus scraping a real daemon (#40).

One module, one test, everything of its own but the Python: a PostgreSQL 18 primary that keeps at most 32 MB
of WAL for a slot, its physical standby synchronizing the slot (so the failover metrics have data: PostgreSQL
17+ failover slots), a Kafka broker (it is stopped), the
daemon under a small workload, and Prometheus from Debian's package (scripts/prometheus.sh) scraping it
and evaluating the project's rules every second. Then:

1. every expression of the dashboard's panels and of the rules returns data through the HTTP API (an
   alert's condition is asked with ``bool`` comparisons, so a healthy daemon's answer is data, not
   nothing): no panel is blank and no alert silent for ever by a misspelt metric or label;
2. no alert fires on the healthy daemon;
3. the broker is stopped: the delivery alert goes pending;
4. WAL piles up behind the slot the daemon cannot confirm (no broker) past max_slot_wal_keep_size: the
   invalidation alert fires.

No Grafana server installs from the registries the project uses, so the dashboard is proven through its
queries here, not rendered.
"""

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
import yaml

from cdc.dev import kafka as dev_kafka
from cdc.dev import postgres as dev_postgres
from tests.support.connector import Connector, write_config
from tests.support.http import http_port
from tests.support.pg18 import pg_version
from tests.support.prometheus import OBSERVABILITY, running

pytestmark = pytest.mark.integration
log = structlog.get_logger("tests.observability")

PHYSICAL_SLOT = "standby_phys"
COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
# A panel query that has data only in a state this test does not make, and why.
NO_DATA_HERE = {
    "cdc_snapshot_eta_seconds": "no estimate once the initial snapshot is done (its panel shows the rate beside it)",
}


def with_bool(expr: str) -> str:
    """``expr`` with each comparison outside braces and strings turned into a ``bool`` one."""
    out: list[str] = []
    depth = 0
    quote = ""
    i = 0
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == quote and expr[i - 1] != "\\":
                quote = ""
            i += 1
            continue
        if c in "\"'":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            op = next((o for o in COMPARISONS if expr.startswith(o, i)), None)
            if op is not None and expr[i + len(op) : i + len(op) + 1] != "~":
                out.append(f"{op} bool")
                i += len(op)
                continue
        out.append(c)
        i += 1
    return "".join(out)


def panel_queries() -> list[tuple[str, str]]:
    d = json.loads((OBSERVABILITY / "grafana-dashboard.json").read_text())
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"].replace("$instance", ".*").replace("$table", ".*").replace("$__rate_interval", "30s")
            out.append((p["title"], expr))
    return out


def rule_queries() -> list[tuple[str, str]]:
    out = []
    for group in yaml.safe_load((OBSERVABILITY / "cdc-rules.yml").read_text())["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                out.append((rule["record"], rule["expr"]))
            else:
                out.append((rule["alert"], with_bool(rule["expr"])))
    return out


def test_with_bool_leaves_matchers_and_strings_alone() -> None:
    assert with_bool('a{s=~"x|y"} == 1') == 'a{s=~"x|y"} == bool 1'
    assert with_bool("a > 0.4 * b and c <= 2") == "a > bool 0.4 * b and c <= bool 2"
    assert with_bool('up{job!="x"} != 0') == 'up{job!="x"} != bool 0'


@pytest.fixture
def primary_and_standby(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A PostgreSQL 18 primary and a standby that synchronizes its failover slots (docs/operations.md, "Beside
    a primary with standbys"); the primary keeps at most 32 MB of WAL for a slot."""
    primary, standby = tmp_path / "primary", tmp_path / "standby"
    settings = {
        "max_slot_wal_keep_size": "'32MB'",
        "max_wal_size": "'64MB'",
        "wal_sender_timeout": "'10s'",
        "synchronized_standby_slots": f"'{PHYSICAL_SLOT}'",
    }
    with pg_version("18"):
        try:
            primary_dsn = dev_postgres.up(primary, log, settings)
            with psycopg.connect(primary_dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_create_physical_replication_slot(%s)", (PHYSICAL_SLOT,))
            standby_dsn = dev_postgres.standby_of(
                primary,
                standby,
                log,
                physical_slot=PHYSICAL_SLOT,
                settings={"hot_standby_feedback": "on", "sync_replication_slots": "on"},
            )
            yield primary_dsn, standby_dsn
        finally:
            for state in (standby, primary):
                try:
                    dev_postgres.down(state, log)
                except Exception as exc:
                    log.warning("tests.observability.down_failed", state=str(state), error=str(exc))


@pytest.fixture
def own_broker(tmp_path_factory: pytest.TempPathFactory, services_mode: str) -> Iterator[tuple[Path, str]]:
    if services_mode != "local":
        pytest.skip("stops a local broker process; testcontainers brokers are not stopped here")
    state = tmp_path_factory.mktemp("own-kafka")
    bootstrap = dev_kafka.up(state, log)
    try:
        yield state, bootstrap
    finally:
        dev_kafka.down(state, log)


def _multi_host(primary_dsn: str, standby_dsn: str) -> str:
    p = psycopg.conninfo.conninfo_to_dict(primary_dsn)
    s = psycopg.conninfo.conninfo_to_dict(standby_dsn)
    return (
        f"host={p['host']},{s['host']} port={p['port']},{s['port']} user={p['user']} "
        f"dbname={p.get('dbname', 'postgres')} "
        "target_session_attrs=primary connect_timeout=3"
    )


def _wait_for_alert(prom: Any, name: str, states: tuple[str, ...], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while time.monotonic() < deadline:
        seen = prom.alerts()
        for a in seen:
            if a["labels"]["alertname"] == name and a["state"] in states:
                return dict(a)
        time.sleep(0.5)
    probes = {
        q: [(r["metric"], r["value"][1]) for r in prom.query(q)]
        for q in (
            "cdc_inflight_records",
            "cdc_kafka_broker_up",
            "changes(cdc_confirmed_lsn[5m])",
            "cdc_streaming",
            "cdc_slot_wal_status == 1",
            "cdc_slot_safe_wal_size_bytes",
            "cdc_queue_bytes",
            "up",
        )
    }
    raise AssertionError(f"{name} not {states} within {timeout}s; alerts: {[a['labels'] for a in seen]}; {probes}")


@pytest.mark.timeout(400)
def test_every_panel_and_rule_has_data_and_the_delivery_and_invalidation_alerts_go_off(
    tmp_path: Path,
    primary_and_standby: tuple[str, str],
    own_broker: tuple[Path, str],
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
) -> None:
    primary_dsn, standby_dsn = primary_and_standby
    broker_state, bootstrap = own_broker
    with psycopg.connect(primary_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, body text NOT NULL)")
        conn.execute("CREATE TABLE filler (id bigserial PRIMARY KEY, pad text)")  # not captured: WAL only
        conn.execute("INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, 3000) g")
        conn.execute("ANALYZE items")  # pg_class.reltuples: the snapshot's estimate
    config = write_config(
        tmp_path / "cdc.yaml",
        source={
            "dsn": _multi_host(primary_dsn, standby_dsn),
            "slot": slot_name,
            "publication": publication_name,
            "failover_check_s": 1,
        },
        tables=["public.items"],
        kafka={"bootstrap_servers": bootstrap, "producer": {"statistics.interval.ms": 1000}},
        topic_prefix=topic_prefix,
        snapshot={"chunk_rows": 500},
        limits={"max_inflight_bytes": 1024 * 1024},
        status_interval_s=1.0,
        shutdown_timeout_s=2,
    )
    daemon = Connector(config, tmp_path / "cdc.log").start()
    stop = threading.Event()
    writer: threading.Thread | None = None
    try:
        port = http_port(daemon)
        with running(tmp_path / "prometheus", [f"127.0.0.1:{port}"]) as prom:
            daemon.wait_streaming(primary_dsn, slot_name)
            body_size = [50]

            def workload() -> None:
                n = 10_000
                with psycopg.connect(primary_dsn, autocommit=True) as conn:
                    while not stop.is_set():
                        with conn.transaction():
                            for _ in range(20):
                                n += 1
                                conn.execute("INSERT INTO items VALUES (%s, repeat('x', %s))", (n, body_size[0]))
                            conn.execute("UPDATE items SET body = body || 'u' WHERE id = %s", (n - 5,))
                            conn.execute("DELETE FROM items WHERE id = %s", (n - 10,))
                        time.sleep(0.05)

            writer = threading.Thread(target=workload, name="workload", daemon=True)
            writer.start()

            # 1. Every panel and rule expression has data.
            queries = [("panel", t, e) for t, e in panel_queries()] + [("rule", t, e) for t, e in rule_queries()]
            deadline = time.monotonic() + 90
            while True:
                missing = [
                    (kind, title, expr)
                    for kind, title, expr in queries
                    if not prom.query(expr) and not any(name in expr for name in NO_DATA_HERE)
                ]
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(2)
            assert not missing, f"expressions without data: {missing}"
            for name in NO_DATA_HERE:
                assert any(name in e for _, _, e in queries)

            # 2. A healthy daemon: nothing fires.
            firing = [a["labels"]["alertname"] for a in prom.alerts() if a["state"] == "firing"]
            assert firing == [], firing

            # 3. The broker stops while rows keep coming: the delivery alert goes pending.
            body_size[0] = 5000  # the 1 MB in-flight budget fills: the daemon stops reading WAL
            dev_kafka.down(broker_state, log)
            stalled = _wait_for_alert(prom, "CdcDeliveryStalled", ("pending", "firing"), 60)
            log.info("tests.observability.delivery_alert", alert=stalled)
            assert prom.query("cdc_kafka_broker_up == 0")

            # 4. WAL piles up behind the slot past max_slot_wal_keep_size: the invalidation alert fires.
            stop.set()
            writer.join(30)
            near: list[str] = []
            with psycopg.connect(primary_dsn, autocommit=True) as conn:
                for _ in range(8):  # ~120 MB of WAL
                    conn.execute("INSERT INTO filler (pad) SELECT repeat('x', 1000) FROM generate_series(1, 15000)")
                    conn.execute("SELECT pg_switch_wal()")
                    near += [a["state"] for a in prom.alerts() if a["labels"]["alertname"] == "CdcSlotNearInvalidation"]
                conn.execute("CHECKPOINT")
            invalidated = _wait_for_alert(prom, "CdcSlotInvalidated", ("firing",), 60)
            assert invalidated["labels"]["status"] in ("unreserved", "lost")
            assert "cdc status" in invalidated["annotations"]["description"]
            log.info("tests.observability.invalidation_alert", alert=invalidated, near_invalidation_states=near)
            # The first command the alert names says the same.
            status = subprocess.run(
                [sys.executable, "-m", "cdc.cli", "status", "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert (
                f"wal_status: {invalidated['labels']['status']}" in status.stdout or "wal_status: lost" in status.stdout
            ), status.stdout + status.stderr
            assert "safe_wal_size:" in status.stdout, status.stdout
    finally:
        stop.set()
        if writer is not None:
            writer.join(30)
        try:
            daemon.stop(timeout=30)
        except AssertionError as e:
            log.warning("tests.observability.daemon_stop", error=str(e)[:500])
