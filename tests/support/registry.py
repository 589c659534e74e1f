"""Reading Avro records back as any consumer does: through the schema registry, by the id in each record."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import orjson

from cdc.sink.avro import decode_wire
from cdc.sink.registry import RegistryClient


class Consumer:
    """Decodes records as a consumer does: schema id from the record, schema from the registry by id."""

    def __init__(self, url: str) -> None:
        self.registry = RegistryClient(url)  # a fresh client: nothing cached from the producer side
        self._parsed: dict[int, Any] = {}

    def schema_id(self, data: bytes) -> int:
        return decode_wire(data)[0]

    def decode(self, data: bytes | None, reader: Any = None) -> Any:
        if data is None:
            return None
        schema_id, body = decode_wire(data)
        writer = self._parsed.get(schema_id)
        if writer is None:
            writer = self._parsed[schema_id] = fastavro.parse_schema(orjson.loads(self.registry.schema_text(schema_id)))
        if reader is None:
            return fastavro.schemaless_reader(io.BytesIO(body), writer)
        return fastavro.schemaless_reader(io.BytesIO(body), writer, fastavro.parse_schema(reader))
