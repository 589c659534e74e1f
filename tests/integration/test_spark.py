"""The Spark jobs end to end: the real connector fills the topics, the jobs rebuild the views, and
verification compares every view with the database.

One shop database and one running connector serve the whole module (starting them per test would
double the runtime); each test has its own warehouse directory. The SparkSession is one per session:
local[2], 1 shuffle partition, no UI. Needs the spark extra (pyspark, delta-spark, tantivy) and the
job jars (scripts/fetch-spark-jars.sh); without pyspark the module is skipped.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc import dev
from cdc.schema_history import ColumnType, SchemaVersion
from cdc.schema_history import topic_for as schema_history_topic
from cdc_views import declared, jobs
from cdc_views.reader import KafkaSource, TopicNotFound, UndecodableRecords
from cdc_views.tables import Encoding
from cdc_views.verify import verify
from tests.support.db import scalar
from tests.support.spark import (
    SHOP_DECLARED,
    CapturedDatabase,
    assert_shop_matches,
    delta_versions,
    shop_captured,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    # py4j and pyspark leave sockets to the JVM open and use deprecated APIs; that is not the jobs' failure
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
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


@pytest.fixture(scope="module")
def shop(services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CapturedDatabase]:
    """A shop database with the workload applied, captured by a running connector (module-wide)."""
    with shop_captured(services, tmp_path_factory.mktemp("spark-shop"), f"spark_{secrets.token_hex(3)}") as shop:
        yield shop


def search(warehouse: Path, query: str) -> list[dict[str, Any]]:
    return declared.search(declared.index_path(warehouse, "shop_search"), query)


def test_batch_rebuild_matches_the_database_and_a_second_run_changes_nothing(
    spark: Any, shop: CapturedDatabase, tmp_path: Path
) -> None:
    cfg = shop.job(tmp_path / "warehouse", declared=SHOP_DECLARED)

    summary = jobs.rebuild(spark, cfg)
    report = verify(shop.dsn, cfg.warehouse, cfg.tables, spark=spark, declared_section=SHOP_DECLARED)

    assert_shop_matches(report)
    with psycopg.connect(shop.dsn) as conn:
        documents = conn.execute("SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM products)").fetchone()
    assert documents is not None and summary["index shop_search"] == documents[0]  # one per order and product
    hits = search(cfg.warehouse, "keyboard")
    assert hits and hits[0]["id"] == "product:1"
    assert any(h["kind"] == "order" for h in search(cfg.warehouse, '"Product 2"'))

    before = delta_versions(cfg.warehouse)
    again = jobs.rebuild(spark, cfg)
    assert delta_versions(cfg.warehouse) == before
    assert all(v == 0 for k, v in again.items() if k.startswith(("table ", "view ")))


def test_continuous_job_catches_up_and_a_restart_continues_from_its_checkpoint(
    spark: Any, shop: CapturedDatabase, tmp_path: Path
) -> None:
    cfg = shop.job(tmp_path / "warehouse", declared=SHOP_DECLARED)
    jobs.start_continuous(spark, cfg, available_now=True).awaitTermination(300)
    orders = spark.read.format("delta").load(str(cfg.warehouse / "tables" / "public.orders"))
    with psycopg.connect(shop.dsn) as conn:
        assert orders.count() == scalar(conn.execute("SELECT count(*) FROM orders"))

    shop.run(MORE_CHANGES)
    cfg = shop.job(tmp_path / "warehouse", declared=SHOP_DECLARED)  # the new column is in the catalog now
    query = jobs.start_continuous(spark, cfg, available_now=True)
    query.awaitTermination(300)

    assert query.exception() is None
    assert 0 < sum(p["numInputRows"] for p in query.recentProgress) < 40  # only the new records were read
    assert_shop_matches(verify(shop.dsn, cfg.warehouse, cfg.tables, spark=spark, declared_section=SHOP_DECLARED))
    assert {h["id"] for h in search(cfg.warehouse, "Grace")} >= {"order:1", "order:41"}  # customer 2's, renamed


def test_a_topic_that_does_not_exist_is_a_clear_error(spark: Any, shop: CapturedDatabase, tmp_path: Path) -> None:
    cfg = jobs.JobConfig(KafkaSource(shop.bootstrap), "no_such_prefix", shop.shapes(), tmp_path / "warehouse")

    with pytest.raises(TopicNotFound, match=r"no_such_prefix\.public\.customers.*do not exist"):
        jobs.rebuild(spark, cfg, ["warehouse"])


def test_the_continuous_job_started_on_empty_topics_runs_their_empty_batch_and_writes_nothing(
    spark: Any, services: dev.Endpoints, shop: CapturedDatabase, tmp_path: Path
) -> None:
    prefix = f"empty_{secrets.token_hex(3)}"
    shapes = {"public.customers": shop.shapes()["public.customers"]}
    topic, history = f"{prefix}.public.customers", schema_history_topic(prefix)
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    for created in admin.create_topics([NewTopic(topic, 3, 1), NewTopic(history, 1, 1)]).values():
        created.result(timeout=30)
    try:
        cfg = jobs.JobConfig(KafkaSource(services.kafka_bootstrap), prefix, shapes, tmp_path / "warehouse")
        query = jobs.start_continuous(spark, cfg, available_now=True)
        query.awaitTermination(300)

        assert query.exception() is None
        assert [p["numInputRows"] for p in query.recentProgress] == [0]  # Spark ran the first, empty, batch
        assert not (cfg.warehouse / "tables" / "public.customers").exists()
    finally:
        for deleted in admin.delete_topics([topic, history], operation_timeout=30).values():
            deleted.result(timeout=60)


def test_records_that_do_not_decode_fail_the_job_unless_told_to_skip(
    spark: Any, services: dev.Endpoints, shop: CapturedDatabase, tmp_path: Path
) -> None:
    prefix = f"bad_{secrets.token_hex(3)}"
    topic, history = f"{prefix}.public.customers", schema_history_topic(prefix)
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    for created in admin.create_topics([NewTopic(topic, 1, 1), NewTopic(history, 1, 1)]).values():
        created.result(timeout=30)
    # balance is numeric(12,2) from position 150:0 on; the record at LSN 100 has no version in force
    balance = ColumnType("balance", "numeric", "pg_catalog", 1700, ((12 << 16) | 2) + 4, 12, 2)
    version = SchemaVersion("public.customers", (150, 0), (balance,))
    good = (
        b'{"before":null,"after":{"id":%d,"name":"n%d","email":null,"created_at":"2024-05-01T12:00:00.000001Z",'
        b'"born":19000,"balance":"AQI=","tier":null},"source":{"lsn":%d},"op":"c"}'
    )
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    try:
        producer.produce(history, key=version.key(), value=version.value())
        producer.produce(topic, key=b'{"id":1}', value=good % (1, 1, 100))  # offset 0: before the first version
        producer.produce(topic, key=b'{"id":2}', value=b"{not json")  # offset 1
        producer.produce(topic, key=b'{"id":3}', value=good.replace(b'"AQI="', b'{"x":1}') % (3, 3, 300))  # offset 2
        producer.produce(topic, key=b'{"id":4}', value=good % (4, 4, 400))
        producer.flush(30)
        shapes = {"public.customers": shop.shapes()["public.customers"]}
        cfg = jobs.JobConfig(KafkaSource(services.kafka_bootstrap), prefix, shapes, tmp_path / "warehouse")

        with pytest.raises(UndecodableRecords) as failure:
            jobs.rebuild(spark, cfg, ["warehouse"])
        assert failure.value.count == 3
        assert [(b.partition, b.offset) for b in failure.value.examples] == [(0, 0), (0, 1), (0, 2)]
        assert "not a Debezium envelope" in str(failure.value) and "'balance'" in str(failure.value)
        unknown = failure.value.examples[0].reason
        assert unknown.startswith(
            f"column 'balance': no version of public.customers in the schema history topic {history} "
        )
        assert (
            "(commit LSN 100, LSN 100)" in unknown
            and "Fix: run a connector that publishes the schema history" in unknown
        )

        skipping = jobs.JobConfig(cfg.source, prefix, shapes, cfg.warehouse, Encoding(), "skip")
        summary = jobs.rebuild(spark, skipping, ["warehouse"])
        assert summary["bad_records_skipped"] == {"public.customers": 3}
        rows = spark.read.format("delta").load(str(cfg.warehouse / "tables" / "public.customers"))
        assert sorted(r["id"] for r in rows.collect()) == [4]
        assert {str(r["balance"]) for r in rows.collect()} == {"2.58"}  # base64 AQI= is 258, scale 2
    finally:
        for deleted in admin.delete_topics([topic, history], operation_timeout=30).values():
            deleted.result(timeout=60)
