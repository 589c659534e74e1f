"""Debezium's side topics: transaction metadata (BEGIN / END with event counts) and heartbeats.

Shapes follow Debezium's transaction metadata and heartbeat records: the
transaction topic ``<prefix>.transaction`` keyed ``{"id": "<xid>:<commit lsn>"}``,
the heartbeat topic ``__debezium-heartbeat.<prefix>`` keyed
``{"serverName": "<prefix>"}`` with value ``{"ts_ms": ...}``. Both are written in the configured
format through the table serializer (``EventSerializer.side_record``): JSON with or without the
Kafka Connect schema block, or Avro with the registry, each record valid against the schema it
carries, so a Connect converter turns it into a Struct (a plain JSON heartbeat beside
``schemas.enable=true`` is rejected by JsonConverter).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Final, Protocol

from cdc.event import TransactionBlock, TxBegin, TxCommit
from cdc.sink.connect import ConnectSchema
from cdc.sink.record import Record

_STRING: Final = ConnectSchema("string", None)
_INT64: Final = ConnectSchema("int64", None)

HEARTBEAT_KEY_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.common.ServerNameKey",
    version=1,
    fields=(("serverName", _STRING, False),),
)
HEARTBEAT_VALUE_SCHEMA: Final = ConnectSchema(
    "struct", None, name="io.debezium.connector.common.Heartbeat", version=1, fields=(("ts_ms", _INT64, False),)
)
TRANSACTION_KEY_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.common.TransactionMetadataKey",
    version=1,
    fields=(("id", _STRING, False),),
)
_EVENT_COLLECTION: Final = ConnectSchema(
    "struct",
    None,
    name="event.collection",
    version=1,
    fields=(("data_collection", _STRING, False), ("event_count", _INT64, False)),
)
TRANSACTION_VALUE_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.common.TransactionMetadataValue",
    version=1,
    fields=(
        ("status", _STRING, False),
        ("id", _STRING, False),
        ("event_count", _INT64, True),
        ("data_collections", ConnectSchema("array", None, items=_EVENT_COLLECTION), True),
        ("ts_ms", _INT64, False),
    ),
)


class SideFormat(Protocol):
    """What writes a side record in the configured format (``EventSerializer`` does)."""

    def side_record(
        self,
        topic: str,
        key_schema: ConnectSchema,
        key: dict[str, Any],
        value_schema: ConnectSchema,
        value: dict[str, Any],
    ) -> Record: ...


def transaction_topic(prefix: str) -> str:
    return f"{prefix}.transaction"


def heartbeat_topic(prefix: str) -> str:
    return f"__debezium-heartbeat.{prefix}"


class TransactionMetadata:
    """Counts the events of the open source transaction; BEGIN and END records for its topic."""

    def __init__(self, prefix: str, fmt: SideFormat) -> None:
        self.topic = transaction_topic(prefix)
        self._fmt = fmt
        self._counts: Counter[str] = Counter()
        self._total = 0
        self._tid = ""

    @staticmethod
    def _id(xid: int, commit_lsn: int) -> str:
        return f"{xid}:{commit_lsn}"

    def _record(self, tid: str, value: dict[str, Any]) -> Record:
        return self._fmt.side_record(self.topic, TRANSACTION_KEY_SCHEMA, {"id": tid}, TRANSACTION_VALUE_SCHEMA, value)

    def begin(self, tx: TxBegin) -> Record:
        self._counts.clear()
        self._total = 0
        tid = self._tid = self._id(tx.xid, tx.commit_lsn)
        value = {
            "status": "BEGIN",
            "id": tid,
            "event_count": None,
            "data_collections": None,
            "ts_ms": tx.commit_ts_us // 1000,
        }
        return self._record(tid, value)

    def count(self, table: str) -> TransactionBlock:
        """One more event of ``table`` in the open transaction: its ``transaction`` block."""
        counts = self._counts
        counts[table] += 1
        self._total += 1
        return TransactionBlock(self._tid, self._total, counts[table])

    def end(self, tx: TxCommit) -> Record:
        tid = self._id(tx.xid, tx.commit_lsn)
        value = {
            "status": "END",
            "id": tid,
            "event_count": sum(self._counts.values()),
            "data_collections": [{"data_collection": t, "event_count": n} for t, n in sorted(self._counts.items())],
            "ts_ms": tx.commit_ts_us // 1000,
        }
        return self._record(tid, value)


class Heartbeat:
    """A record on an interval, so consumers see the connector alive while the tables are idle."""

    def __init__(self, prefix: str, interval_s: float, fmt: SideFormat) -> None:
        self.topic = heartbeat_topic(prefix)
        self._fmt = fmt
        self._key = {"serverName": prefix}
        self._interval = interval_s
        self._last = time.monotonic()

    def due(self) -> Record | None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return None
        self._last = now
        value = {"ts_ms": time.time_ns() // 1_000_000}
        return self._fmt.side_record(self.topic, HEARTBEAT_KEY_SCHEMA, self._key, HEARTBEAT_VALUE_SCHEMA, value)
