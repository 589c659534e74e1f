"""The demo: local Postgres and Kafka, a small shop, the connector, some changes, what arrived in Kafka."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import structlog
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from cdc import dev
from cdc.config import load_config
from cdc.dev.prometheus import Prometheus
from cdc.outbox import publish

log = structlog.get_logger("cdc.demo")

DATABASE = "shop"
SLOT = "shop_cdc"
PREFIX = "shop"
TABLES = ["public.customers", "public.products", "public.orders", "public.order_lines"]
OUTBOX_TOPIC = f"{PREFIX}.outbox.order"  # outbox.topic below: <prefix>.outbox.<aggregate type>
DECLARATIONS = Path(__file__).resolve().parents[2] / "docs" / "examples" / "shop-spark.yaml"  # the view and index
SEARCH = "keyboard"  # what the demo searches in the declared index

SCHEMA = """
CREATE TABLE customers (
    id          serial PRIMARY KEY,
    name        text NOT NULL,
    email       text UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE products (
    id          serial PRIMARY KEY,
    sku         text NOT NULL UNIQUE,
    title       text NOT NULL,
    price       numeric(10,2) NOT NULL,
    tags        text[] NOT NULL DEFAULT '{}'
);
CREATE TABLE orders (
    id          bigserial PRIMARY KEY,
    customer_id int NOT NULL REFERENCES customers(id),
    status      text NOT NULL DEFAULT 'new',
    placed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE outbox (               -- application events (cdc.outbox.publish); Debezium's layout
    id            uuid PRIMARY KEY,
    aggregatetype text NOT NULL,
    aggregateid   text NOT NULL,
    type          text NOT NULL,
    payload       jsonb NOT NULL
);
CREATE TABLE order_lines (
    order_id    bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
    line_no     int NOT NULL,
    product_id  int NOT NULL REFERENCES products(id),
    quantity    int NOT NULL,
    unit_price  numeric(10,2) NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
"""

WORKLOAD = [
    "INSERT INTO customers (name, email) VALUES ('Ada Lovelace', 'ada@example.org'), "
    "('Grace Hopper', 'grace@example.org'), ('Alan Turing', 'alan@example.org')",
    "INSERT INTO products (sku, title, price, tags) VALUES "
    "('KB-01', 'Mechanical keyboard', 89.90, '{hardware,input}'), "
    "('MS-02', 'Wireless mouse', 24.50, '{hardware,input}'), "
    "('BK-03', 'The Art of Computer Programming', 199.00, '{books}')",
    "ORDERS",  # placed by _place_orders: each order and its OrderPlaced event in one transaction
    "UPDATE orders SET status = 'paid' WHERE id = 1",
    "UPDATE products SET price = 79.90 WHERE sku = 'KB-01'",
    "UPDATE customers SET email = 'alan.turing@example.org' WHERE id = 3",
    "DELETE FROM order_lines WHERE order_id = 2",
    "DELETE FROM orders WHERE id = 2",
]


ORDERS = [  # customer, lines (line_no, product_id, quantity, unit_price)
    (1, [(1, 1, 1, "89.90"), (2, 2, 2, "24.50")]),
    (2, [(1, 3, 1, "199.00")]),
]


def _place_orders(dsn: str) -> list[str]:
    """Each order, its lines and its OrderPlaced outbox event commit together (no dual write to Kafka)."""
    ids = []
    with psycopg.connect(dsn) as conn:
        for customer, lines in ORDERS:
            row = conn.execute("INSERT INTO orders (customer_id) VALUES (%s) RETURNING id", (customer,)).fetchone()
            assert row is not None
            order_id = int(row[0])
            for line_no, product, quantity, price in lines:
                conn.execute(
                    "INSERT INTO order_lines VALUES (%s, %s, %s, %s, %s)", (order_id, line_no, product, quantity, price)
                )
            total = sum(q * float(p) for _, _, q, p in lines)
            lines_json = [{"product_id": p, "quantity": q} for _, p, q, _ in lines]
            payload = {"order_id": order_id, "customer_id": customer, "total": f"{total:.2f}", "lines": lines_json}
            ids.append(publish(conn, "order", str(order_id), "OrderPlaced", payload))
            conn.commit()
    return ids


def _reset_database(admin_dsn: str) -> str:
    """Drop what a previous demo run left (its slot and database), then create the shop database."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for _ in range(50):
            row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
            if row is None:
                break
            if row[0] is not None:
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                time.sleep(0.2)
                continue
            conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    return psycopg.conninfo.make_conninfo(admin_dsn, dbname=DATABASE)


def _delete_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=15).topics if t.startswith(f"{PREFIX}.")]
    if topics:
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result()
        # A deletion is finished when the topics are gone from the metadata, not when it is accepted: a
        # progress topic still listed would be read back by the connector as the previous run's state.
        deadline = time.monotonic() + 60
        while left := sorted(set(topics) & set(admin.list_topics(timeout=15).topics)):
            if time.monotonic() > deadline:
                raise SystemExit(f"Kafka did not finish deleting the previous run's topics within 60 s: {left[:5]}")
            time.sleep(0.5)


def _read_topics(bootstrap: str, topics: list[str]) -> dict[str, list[Any]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cdc-demo", "enable.auto.commit": False})
    out: dict[str, list[Any]] = {t: [] for t in topics}
    try:
        meta = consumer.list_topics(timeout=15)
        todo: dict[tuple[str, int], int] = {}
        assignment = []
        for t in topics:
            for p in meta.topics[t].partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=15)
                if high > 0:
                    todo[(t, p)] = high
                    assignment.append(TopicPartition(t, p, 0))
        consumer.assign(assignment)
        deadline = time.monotonic() + 30
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            topic, partition, offset = str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
            out[topic].append(msg)
            if offset + 1 >= todo.get((topic, partition), 0):
                todo.pop((topic, partition), None)
    finally:
        consumer.close()
    return out


def _wait_for_slot(dsn: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the connector exited with {proc.returncode}; see its log above")
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise SystemExit("the connector did not start streaming within 60 s")


def _wait_confirmed(dsn: str, target: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (target, SLOT),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise SystemExit("the connector did not confirm the demo's changes within 60 s")


def main(*, keep_services: bool = False) -> int:
    started = time.monotonic()
    state = dev.default_state_dir()
    log.info("demo_services_starting", state_dir=str(state))
    endpoints = dev.up(state, registry=False)
    dsn = _reset_database(endpoints.postgres_dsn)
    _delete_topics(endpoints.kafka_bootstrap)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    config_path = state / "demo.yaml"
    metrics_port = _free_port()
    config_path.write_text(
        yaml.safe_dump(
            {
                "source": {"dsn": dsn, "slot": SLOT, "publication": SLOT},
                "tables": TABLES,
                "outbox": {"tables": ["public.outbox"], "topic": "{topic_prefix}.outbox.{aggregate_type}"},
                "kafka": {"bootstrap_servers": endpoints.kafka_bootstrap, "partitions": 3},
                "topic_prefix": PREFIX,
                "format": "json",
                "json": {"decimal_handling": "string"},  # readable prices in the printout
                "status_interval_s": 1.0,
                "http": {"host": "127.0.0.1", "port": metrics_port},
                "spark": {"file": str(DECLARATIONS)},  # the shop's view and search index, for the Spark step
            },
            sort_keys=False,
        )
    )
    log.info("demo_connector_starting", config=str(config_path))
    proc = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", "--config", str(config_path)], env={**os.environ})
    event_ids: list[str] = []
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    prometheus = Prometheus(state / "prometheus", [f"127.0.0.1:{metrics_port}"]) if Prometheus.available() else None
    try:
        if prometheus is not None:
            prometheus.start()
        _wait_for_slot(dsn, proc)
        _print_where_to_look(metrics, prometheus)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in WORKLOAD:
                if statement == "ORDERS":
                    event_ids = _place_orders(dsn)
                else:
                    conn.execute(statement)
            end = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert end is not None
        _wait_confirmed(dsn, str(end[0]))
        _print_metrics(metrics_port, prometheus)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        if prometheus is not None:
            prometheus.stop()
    topics = [f"{PREFIX}.{t}" for t in TABLES]
    arrived = _read_topics(endpoints.kafka_bootstrap, topics)

    print("\n=== what arrived in Kafka ===")
    for topic, msgs in arrived.items():
        ops = Counter(json.loads(m.value())["op"] if m.value() is not None else "tombstone" for m in msgs)
        print(f"\n{topic}: {len(msgs)} records ({', '.join(f'{k}={v}' for k, v in sorted(ops.items()))})")
        for m in msgs:
            key = m.key().decode()
            if m.value() is None:
                print(f"  p{m.partition()} {key:<32} tombstone")
                continue
            v = json.loads(m.value())
            row = v["after"] if v["after"] is not None else v["before"]
            print(f"  p{m.partition()} {key:<32} op={v['op']} lsn={v['source']['lsn']} {json.dumps(row)}")
    outbox_ok = _print_outbox(endpoints.kafka_bootstrap, event_ids)
    print(f"\nconnector exit code: {code} (0 = clean stop after SIGTERM)")
    verified = _spark_rebuild(endpoints.kafka_bootstrap, dsn, state)
    if not keep_services:
        dev.down(state)
    print(f"demo finished in {time.monotonic() - started:.1f}s")
    return 0 if code == 0 and verified and outbox_ok else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _print_where_to_look(metrics: str, prometheus: Prometheus | None) -> None:
    print("\n=== where to look while the connector runs ===")
    print(f"  metrics:    {metrics}   (health: /healthz, readiness: /readyz)")
    if prometheus is not None:
        print(
            f"  prometheus: {prometheus.url}   (alerts: {prometheus.url}/alerts, rules: "
            "deploy/observability/cdc-rules.yml)"
        )
    else:
        print(
            "  prometheus: not started (no binaries in the cache: `bash scripts/prometheus.sh`, which make install "
            "runs)"
        )
    print("  dashboard:  deploy/observability/grafana-dashboard.json (import it into Grafana)")
    sys.stdout.flush()


def _print_metrics(port: int, prometheus: Prometheus | None) -> None:
    """A few of the connector's own metrics at the end of the workload, and what Prometheus saw."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as e:
        log.warning("demo_metrics_unavailable", error=str(e))
        return
    wanted = (
        "cdc_events_total",
        "cdc_slot_lag_bytes",
        "cdc_slot_wal_status",
        "cdc_source_lag_seconds",
        "cdc_streaming",
    )
    print("\n=== the connector's metrics (a few) ===")
    for line in text.splitlines():
        if line.startswith(wanted) and not (line.startswith("cdc_slot_wal_status") and not line.endswith(" 1.0")):
            print(f"  {line}")
    if prometheus is not None:
        time.sleep(3)  # one more scrape and rule evaluation
        try:
            up = prometheus.query('up{job="cdc"}')
            alerts = prometheus.query("ALERTS")
        except OSError as e:
            log.warning("demo_prometheus_unavailable", error=str(e))
            return
        print(
            f"  prometheus: up={[r['value'][1] for r in up]}, alerts: "
            f"{[r['metric']['alertname'] for r in alerts] or 'none'}"
        )


def _print_outbox(bootstrap: str, event_ids: list[str]) -> bool:
    """The OrderPlaced events on the outbox topic: one per order, keyed by order id, carrying its event id."""
    msgs = _read_topics(bootstrap, [OUTBOX_TOPIC])[OUTBOX_TOPIC]
    print(f"\n{OUTBOX_TOPIC}: {len(msgs)} outbox events (table public.outbox itself stays unpublished)")
    for m in msgs:
        headers = {k: v.decode() for k, v in (m.headers() or [])}
        print(
            f"  p{m.partition()} key={m.key().decode():<4} {headers['eventType']} id={headers['id']} "
            f"{m.value().decode()}"
        )
    got = sorted(dict(m.headers() or [])["id"].decode() for m in msgs)
    ok = got == sorted(event_ids)
    print(
        "outbox events match the committed orders"
        if ok
        else f"OUTBOX MISMATCH: expected {sorted(event_ids)}, got {got}"
    )
    return ok


def _spark_rebuild(bootstrap: str, dsn: str, state: Path) -> bool:
    """Rebuild the warehouse and the shop's declared view and search index from offset 0; verify them
    against the database; search the index."""
    spark_dir = Path(__file__).resolve().parents[2] / "spark"  # the jobs live beside the package in the checkout
    sys.path.insert(0, str(spark_dir))
    from cdc_views.demo import rebuild_and_verify  # spark/ (on mypy_path; at run time on sys.path)
    from cdc_views.tables import Encoding

    section = load_config(state / "demo.yaml").spark  # the declarations file the demo's cdc.yaml names
    log.info("demo_spark_rebuild_starting", declarations=section.file)
    summary = rebuild_and_verify(
        bootstrap,
        dsn,
        PREFIX,
        TABLES,
        state / "demo-spark",
        section=section,
        query=SEARCH,
        encoding=Encoding(decimal_handling="string"),
    )
    print("\n" + summary)
    return "all views match the database" in summary  # the verification verdict line
