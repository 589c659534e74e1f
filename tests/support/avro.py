"""What the Avro tests share: an in-memory schema registry with the client's interface, a serializer on
it, and a consumer's decoding of its records."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import orjson

from cdc.sink.avro import AvroSerializer, AvroSettings, decode_wire

CLOCK_NS = 1714566897101234567


class FakeRegistry:
    """In memory, with the client's interface: an id per distinct schema, versions per subject."""

    def __init__(self, first_id: int = 1) -> None:
        self.schemas: dict[int, Any] = {}
        self.subjects: dict[str, list[int]] = {}
        self.calls: list[tuple[str, str | None]] = []
        self._ids: dict[bytes, int] = {}
        self._next = first_id

    def register(self, subject: str, schema: Any, *, source: str | None = None) -> int:
        self.calls.append((subject, source))
        canonical = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        schema_id = self._ids.get(canonical)
        if schema_id is None:
            schema_id = self._ids[canonical] = self._next
            self._next += 1
            self.schemas[schema_id] = orjson.loads(canonical)
        versions = self.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def latest(self, subject: str) -> Any:
        return self.schemas[self.subjects[subject][-1]]


def settings(**options: Any) -> dict[str, Any]:
    return {"topic_prefix": "dbserver1", "database": "inventory", "connector_version": "3.6.1.Final", **options}


def avro(
    partitions: int = 3, registry: FakeRegistry | None = None, **options: Any
) -> tuple[AvroSerializer, FakeRegistry]:
    registry = registry if registry is not None else FakeRegistry()
    s = AvroSerializer(
        AvroSettings(**settings(**options)), lambda topic: partitions, registry, clock_ns=lambda: CLOCK_NS
    )
    return s, registry


def decode(registry: FakeRegistry, data: bytes | None) -> Any:
    """What a consumer does: read the schema id, fetch that schema, decode the body."""
    assert data is not None
    schema_id, body = decode_wire(data)
    return fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(registry.schemas[schema_id]))
