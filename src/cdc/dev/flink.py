"""Flink's SQL Kafka connector jar for ``scripts/flink_compat.py`` (``make flink-compat``), which proves Flink's
``debezium-json`` format reads our topics. Not a service of ``cdc dev up``: the jar comes from Maven Central
through the same mechanism as the broker's, into ``$CDC_CACHE_DIR/flink/``."""

from __future__ import annotations

from pathlib import Path

from structlog.typing import FilteringBoundLogger

from cdc.dev import _proc
from cdc.dev._proc import DevServiceError

POM = "flink-kafka-pom.xml"
ARTIFACT = "flink-sql-connector-kafka-5.0.0-2.2"


def kafka_connector_jar(log: FilteringBoundLogger) -> Path:
    """The ``flink-sql-connector-kafka`` jar, fetched with Maven on first use."""
    root = _proc.maven_fetch(POM, "flink", ARTIFACT, log, goal=("dependency:copy",))
    jar = next((root / "libs").glob("flink-sql-connector-kafka-*.jar"), None)
    if jar is None:
        raise DevServiceError(f"the Flink connector cache {root} is incomplete; delete it and retry")
    return jar
