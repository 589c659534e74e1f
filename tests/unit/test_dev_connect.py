"""cdc.dev.connect: the Connect worker runs the broker's Kafka version, the connectors the issue's Debezium version."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.dev import _proc, connect, kafka
from cdc.dev._proc import DevServiceError


def test_the_connect_worker_is_the_brokers_kafka_version() -> None:
    assert connect.worker_version() == kafka.version()


def test_the_jdbc_sink_is_debezium_3_3_1() -> None:
    assert connect.jdbc_sink_version() == "3.3.1.Final"


def test_the_postgres_source_is_the_baselines_debezium_and_the_sinks() -> None:
    assert connect.postgres_source_version() == "3.3.1.Final" == connect.jdbc_sink_version()


def test_the_postgres_source_pom_is_package_data_and_names_the_connector() -> None:
    pom = _proc.package_text(connect.POSTGRES_POM)
    assert "<artifactId>debezium-connector-postgres</artifactId>" in pom
    assert "<version>${debezium.version}</version>" in pom


def test_a_pom_property_is_read_by_name_and_a_missing_one_is_an_error() -> None:
    pom = (
        "<properties>\n  <debezium.version> 3.3.1.Final </debezium.version>\n"
        "  <kafka.version>4.3.1</kafka.version>\n</properties>"
    )
    assert connect.pom_property(pom, "kafka.version") == "4.3.1"
    assert connect.pom_property(pom, "debezium.version") == "3.3.1.Final"
    with pytest.raises(DevServiceError, match="no <postgresql.version>"):
        connect.pom_property(pom, "postgresql.version")


def test_the_postgres_source_streams_the_given_slot_and_publication_without_snapshot_or_schemas() -> None:
    config = connect.postgres_source_config(
        "postgresql://cdc:secret@127.0.0.1:54321/bench?sslmode=disable",
        slot="bench_dbz_0",
        publication="bench_pub",
        tables=["public.bench_rows", "public.other"],
        topic_prefix="bench_x",
    )
    assert config["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert (config["database.hostname"], config["database.port"]) == ("127.0.0.1", "54321")
    assert (config["database.user"], config["database.password"], config["database.dbname"]) == (
        "cdc",
        "secret",
        "bench",
    )
    assert (config["plugin.name"], config["slot.name"], config["publication.name"]) == (
        "pgoutput",
        "bench_dbz_0",
        "bench_pub",
    )
    assert config["publication.autocreate.mode"] == "disabled"
    # no snapshot at all, so it streams from the slot's position (no_data starts at the server's current one)
    assert config["snapshot.mode"] == "configuration_based"
    assert config["snapshot.mode.configuration.based.snapshot.schema"] == "false"
    assert config["snapshot.mode.configuration.based.snapshot.data"] == "false"
    assert config["snapshot.mode.configuration.based.start.stream"] == "true"
    assert config["table.include.list"] == "public.bench_rows,public.other"
    assert config["topic.prefix"] == "bench_x"
    assert config["key.converter.schemas.enable"] == config["value.converter.schemas.enable"] == "false"
    assert all(isinstance(v, str) for v in config.values())  # Connect's REST API takes strings


def test_the_postgres_source_fills_libpq_defaults_for_what_the_dsn_leaves_out() -> None:
    config = connect.postgres_source_config(
        "dbname=bench", slot="s", publication="p", tables=["public.t"], topic_prefix="x"
    )
    assert (config["database.hostname"], config["database.port"], config["database.password"]) == (
        "localhost",
        "5432",
        "",
    )


def test_the_tests_worker_keeps_its_quick_start_jvm_and_a_benchmark_can_ask_for_the_shipped_one(tmp_path: Path) -> None:
    assert connect.ConnectWorker(tmp_path, "b").jvm == connect.TEST_JVM
    shipped = connect.ConnectWorker(tmp_path, "b", jvm=connect.SHIPPED_JVM)
    assert "-XX:TieredStopAtLevel=1" not in shipped.jvm and "-Xmx2G" in shipped.jvm
