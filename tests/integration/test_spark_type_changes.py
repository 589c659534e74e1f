"""Exact after type changes: numeric precision and scale both ways, int to bigint, a longer varchar, a
varchar become text, an added and a dropped column, while the connector runs, in Avro (each record read
with its writer schema), JSON with schemas (each Decimal read at the scale its record's own schema block
states) and plain JSON (each Decimal read at the scale of the table's version in force at the record's
position, from the schema history topic). Before, records written before ALTER COLUMN ... TYPE
numeric(14,3) were read at the new scale: 57.95 became 0.5795 or 5.795 and verify found thousands of
differences."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc import dev
from cdc_views import jobs
from cdc_views.reader import KafkaSource
from cdc_views.tables import Encoding, read_shapes
from cdc_views.verify import verify
from tests.support.spark import (
    CapturedDatabase,
    captured_database,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

TABLES = ["public.orders"]
STEPS = [
    "CREATE TABLE orders (id int PRIMARY KEY, total numeric(12,2), qty int, code varchar(10), note text)",
    "INSERT INTO orders SELECT i, i * 5.79 + 0.16, i, 'c' || i, 'n' FROM generate_series(1, 30) i",
    "ALTER TABLE orders ALTER COLUMN total TYPE numeric(14,3)",
    "UPDATE orders SET total = total + 0.001 WHERE id % 3 = 0",
    "INSERT INTO orders SELECT i, i * 1.234, i, 'c' || i, 'n' FROM generate_series(31, 40) i",
    "ALTER TABLE orders ALTER COLUMN total TYPE numeric(16,4)",
    "UPDATE orders SET total = total + 0.0001 WHERE id % 5 = 0",
    "ALTER TABLE orders ALTER COLUMN qty TYPE bigint",
    "UPDATE orders SET qty = 5000000000 WHERE id = 2",
    "ALTER TABLE orders ALTER COLUMN code TYPE varchar(20)",
    "UPDATE orders SET code = 'a longer code 1' WHERE id = 4",
    "ALTER TABLE orders ALTER COLUMN code TYPE text",
    "UPDATE orders SET code = 'now text, longer than twenty characters' WHERE id = 8",
    "ALTER TABLE orders ADD COLUMN extra int",
    "UPDATE orders SET extra = 1 WHERE id = 6",
    "ALTER TABLE orders DROP COLUMN note",
    "ALTER TABLE orders ALTER COLUMN total TYPE numeric(12,2)",  # the scale shrinks: the table is rounded
    "INSERT INTO orders VALUES (41, 41.41, 41, 'c41', 41)",
]


@pytest.fixture(scope="module", params=["avro", "json_schemas", "json"])
def changed(
    request: pytest.FixtureRequest, services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[CapturedDatabase, Encoding, Any]]:
    fmt = request.param
    extras: dict[str, dict[str, Any]] = {
        "avro": {"format": "avro", "schema_registry": {"url": services.schema_registry_url}},
        "json_schemas": {"json": {"schemas_enable": True}},
        "json": {},
    }
    extra = extras[fmt]
    name = f"types_{fmt}_{secrets.token_hex(3)}"
    with captured_database(services, tmp_path_factory.mktemp("types"), name, STEPS[:1], TABLES, **extra) as shop:
        shop.run(STEPS[1:])
        registry = None
        if fmt == "avro":
            from cdc.sink.registry import RegistrySettings

            assert services.schema_registry_url is not None, "the avro format needs the schema registry"
            registry = RegistrySettings(url=services.schema_registry_url)
        encoding = {"avro": Encoding(format="avro"), "json_schemas": Encoding(schemas_enable=True), "json": Encoding()}[
            fmt
        ]
        yield shop, encoding, registry


def test_every_value_equals_the_database_after_type_changes(
    spark: Any, changed: tuple[CapturedDatabase, Encoding, Any], tmp_path: Path
) -> None:
    shop, encoding, registry = changed
    shapes = read_shapes(shop.dsn, TABLES)
    cfg = jobs.JobConfig(
        KafkaSource(shop.bootstrap), shop.topic_prefix, shapes, tmp_path / "wh", encoding, registry=registry
    )
    jobs.rebuild(spark, cfg, ["warehouse"])
    report = verify(shop.dsn, cfg.warehouse, shapes, spark=spark, encoding=encoding)
    assert report.ok, report.render()
    rows = {
        r["id"]: r for r in spark.read.format("delta").load(str(cfg.warehouse / "tables" / "public.orders")).collect()
    }
    assert str(rows[10]["total"]) == "58.06" and rows[2]["qty"] == 5_000_000_000 and len(rows) == 41
    assert rows[8]["code"] == "now text, longer than twenty characters" and rows[4]["code"] == "a longer code 1"
