"""cdc.dev.connect: the Connect worker runs the broker's Kafka version, the sink the issue's Debezium version."""

from __future__ import annotations

from cdc.dev import connect, kafka


def test_the_connect_worker_is_the_brokers_kafka_version() -> None:
    assert connect.worker_version() == kafka.version()


def test_the_jdbc_sink_is_debezium_3_3_1() -> None:
    assert connect.jdbc_sink_version() == "3.3.1.Final"
