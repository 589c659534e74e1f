"""Tables with values stored out of line (TOAST) and their topics read back as a consumer does, for
tests/integration/test_toast.py (issue #38).

A ``docs`` table: ``id`` (key), a small ``n`` the updates change, and three values of about 9 KB each
(``body`` text, ``doc`` jsonb, ``blob`` bytea) made of random bytes, so that pglz cannot compress them
and PostgreSQL stores them out of line: an UPDATE that leaves them alone sends them to pgoutput as
'u' (unchanged TOAST) under REPLICA IDENTITY DEFAULT.

``Reader`` decodes a record's key and envelope in each of the daemon's formats (JSON, JSON with the
Kafka Connect schema block, Avro through the registry) into plain rows: ``{"id", "n", "body", "doc",
"blob"}`` with ``doc`` the jsonb's raw text and ``blob`` bytes; ``table_rows`` reads the table the same
way, so a replay compares with it column for column.
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections.abc import Callable, Iterable
from typing import Any, overload

import psycopg
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from psycopg.types.json import Jsonb

from tests.support.registry import Consumer

PLACEHOLDER = "__debezium_unavailable_value"
"""Debezium's ``unavailable.value.placeholder``, the daemon's default ``toast.placeholder``."""

COLUMNS = ("id", "n", "body", "doc", "blob")
BIG = ("body", "doc", "blob")
VALUE_BYTES = 9000

# Compaction as fast as the broker allows: segments roll on the next append after 200 ms, the cleaner
# takes any dirty segment, tombstones go 100 ms after a cleaning (as test_pipeline's compaction test).
FAST_COMPACTION = {
    "segment.ms": "200",
    "min.cleanable.dirty.ratio": "0.001",
    "delete.retention.ms": "100",
    "min.compaction.lag.ms": "0",
}


def create_docs(conn: psycopg.Connection[Any], name: str = "docs", identity: str = "DEFAULT") -> None:
    conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL, body text, doc jsonb, blob bytea)")
    conn.execute(f"ALTER TABLE {name} REPLICA IDENTITY {identity}")


def big_values(rng: random.Random, tag: str) -> tuple[str, Jsonb, bytes]:
    """Three incompressible values of ~9 KB: base64 text, a jsonb document holding hex, raw bytes."""
    body = f"{tag}:" + base64.b64encode(rng.randbytes(VALUE_BYTES * 3 // 4)).decode()
    doc = Jsonb({"tag": tag, "hex": rng.randbytes(VALUE_BYTES // 2).hex(), "list": [1, 2, 3]})
    return body, doc, rng.randbytes(VALUE_BYTES)


def insert_doc(conn: psycopg.Connection[Any], rng: random.Random, i: int, table: str = "docs") -> None:
    body, doc, blob = big_values(rng, f"row{i}")
    conn.execute(f"INSERT INTO {table} VALUES (%s, 0, %s, %s, %s)", (i, body, doc, blob))


def assert_out_of_line(conn: psycopg.Connection[Any], table: str = "docs") -> None:
    """Every big value is stored uncompressed and larger than a page can hold inline: out of line, in TOAST."""
    rows = conn.execute(
        f"SELECT id, pg_column_size(body), pg_column_size(doc), pg_column_size(blob), "
        f"pg_column_compression(body), pg_column_compression(doc), pg_column_compression(blob) FROM {table}"
    ).fetchall()
    assert rows, f"{table} is empty"
    for row in rows:
        sizes, methods = row[1:4], row[4:7]
        assert all(s is None or s > 8000 for s in sizes) and any(s is not None for s in sizes), (
            f"row {row[0]}: stored sizes {sizes}: not out of line"
        )
        assert methods == (None, None, None), (
            f"row {row[0]}: compressed ({methods}): the test needs incompressible values"
        )


def table_rows(conn: psycopg.Connection[Any], table: str = "docs") -> dict[int, dict[str, Any]]:
    """The table's rows by id, in the shape ``Reader.row`` gives (doc as parsed JSON, blob as bytes)."""
    out = {}
    for id_, n, body, doc, blob in conn.execute(f"SELECT id, n, body, doc, blob FROM {table}").fetchall():
        out[id_] = {"id": id_, "n": n, "body": body, "doc": doc, "blob": bytes(blob) if blob is not None else None}
    return out


class Reader:
    """Keys and envelopes of one format: ``json``, ``json_schemas`` or ``avro`` (through the registry)."""

    def __init__(self, fmt: str, registry_url: str | None = None) -> None:
        assert fmt in ("json", "json_schemas", "avro"), fmt
        self.fmt = fmt
        self.avro: Consumer | None = None
        if fmt == "avro":
            assert registry_url is not None, "the avro format needs the registry's URL"
            self.avro = Consumer(registry_url)

    def _decode(self, data: bytes | None) -> Any:
        if data is None:
            return None
        if self.avro is not None:
            return self.avro.decode(data)
        value = json.loads(data)
        return value["payload"] if self.fmt == "json_schemas" else value

    def key(self, m: Any) -> int:
        return int(self._decode(m.key())["id"])

    def envelope(self, m: Any) -> dict[str, Any] | None:
        env: dict[str, Any] | None = self._decode(m.value())
        return env

    def image(self, image: dict[str, Any] | None) -> dict[str, Any] | None:
        """A before/after image as a row: bytea as bytes (base64 in JSON, bytes in Avro), jsonb as its raw text."""
        if image is None:
            return None
        blob = image.get("blob")
        if isinstance(blob, str):
            blob = base64.b64decode(blob)
        return {"id": image["id"], "n": image["n"], "body": image["body"], "doc": image["doc"], "blob": blob}

    def records(
        self, messages: Iterable[Any]
    ) -> list[tuple[int, str | None, dict[str, Any] | None, dict[str, Any] | None]]:
        """(key id, op or None for a tombstone, before row, after row) of each record, in log order."""
        out: list[tuple[int, str | None, dict[str, Any] | None, dict[str, Any] | None]] = []
        for m in messages:
            env = self.envelope(m)
            if env is None:
                out.append((self.key(m), None, None, None))
            else:
                out.append((self.key(m), env["op"], self.image(env["before"]), self.image(env["after"])))
        return out


@overload
def parsed(row: dict[str, Any]) -> dict[str, Any]: ...
@overload
def parsed(row: None) -> None: ...
@overload
def parsed(row: dict[str, Any] | None) -> dict[str, Any] | None: ...
def parsed(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A record's row with its jsonb text parsed, to compare with ``table_rows`` (a placeholder stays text)."""
    if row is None or row["doc"] is None:
        return row
    try:
        return {**row, "doc": json.loads(row["doc"])}
    except ValueError:
        return row


def replay(records: Iterable[tuple[int, str | None, Any, Any]]) -> dict[int, dict[str, Any]]:
    """Latest value per key from offset 0, tombstones deleting: what a consumer rebuilding the table holds."""
    state: dict[int, dict[str, Any]] = {}
    for key, op, _before, after in records:
        if op is None or op == "d":
            state.pop(key, None)  # the delete's own record and its tombstone
        else:
            state[key] = parsed(after)
    return state


def placeholders(row: dict[str, Any] | None, text: str = PLACEHOLDER) -> list[str]:
    """The big columns of a record's row that hold the placeholder (text and jsonb: the text, bytea: its bytes)."""
    if row is None:
        return []
    wanted = {"body": text, "doc": text, "blob": text.encode()}
    return [c for c in BIG if row[c] == wanted[c]]


def differences(state: dict[int, dict[str, Any]], table: dict[int, dict[str, Any]]) -> list[str]:
    """Row-for-row, column-for-column differences between a replay and the table, short enough for a message."""
    out = []
    for key in sorted(set(state) | set(table)):
        if key not in table:
            out.append(f"id {key}: in the topic, not in the table")
        elif key not in state:
            out.append(f"id {key}: in the table, not in the topic")
        else:
            for c in COLUMNS:
                if state[key][c] != table[key][c]:
                    got = state[key][c]
                    out.append(f"id {key} column {c}: topic has {str(got)[:60]!r}... ({len(str(got))} chars)")
    return out


def set_fast_compaction(bootstrap: str, topic: str) -> None:
    """Lower the topic's cleaner settings now (the daemon created it with the defaults, so that everything
    written before this call could be read uncompacted first)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in FAST_COMPACTION.items()
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def compact(
    consume_all: Callable[..., list[Any]],
    topic: str,
    tick: Callable[[], object],
    done: Callable[[list[Any]], bool],
    timeout: float = 120,
) -> list[Any]:
    """Keep appending (``tick``: one more change, so that segments roll and the cleaner has something to
    clean) until ``done(messages)`` holds for the topic's records; raises if it never does."""
    deadline = time.monotonic() + timeout
    while True:
        tick()
        time.sleep(0.5)
        msgs = consume_all([topic], timeout=20.0)
        if done(msgs):
            return msgs
        if time.monotonic() > deadline:
            raise AssertionError(f"the cleaner did not compact {topic} within {timeout}s ({len(msgs)} records)")
