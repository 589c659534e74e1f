"""Debezium's side topics: transaction metadata (BEGIN / END with event counts) and heartbeats.

Shapes follow Debezium's transaction metadata and heartbeat records: the
transaction topic ``<prefix>.transaction`` keyed ``{"id": "<xid>:<commit lsn>"}``,
the heartbeat topic ``__debezium-heartbeat.<prefix>`` keyed
``{"serverName": "<prefix>"}`` with value ``{"ts_ms": ...}``.
"""

from __future__ import annotations

import time
from collections import Counter

import orjson

from cdc.event import TxBegin, TxCommit
from cdc.sink.record import Record


def transaction_topic(prefix: str) -> str:
    return f"{prefix}.transaction"


def heartbeat_topic(prefix: str) -> str:
    return f"__debezium-heartbeat.{prefix}"


class TransactionMetadata:
    """Counts the events of the open source transaction; BEGIN and END records for its topic."""

    def __init__(self, prefix: str) -> None:
        self.topic = transaction_topic(prefix)
        self._counts: Counter[str] = Counter()

    @staticmethod
    def _id(xid: int, commit_lsn: int) -> str:
        return f"{xid}:{commit_lsn}"

    def begin(self, tx: TxBegin) -> Record:
        self._counts.clear()
        tid = self._id(tx.xid, tx.commit_lsn)
        value = {"status": "BEGIN", "id": tid, "event_count": None, "data_collections": None, "ts_ms": tx.commit_ts_us // 1000}
        return Record(self.topic, orjson.dumps({"id": tid}), orjson.dumps(value))

    def count(self, table: str) -> None:
        self._counts[table] += 1

    def end(self, tx: TxCommit) -> Record:
        tid = self._id(tx.xid, tx.commit_lsn)
        value = {
            "status": "END",
            "id": tid,
            "event_count": sum(self._counts.values()),
            "data_collections": [{"data_collection": t, "event_count": n} for t, n in sorted(self._counts.items())],
            "ts_ms": tx.commit_ts_us // 1000,
        }
        return Record(self.topic, orjson.dumps({"id": tid}), orjson.dumps(value))


class Heartbeat:
    """A record on an interval, so consumers see the connector alive while the tables are idle."""

    def __init__(self, prefix: str, interval_s: float) -> None:
        self.topic = heartbeat_topic(prefix)
        self._key = orjson.dumps({"serverName": prefix})
        self._interval = interval_s
        self._last = time.monotonic()

    def due(self) -> Record | None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return None
        self._last = now
        return Record(self.topic, self._key, orjson.dumps({"ts_ms": time.time_ns() // 1_000_000}))
