"""The Spark jobs over Avro topics: the real connector writes ``format: avro`` against the real
schema registry (Apicurio's Confluent-compatible API), the batch job rebuilds every view from
offset 0 decoding with Spark's ``from_avro``, and verification compares them with the database.

The shop (schema, workload, helpers) and the session-wide SparkSession are tests.support.spark's; the
workload's ``ALTER TABLE customers ADD COLUMN tier`` in the middle gives the customers topic two
value schema ids, and its TRUNCATE gives truncate markers with their own key schema.
"""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc import dev
from cdc.sink.registry import RegistryClient, RegistrySettings
from cdc_views import declared, jobs
from cdc_views.reader import KafkaSource, RegistryUnavailable, UndecodableRecords
from cdc_views.tables import Encoding
from cdc_views.verify import verify
from tests.support.connector import write_config
from tests.support.spark import (
    SHOP_DECLARED,
    SHOP_TABLES,
    CapturedDatabase,
    assert_shop_matches,
    delta_versions,
    shop_captured,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

AVRO = Encoding(format="avro")


@pytest.fixture(scope="module")
def registry_url(services: dev.Endpoints) -> str:
    if services.schema_registry_url is None:
        pytest.skip("no schema registry in this environment (cdc.dev could not fetch Apicurio, or docker mode)")
    return services.schema_registry_url


@pytest.fixture(scope="module")
def avro_shop(
    services: dev.Endpoints, registry_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CapturedDatabase]:
    """test_spark's shop and workload, captured by a connector that writes Avro (module-wide)."""
    name = f"spark_avro_{secrets.token_hex(3)}"
    work = tmp_path_factory.mktemp("spark-avro-shop")
    try:
        with shop_captured(services, work, name, format="avro", schema_registry={"url": registry_url}) as shop:
            yield shop
    finally:
        _delete_subjects(registry_url, name)


def _delete_subjects(url: str, prefix: str) -> None:
    client = RegistryClient(url, retry_timeout_s=10)
    for subject in client.subjects():
        if subject.startswith(prefix + "."):
            client.delete_subject(subject, permanent=True)


def test_batch_rebuild_from_avro_topics_matches_the_database_and_a_second_run_changes_nothing(
    spark: Any, avro_shop: CapturedDatabase, registry_url: str, tmp_path: Path
) -> None:
    registry = RegistryClient(registry_url)
    assert (
        len(registry.versions(f"{avro_shop.topic_prefix}.public.customers-value")) == 2
    )  # before and after ADD COLUMN
    cfg = avro_shop.job(
        tmp_path / "warehouse", encoding=AVRO, registry=RegistrySettings(url=registry_url), declared=SHOP_DECLARED
    )

    summary = jobs.rebuild(spark, cfg)
    report = verify(
        avro_shop.dsn, cfg.warehouse, cfg.tables, spark=spark, encoding=AVRO, declared_section=SHOP_DECLARED
    )

    assert_shop_matches(report)
    indexed = summary["index shop_search"]
    assert isinstance(indexed, int) and indexed > 0
    assert declared.search(declared.index_path(cfg.warehouse, "shop_search"), "keyboard")[0]["id"] == "product:1"
    customers = spark.read.format("delta").load(str(cfg.warehouse / "tables" / "public.customers"))
    assert {r["_cdc_key"] for r in customers.where("id = 1000").collect()} == {'{"id":1000}'}  # the key's JSON text
    assert customers.where("tier = 'gold'").count() == 5
    # Records without position headers (the default): each row's position comes from its Avro envelope
    # (source.lsn, source.sequence); test_spark_positions holds the JSON envelope to the headers' values.
    for table in SHOP_TABLES:
        rows = spark.read.format("delta").load(str(cfg.warehouse / "tables" / table))
        assert (
            rows.count() > 0
            and rows.where("_cdc_lsn IS NULL OR _cdc_commit_lsn IS NULL OR _cdc_commit_lsn < _cdc_lsn").isEmpty()
        ), table

    before = delta_versions(cfg.warehouse)
    again = jobs.rebuild(spark, cfg)
    assert delta_versions(cfg.warehouse) == before
    assert all(v == 0 for k, v in again.items() if k.startswith(("table ", "view ")))


KEY_SCHEMA = {"type": "record", "name": "Key", "namespace": "t", "fields": [{"name": "id", "type": "int"}]}
VALUE_SCHEMA = {
    "type": "record",
    "name": "Envelope",
    "namespace": "t",
    "fields": [
        {
            "name": "before",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Value",
                    "fields": [
                        {"name": "id", "type": "int"},
                        {"name": "name", "type": ["null", "string"], "default": None},
                    ],
                },
            ],
            "default": None,
        },
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [
                    {"name": "lsn", "type": ["null", "long"], "default": None},
                    {"name": "ts_ms", "type": "long"},
                ],
            },
        },
        {"name": "op", "type": "string"},
    ],
}


def _framed(schema_id: int, schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def test_avro_records_that_do_not_decode_are_reported_and_fail_the_job_unless_told_to_skip(
    spark: Any, services: dev.Endpoints, registry_url: str, avro_shop: CapturedDatabase, tmp_path: Path
) -> None:
    prefix = f"badavro_{secrets.token_hex(3)}"
    topic = f"{prefix}.public.customers"
    registry = RegistryClient(registry_url)
    key_id = registry.register(f"{topic}-key", KEY_SCHEMA)
    value_id = registry.register(f"{topic}-value", VALUE_SCHEMA)
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)

    def row(i: int) -> bytes:
        envelope = {"after": {"id": i, "name": f"n{i}"}, "source": {"lsn": 100 * i, "ts_ms": 1}, "op": "c"}
        return _framed(value_id, VALUE_SCHEMA, envelope)

    unknown_id = max(key_id, value_id) + 100_000
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    try:
        for i, value in enumerate(
            [
                row(1),
                b'{"op":"c"}',  # offset 1: JSON, not the wire format
                b"\x00" + unknown_id.to_bytes(4, "big") + row(3)[5:],  # offset 2: an id the registry does not have
                b"\x00" + value_id.to_bytes(4, "big") + b"\xff\xff\xff",  # offset 3: a body that does not decode
                row(5),
            ],
            1,
        ):
            producer.produce(topic, key=_framed(key_id, KEY_SCHEMA, {"id": i}), value=value)
        producer.flush(30)
        shapes = {"public.customers": avro_shop.shapes()["public.customers"]}
        settings = RegistrySettings(url=registry_url)
        cfg = jobs.JobConfig(
            KafkaSource(services.kafka_bootstrap), prefix, shapes, tmp_path / "warehouse", AVRO, registry=settings
        )

        with pytest.raises(UndecodableRecords) as failure:
            jobs.rebuild(spark, cfg, ["warehouse"])
        assert failure.value.count == 3
        assert [(b.partition, b.offset) for b in failure.value.examples] == [(0, 1), (0, 2), (0, 3)]
        reasons = [b.reason for b in failure.value.examples]
        assert "not in the Confluent Avro wire format" in reasons[0]
        assert f"value schema id {unknown_id} is not in the schema registry at {registry_url}" in reasons[1]
        assert f"does not decode with its schema (id {value_id})" in reasons[2]

        skipping = jobs.JobConfig(cfg.source, prefix, shapes, cfg.warehouse, AVRO, "skip", registry=settings)
        summary = jobs.rebuild(spark, skipping, ["warehouse"])
        assert summary["bad_records_skipped"] == {"public.customers": 3}
        rows = spark.read.format("delta").load(str(cfg.warehouse / "tables" / "public.customers")).collect()
        assert sorted((r["id"], r["name"], r["email"]) for r in rows) == [(1, "n1", None), (5, "n5", None)]
    finally:
        admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)
        _delete_subjects(registry_url, prefix)


def test_a_registry_that_does_not_answer_is_one_clear_error(
    spark: Any, avro_shop: CapturedDatabase, tmp_path: Path
) -> None:
    url = "http://127.0.0.1:9/apis/ccompat/v7"  # the discard port: nothing listens
    cfg = avro_shop.job(tmp_path / "warehouse", encoding=AVRO, registry=RegistrySettings(url=url, retry_timeout_s=0.5))

    with pytest.raises(RegistryUnavailable, match=rf"cannot reach the schema registry at {url}.*--registry URL"):
        jobs.rebuild(spark, cfg, ["warehouse"])
    assert not (tmp_path / "warehouse").exists()


def test_the_command_line_takes_format_and_registry_from_the_connector_config(tmp_path: Path) -> None:
    from cdc_views.cli import _config_defaults, _settings, build_parser

    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": "host=db dbname=shop user=cdc", "slot": "s", "publication": "p"},
        tables=["public.customers"],
        kafka={"bootstrap_servers": "k:9092"},
        topic_prefix="shop",
        format="avro",
        avro={"decimal_handling": "string"},
        schema_registry={"url": "http://registry:8080/apis/ccompat/v7"},
    )
    settings = _config_defaults(str(config))
    assert settings["format"] == "avro"
    assert settings["registry"].url == "http://registry:8080/apis/ccompat/v7"
    assert settings["decimal_handling"] == "string"
    assert settings["tables"] == ["public.customers"]
    args = build_parser().parse_args(
        ["rebuild", "--config", str(config), "--warehouse", "wh", "--registry", "http://other:8081"]
    )
    assert _settings(args)["registry"].url == "http://other:8081"
    no_registry = build_parser().parse_args(
        ["rebuild", "--config", str(config), "--warehouse", "wh", "--format", "avro"]
    )
    assert _settings(no_registry)["format"] == "avro"
    with pytest.raises(SystemExit, match="missing --registry"):
        _settings(
            build_parser().parse_args(
                [
                    "rebuild",
                    "--dsn",
                    "host=db",
                    "--tables",
                    "public.t",
                    "--bootstrap",
                    "k:1",
                    "--topic-prefix",
                    "p",
                    "--format",
                    "avro",
                    "--warehouse",
                    "wh",
                ]
            )
        )
