"""The Spark jobs read a record's position from its envelope when it has no position headers.

Two connectors capture one shop database from the same point, one with ``kafka.position_headers: true``
and one with the default (off); both see the same WAL, so their topics hold the same records but for the
headers. The batch rebuild without them matches the database, and the two warehouses are the same row for
row, the position columns (``_cdc_lsn``, ``_cdc_commit_lsn``) included: the envelope gives what the headers
gave. The workload also changes a Decimal's scale between two inserts of one transaction, which only the
schema history's LSNs can place for records without ``cdc.ordinal`` (JSON without the schema block).

JSON only: the Avro envelope's positions are checked where the Avro rebuild runs (test_spark_avro.py, whose
records have no headers); a second pair of connectors and rebuilds here cost 130 s of the suite.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc import dev
from cdc_views import jobs
from cdc_views.reader import KafkaSource
from cdc_views.verify import verify
from tests.support.connector import Connector, write_config
from tests.support.spark import (
    SHOP_SCHEMA,
    SHOP_TABLES,
    SHOP_WORKLOAD,
    CapturedDatabase,
    captured_database,
    delete_topics,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

# One transaction: a product at the old scale, the ALTER, a product at the new one (JSON only: the Avro
# reader resolves every record to the topic's latest schema, a scale change being a type change there).
ALTER_INSIDE = [
    "INSERT INTO products (sku, title, price) VALUES ('SKU-A', 'before the alter', 12.34)",
    "ALTER TABLE products ALTER COLUMN price TYPE numeric(12,3)",
    "INSERT INTO products (sku, title, price) VALUES ('SKU-B', 'after the alter', 5.678)",
]


def wait_confirmed(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        end = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert end is not None
        for _ in range(300):
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (end[0], slot),
            ).fetchone()
            if row and row[0]:
                return
            conn.execute("SELECT pg_sleep(0.2)")
    raise AssertionError(f"slot {slot} did not confirm the workload")


def twin_shops(services: dev.Endpoints, work: Path, stack: ExitStack) -> tuple[CapturedDatabase, str]:
    """The shop captured without position headers (the default); the topic prefix of a second connector
    with them, started before the workload."""
    name = f"spark_pos_{secrets.token_hex(3)}"
    shop = stack.enter_context(
        captured_database(services, work, name, [SHOP_SCHEMA], SHOP_TABLES, kafka={"partitions": 3})
    )
    twin = f"{name}_h"
    config = write_config(
        work / "twin.yaml",
        source={"dsn": shop.dsn, "slot": twin, "publication": twin},
        tables=list(SHOP_TABLES),
        kafka={"bootstrap_servers": services.kafka_bootstrap, "partitions": 3, "position_headers": True},
        topic_prefix=twin,
        status_interval_s=1.0,
    )
    connector = Connector(config, work / "twin.log").start()
    stack.callback(delete_topics, services.kafka_bootstrap, twin)
    stack.callback(lambda: _drop_slot(services.postgres_dsn, twin))
    stack.callback(connector.stop)
    connector.wait_streaming(shop.dsn, twin, timeout=240)  # as captured_database: slow to start under load
    return shop, twin


def _drop_slot(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )


@pytest.fixture
def shops(services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CapturedDatabase, str]]:
    with ExitStack() as stack:
        shop, twin = twin_shops(services, tmp_path_factory.mktemp("spark-pos"), stack)
        shop.run(SHOP_WORKLOAD)
        with psycopg.connect(shop.dsn, autocommit=True) as conn, conn.transaction():
            for statement in ALTER_INSIDE:
                conn.execute(statement)
        shop.run(["UPDATE customers SET name = name || '.' WHERE id = 3"])  # and the stream goes on
        wait_confirmed(shop.dsn, twin)
        yield shop, twin


def test_a_rebuild_without_position_headers_is_the_rebuild_with_them(
    spark: Any, shops: tuple[CapturedDatabase, str], tmp_path: Path
) -> None:
    shop, twin = shops
    plain = shop.job(tmp_path / "plain")
    headed = jobs.JobConfig(KafkaSource(shop.bootstrap), twin, shop.shapes(), tmp_path / "headed")

    jobs.rebuild(spark, plain)
    jobs.rebuild(spark, headed)

    report = verify(shop.dsn, plain.warehouse, plain.tables, spark=spark)  # and so is headed: the same rows below
    assert report.ok, report.render()
    # the same records but for the headers; where they sit in Kafka may differ (two connectors' producers)
    where = ("_cdc_offset", "_cdc_partition")
    for table in SHOP_TABLES:
        a = spark.read.format("delta").load(str(plain.warehouse / "tables" / table)).drop(*where)
        b = spark.read.format("delta").load(str(headed.warehouse / "tables" / table)).drop(*where)
        assert a.count() == b.count() > 0, table
        assert a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty(), f"{table}: the two rebuilds differ"
        assert a.where("_cdc_lsn IS NULL OR _cdc_commit_lsn IS NULL OR _cdc_commit_lsn < _cdc_lsn").isEmpty(), table
    with psycopg.connect(shop.dsn) as conn:
        prices: dict[str, str] = dict(
            conn.execute("SELECT sku, price::text FROM products WHERE sku IN ('SKU-A', 'SKU-B')").fetchall()
        )
    assert prices == {"SKU-A": "12.340", "SKU-B": "5.678"}
    rows = (
        spark.read.format("delta")
        .load(str(plain.warehouse / "tables" / "public.products"))
        .where("sku IN ('SKU-A', 'SKU-B')")
    )
    assert {r["sku"]: str(r["price"]) for r in rows.collect()} == prices  # each at its own scale, placed by LSN
