"""The Spark jobs end to end: the real connector fills the topics, the jobs rebuild the views, and
verification compares every view with the database.

One shop database and one running connector serve the whole module (starting them per test would
double the runtime); each test has its own warehouse directory. The SparkSession is one per session:
local[2], 1 shuffle partition, no UI. Needs the spark extra (pyspark, delta-spark, tantivy) and the
job jars (scripts/fetch-spark-jars.sh); without pyspark the module is skipped.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from cdc import dev
from tests.support.connector import Connector, write_config

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark"))

from cdc_views import jobs  # noqa: E402
from cdc_views.reader import KafkaSource, TopicNotFound, UndecodableRecords  # noqa: E402
from cdc_views.search import search  # noqa: E402
from cdc_views.session import build_session  # noqa: E402
from cdc_views.tables import Encoding, TableShape, read_shapes  # noqa: E402
from cdc_views.verify import verify  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    # py4j and pyspark leave sockets to the JVM open and use deprecated APIs; that is not the jobs' failure
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

TABLES = ["public.customers", "public.products", "public.orders", "public.order_lines"]

SCHEMA = """
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

WORKLOAD = [
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

MORE_CHANGES = [
    "INSERT INTO orders (customer_id, status) VALUES (1000, 'new')",
    "INSERT INTO order_lines SELECT max(id), 1, 1, 3, 79.90 FROM orders",
    "UPDATE products SET price = price + 1, title = title || ' (new)' WHERE id IN (2, 3)",
    "UPDATE customers SET name = 'Grace Hopper' WHERE id = 2",
    "DELETE FROM order_lines WHERE order_id = 3",
    "DELETE FROM orders WHERE id = 3",
    "ALTER TABLE products ADD COLUMN discontinued boolean",
    "UPDATE products SET discontinued = true WHERE id = 4",
]


@dataclass
class Shop:
    dsn: str
    topic_prefix: str
    bootstrap: str
    slot: str

    def run(self, statements: list[str]) -> None:
        """Execute the statements, then wait until the connector has confirmed all of them."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)  # type: ignore[arg-type]
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
        return read_shapes(self.dsn, TABLES)

    def job(self, warehouse: Path, **overrides: Any) -> jobs.JobConfig:
        return jobs.JobConfig(KafkaSource(self.bootstrap), self.topic_prefix, self.shapes(), warehouse, **overrides)


@pytest.fixture(scope="session")
def spark() -> Any:
    # Sized for the tests' few hundred records: one shuffle partition and one Delta snapshot partition
    # (fewer tasks per stage; ~10% off the two slowest tests, 2026-11-22).
    session = build_session(
        "cdc-tests",
        master="local[2]",
        shuffle_partitions=1,
        ui=False,
        quick_start=True,
        conf={"spark.databricks.delta.snapshotPartitions": "1"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def shop(services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    """A shop database with the workload applied, captured by a running connector (module-wide)."""
    name = f"spark_{secrets.token_hex(3)}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(services.postgres_dsn, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)  # type: ignore[arg-type]
    work = tmp_path_factory.mktemp("spark-shop")
    config = write_config(
        work / "cdc.yaml",
        source={"dsn": dsn, "slot": name, "publication": name},
        tables=TABLES,
        kafka={"bootstrap_servers": services.kafka_bootstrap, "partitions": 3},
        topic_prefix=name,
        status_interval_s=1.0,
    )
    connector = Connector(config, work / "cdc.log").start()
    try:
        connector.wait_streaming(dsn, name)
        shop = Shop(dsn, name, services.kafka_bootstrap, name)
        shop.run(WORKLOAD)
        yield shop
    finally:
        connector.stop()
        with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (name,))
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        _delete_topics(services.kafka_bootstrap, name)


def _delete_topics(bootstrap: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix + ".")]
    for future in admin.delete_topics(names, operation_timeout=30).values() if names else []:
        future.result(timeout=60)


def _delta_versions(warehouse: Path) -> dict[str, int]:
    """The latest commit of each Delta table and view (the number of its commit files)."""
    paths = sorted((warehouse / "tables").iterdir()) + sorted((warehouse / "views").iterdir())
    return {p.name: len(list((p / "_delta_log").glob("*.json"))) for p in paths}


def _assert_matches(report: Any) -> None:
    assert report.ok, report.render()
    assert len(report.checks) == len(TABLES) + 2  # the tables, the joined view, the search index


def test_batch_rebuild_matches_the_database_and_a_second_run_changes_nothing(spark: Any, shop: Shop, tmp_path: Path) -> None:
    cfg = shop.job(tmp_path / "warehouse")

    summary = jobs.rebuild(spark, cfg)
    report = verify(shop.dsn, cfg.warehouse, cfg.tables, spark=spark)

    _assert_matches(report)
    assert summary["search documents"] > 0
    hits = search(jobs.search_path(cfg.warehouse), "keyboard")
    assert hits and hits[0]["doc_id"] == "product:1"
    assert any(h["kind"] == "order" for h in search(jobs.search_path(cfg.warehouse), '"Product 2"'))

    before = _delta_versions(cfg.warehouse)
    again = jobs.rebuild(spark, cfg)
    assert _delta_versions(cfg.warehouse) == before
    assert all(v == 0 for k, v in again.items() if k.startswith(("table ", "view ")))


def test_continuous_job_catches_up_and_a_restart_continues_from_its_checkpoint(
    spark: Any, shop: Shop, tmp_path: Path
) -> None:
    cfg = shop.job(tmp_path / "warehouse")
    jobs.start_continuous(spark, cfg, available_now=True).awaitTermination(300)
    orders = spark.read.format("delta").load(str(cfg.warehouse / "tables" / "public.orders"))
    with psycopg.connect(shop.dsn) as conn:
        assert orders.count() == conn.execute("SELECT count(*) FROM orders").fetchone()[0]  # type: ignore[index]

    shop.run(MORE_CHANGES)
    cfg = shop.job(tmp_path / "warehouse")  # the new column is in the catalog now
    query = jobs.start_continuous(spark, cfg, available_now=True)
    query.awaitTermination(300)

    assert query.exception() is None
    assert 0 < sum(p["numInputRows"] for p in query.recentProgress) < 40  # only the new records were read
    _assert_matches(verify(shop.dsn, cfg.warehouse, cfg.tables, spark=spark))
    assert search(jobs.search_path(cfg.warehouse), "Grace")


def test_a_topic_that_does_not_exist_is_a_clear_error(spark: Any, shop: Shop, tmp_path: Path) -> None:
    cfg = jobs.JobConfig(KafkaSource(shop.bootstrap), "no_such_prefix", shop.shapes(), tmp_path / "warehouse")

    with pytest.raises(TopicNotFound, match=r"no_such_prefix\.public\.customers.*do not exist"):
        jobs.rebuild(spark, cfg, ["warehouse"])


def test_records_that_do_not_decode_fail_the_job_unless_told_to_skip(
    spark: Any, services: dev.Endpoints, shop: Shop, tmp_path: Path
) -> None:
    prefix = f"bad_{secrets.token_hex(3)}"
    topic = f"{prefix}.public.customers"
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    good = b'{"before":null,"after":{"id":%d,"name":"n%d","email":null,"created_at":"2024-05-01T12:00:00.000001Z",' \
           b'"born":19000,"balance":"AQI=","tier":null},"source":{"lsn":%d},"op":"c"}'  # fmt: skip
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    try:
        producer.produce(topic, key=b'{"id":1}', value=good % (1, 1, 100))
        producer.produce(topic, key=b'{"id":2}', value=b"{not json")  # offset 1
        producer.produce(topic, key=b'{"id":3}', value=good.replace(b'"AQI="', b'{"x":1}') % (3, 3, 300))  # offset 2
        producer.produce(topic, key=b'{"id":4}', value=good % (4, 4, 400))
        producer.flush(30)
        shapes = {"public.customers": shop.shapes()["public.customers"]}
        cfg = jobs.JobConfig(KafkaSource(services.kafka_bootstrap), prefix, shapes, tmp_path / "warehouse")

        with pytest.raises(UndecodableRecords) as failure:
            jobs.rebuild(spark, cfg, ["warehouse"])
        assert failure.value.count == 2
        assert [(b.partition, b.offset) for b in failure.value.examples] == [(0, 1), (0, 2)]
        assert "not a Debezium envelope" in str(failure.value) and "'balance'" in str(failure.value)

        skipping = jobs.JobConfig(cfg.source, prefix, shapes, cfg.warehouse, Encoding(), "skip")
        summary = jobs.rebuild(spark, skipping, ["warehouse"])
        assert summary["bad_records_skipped"] == {"public.customers": 2}
        rows = spark.read.format("delta").load(str(cfg.warehouse / "tables" / "public.customers"))
        assert sorted(r["id"] for r in rows.collect()) == [1, 4]
        assert {str(r["balance"]) for r in rows.collect()} == {"2.58"}  # base64 AQI= is 258, scale 2
    finally:
        admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)
