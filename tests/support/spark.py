"""What the Spark tests share: the session's SparkSession, a database of their own captured by a running
connector (module-wide: starting one per test would double their runtime), and the demo shop's schema,
workload and declared view and search index (docs/examples/shop-spark.yaml, what `make demo` builds).
Without pyspark the importing module is skipped.

A test module takes the SparkSession as the ``spark`` fixture (tests/integration/conftest.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from cdc import dev
from cdc.declared import load_declarations
from tests.support.connector import Connector, write_config

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark"))

from cdc_views import jobs
from cdc_views.reader import KafkaSource
from cdc_views.session import build_session
from cdc_views.tables import TableShape, read_shapes


def test_session() -> Any:
    """The SparkSession the Spark tests share (tests/integration/conftest.py's ``spark`` fixture): sized for
    a few hundred records, one shuffle partition and one Delta snapshot partition (fewer tasks per stage).

    The driver's heap (#39): at the default 1 GiB and the JVM's ~20 MB initial metaspace the driver made 4-8
    full collections, the first ones while Spark's and Delta's classes loaded, the old generation a quarter
    full (jstat). With 2 GiB and a metaspace threshold above what they load: test_spark_declared.py beside
    the old session in the same minutes (load ~35), 0 full collections against 5, 19.9 s of collection
    against 24.1 s, the same JVM CPU (44 s). The status listeners keep a hundred jobs and fifty queries
    (no UI reads them) instead of a thousand each."""
    return build_session(
        "cdc-tests",
        master="local[2]",
        shuffle_partitions=1,
        ui=False,
        quick_start=True,
        conf={
            "spark.databricks.delta.snapshotPartitions": "1",
            "spark.driver.memory": "2g",
            "spark.driver.defaultJavaOptions": "-XX:MetaspaceSize=512m",
            "spark.ui.retainedJobs": "100",
            "spark.ui.retainedStages": "100",
            "spark.sql.ui.retainedExecutions": "50",
        },
    )


@dataclass
class CapturedDatabase:
    """A database of its own; its name is also the slot's, the publication's and the topic prefix."""

    dsn: str
    name: str
    bootstrap: str
    tables: tuple[str, ...]
    registry_url: str | None = None
    config: Path | None = None

    @property
    def slot(self) -> str:
        return self.name

    @property
    def topic_prefix(self) -> str:
        return self.name

    def run(self, statements: Sequence[str]) -> None:
        """Execute the statements, then wait until the connector has confirmed all of them."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
            end = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert end is not None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (end[0], self.slot),
                ).fetchone()
                if row and row[0]:
                    return
                time.sleep(0.2)
        raise AssertionError("the connector did not confirm the changes within 60 s")

    def shapes(self) -> dict[str, TableShape]:
        return read_shapes(self.dsn, list(self.tables))

    def job(self, warehouse: Path, **overrides: Any) -> jobs.JobConfig:
        """A job over the captured tables' topics, into ``warehouse``."""
        return jobs.JobConfig(KafkaSource(self.bootstrap), self.topic_prefix, self.shapes(), warehouse, **overrides)


@contextmanager
def captured_database(
    services: dev.Endpoints, work: Path, name: str, setup: Sequence[str], tables: Sequence[str], **config: Any
) -> Iterator[CapturedDatabase]:
    """Database ``name`` made with the ``setup`` statements, and a connector capturing ``tables`` into topics
    ``<name>.*`` (``config``: further sections of its cdc.yaml), streaming when this yields. Afterwards the
    connector stops and the database, the slot and the topics are dropped."""
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(services.postgres_dsn, dbname=name)
    connector: Connector | None = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in setup:
                conn.execute(statement)
        kafka = {"bootstrap_servers": services.kafka_bootstrap, **config.pop("kafka", {})}
        path = write_config(
            work / "cdc.yaml",
            source={"dsn": dsn, "slot": name, "publication": name},
            tables=list(tables),
            kafka=kafka,
            topic_prefix=name,
            status_interval_s=1.0,
            **config,
        )
        registry = config.get("schema_registry", {}).get("url")
        connector = Connector(path, work / "cdc.log").start()
        connector.wait_streaming(dsn, name, timeout=240)  # its snapshot workers took 40 s to start at load 35
        yield CapturedDatabase(dsn, name, services.kafka_bootstrap, tuple(tables), registry, path)
    finally:
        if connector is not None:
            connector.stop()
        with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (name,)
            )
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        delete_topics(services.kafka_bootstrap, name)


def delete_topics(bootstrap: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix + ".")]
    for future in admin.delete_topics(names, operation_timeout=30).values() if names else []:
        future.result(timeout=60)


# --------------------------------------------------------------------------- the demo shop

SHOP_TABLES = ["public.customers", "public.products", "public.orders", "public.order_lines"]
SHOP_DECLARED = load_declarations(Path(__file__).resolve().parents[2] / "docs" / "examples" / "shop-spark.yaml")

SHOP_SCHEMA = """
CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, email text UNIQUE,
                        created_at timestamptz NOT NULL DEFAULT now(), born date, balance numeric(12,2));
CREATE TABLE products (id serial PRIMARY KEY, sku text NOT NULL UNIQUE, title text NOT NULL,
                       price numeric(10,2) NOT NULL, tags text[] NOT NULL DEFAULT '{}', weight float8,
                       ratio real, meta jsonb);
CREATE TABLE orders (id bigserial PRIMARY KEY, customer_id int NOT NULL REFERENCES customers(id),
                     status text NOT NULL DEFAULT 'new', placed_at timestamptz NOT NULL DEFAULT now(),
                     due timestamp(3), notes bytea);
CREATE TABLE order_lines (order_id bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE, line_no int NOT NULL,
                          product_id int NOT NULL REFERENCES products(id), quantity int NOT NULL,
                          unit_price numeric(10,2) NOT NULL, PRIMARY KEY (order_id, line_no));
"""

SHOP_WORKLOAD = [
    "INSERT INTO customers (name, email, born, balance) SELECT 'customer ' || i, 'c' || i || '@example.org', "
    "DATE '1980-01-01' + i, (i * 12.34) - 100 FROM generate_series(1, 50) i",
    "INSERT INTO products (sku, title, price, tags, weight, ratio, meta) SELECT 'SKU-' || i, 'Product ' || i, "
    "i * 1.5 + 0.99, ARRAY['tag' || (i % 3), 'all'], i / 3.0, 1.1 * i, jsonb_build_object('i', i, 'odd', i % 2 = 1) "
    "FROM generate_series(1, 20) i",
    "UPDATE products SET title = 'Mechanical keyboard', tags = '{hardware,input}' WHERE id = 1",
    "INSERT INTO orders (customer_id, due, notes) SELECT 1 + i % 40, TIMESTAMP '2025-01-01 10:00:00.123' + i * "
    "interval '1 hour', '\\x00ff'::bytea FROM generate_series(1, 60) i",
    "INSERT INTO order_lines SELECT o.id, l, 1 + (o.id + l) % 20, l, 9.99 FROM orders o, generate_series(1, 3) l",
    "UPDATE orders SET status = 'paid' WHERE id % 3 = 0",
    "UPDATE customers SET email = NULL, balance = -0.01 WHERE id = 7",
    "DELETE FROM order_lines WHERE order_id % 5 = 0",
    "DELETE FROM orders WHERE id % 10 = 0",
    "DELETE FROM customers WHERE id > 45",  # customers 41-50 have no orders
    "UPDATE customers SET id = 1000 WHERE id = 41",  # a key change: delete of the old key and create of the new
    "TRUNCATE order_lines",
    "INSERT INTO order_lines SELECT o.id, 1, 1 + o.id % 20, 2, 19.99 FROM orders o WHERE o.id % 2 = 1",
    "ALTER TABLE customers ADD COLUMN tier text",
    "UPDATE customers SET tier = 'gold' WHERE id <= 5",
    "INSERT INTO customers (name, email, tier) VALUES ('Ada Lovelace', 'ada@example.org', 'platinum')",
]


@contextmanager
def shop_captured(services: dev.Endpoints, work: Path, name: str, **config: Any) -> Iterator[CapturedDatabase]:
    """The shop with its workload applied, captured by a connector (``config``: e.g. the Avro format)."""
    with captured_database(services, work, name, [SHOP_SCHEMA], SHOP_TABLES, kafka={"partitions": 3}, **config) as shop:
        shop.run(SHOP_WORKLOAD)
        yield shop


def delta_versions(warehouse: Path) -> dict[str, int]:
    """The latest commit of each Delta table and view (the number of its commit files)."""
    paths = sorted((warehouse / "tables").iterdir()) + sorted((warehouse / "views").iterdir())
    return {p.name: len(list((p / "_delta_log").glob("*.json"))) for p in paths}


def assert_shop_matches(report: Any) -> None:
    """Every shop table, the declared view and the declared index were compared, and all match."""
    assert report.ok, report.render()
    assert [c.name for c in report.checks] == [f"table {t}" for t in SHOP_TABLES] + [
        "view orders_enriched",
        "index shop_search",
    ]
