"""The schema rewriting of the Spark jobs' Avro reader (cdc_views.avro): pure functions on schema JSON."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import fastavro
import pytest

from cdc.event import Column, PgType, TableSchema
from cdc.sink.avro import AvroSerializer, AvroSettings

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark"))

from cdc_views.avro import _is_truncate_key, _pruned, _spark_ready


class _Registry:
    """Ids in registration order, one per distinct (subject, schema)."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def register(self, subject: str, schema: Any, *, source: str | None = None) -> int:
        self.schemas[subject] = schema
        return len(self.schemas)


def _connector_schemas() -> tuple[Any, Any]:
    table = TableSchema(
        "public",
        "accounts",
        (
            Column("id", PgType(23, "int4"), key=True, nullable=False),
            Column("balance", PgType(790, "money")),
            Column("rate", PgType(1700, "numeric"), modifier=(10 << 16 | 2) + 4),
        ),
    )
    serializer = AvroSerializer(AvroSettings(topic_prefix="p", database="db"), lambda _t: 1, _Registry())
    return serializer.schemas(table)


def test_the_envelope_reader_keeps_op_and_the_source_position_and_still_resolves_against_the_writer() -> None:
    _, value = _connector_schemas()

    reader = _pruned(value, {"op": None, "source": ("lsn", "ts_ms")})

    assert [f["name"] for f in reader["fields"]] == ["source", "op"]
    assert sorted(f["name"] for f in reader["fields"][0]["type"]["fields"]) == ["lsn", "ts_ms"]
    written = {
        "before": None,
        "after": None,
        "source": _source(),
        "transaction": None,
        "op": "d",
        "ts_ms": 1,
        "ts_us": 1,
        "ts_ns": 1,
    }
    assert _roundtrip(value, reader, written) == {"source": {"lsn": 42, "ts_ms": 7}, "op": "d"}


def test_the_row_reader_inlines_the_value_record_that_before_defined() -> None:
    _, value = _connector_schemas()
    after_type = next(f["type"] for f in value["fields"] if f["name"] == "after")
    assert isinstance(after_type[1], str)  # a reference to the record 'before' defines

    reader = _pruned(value, {"after": None})

    assert [f["name"] for f in reader["fields"]] == ["after"]
    assert reader["fields"][0]["type"][1]["type"] == "record"
    fastavro.parse_schema(reader)


def test_decimals_spark_cannot_hold_lose_their_logical_type_and_others_keep_it() -> None:
    _, value = _connector_schemas()

    ready = _spark_ready(value)

    row = next(f for f in ready["fields"] if f["name"] == "before")["type"][1]
    types = {f["name"]: f["type"][1] for f in row["fields"]}
    assert types["balance"]["precision"] == 64 and "logicalType" not in types["balance"]  # money
    assert types["rate"]["logicalType"] == "decimal" and types["rate"]["precision"] == 10
    assert _spark_ready(value) != value and "logicalType" in str(value)  # the input is not changed


def test_truncate_marker_keys_are_told_from_row_keys_by_their_schema() -> None:
    key, _ = _connector_schemas()
    marker = {
        "type": "record",
        "name": "TruncateKey",
        "namespace": "p.public.accounts",
        "fields": [{"name": "id", "type": ["null", "int"], "default": None}],
    }
    legacy = {
        "type": "record",
        "name": "TruncateKey",
        "namespace": "p.public.accounts",
        "fields": [{"name": "__cdc_truncate_partition", "type": "int"}],
    }

    assert _is_truncate_key(marker) and _is_truncate_key(legacy)
    assert not _is_truncate_key(key)


def _source() -> dict[str, Any]:
    return {
        "version": "1",
        "connector": "postgresql",
        "name": "p",
        "ts_ms": 7,
        "snapshot": "false",
        "db": "db",
        "sequence": None,
        "ts_us": None,
        "ts_ns": None,
        "schema": "public",
        "table": "accounts",
        "txId": None,
        "lsn": 42,
        "xmin": None,
    }


def _roundtrip(writer: Any, reader: Any, datum: Any) -> Any:
    import io

    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(writer), datum)
    buffer.seek(0)
    return fastavro.schemaless_reader(buffer, fastavro.parse_schema(writer), fastavro.parse_schema(reader))
