"""Before/after byte capture: the records of a baseline revision's daemon and of this tree's, compared byte for byte.

One command: ``.venv/bin/python bench/compare_records.py`` (``--baseline REV``; default: the merge-base of HEAD
with ``main``). Exit 0 when every record is the same, 1 on any difference (each named by topic, partition,
offset and part), 2 when the run itself failed.

1. The baseline revision is checked out into a temporary ``git worktree`` (removed afterwards); the current side
   is this working tree, uncommitted changes included. Each daemon runs as ``python -m cdc.cli run --config ...``
   in its own tree with ``PYTHONPATH=<tree>/src`` (this venv's interpreter and libraries for both).
2. The dev services (``cdc.dev.up``, state folder ``.cdc-dev/test`` as the integration tests use, reused when they
   already run) give Postgres, Kafka and the schema registry. A fresh database gets the tables of the workload and
   one publication; then one slot is created and copied (``pg_copy_logical_replication_slot``) so that every slot
   starts at the same LSN and with the same consistent point: two per format (baseline, current), all before the
   workload. Both sides therefore decode the very same WAL.
3. One mixed workload (``WORKLOAD``): scalar, numeric, temporal, array, json/jsonb, bytea, uuid, inet, NULL values;
   a TOASTed value left unchanged by updates; a REPLICA IDENTITY FULL table; deletes; a primary-key change; an
   ALTER TABLE ADD COLUMN; a transaction of 3,000 rows; a transactional logical message; a truncate; last a
   sentinel row.
4. Per format (``json``, ``json`` with ``schemas_enable``, ``avro`` through the registry), with
   ``transaction_metadata: true`` and 3 partitions per table: the baseline daemon, then the current one, each on
   its own slot and the same topic prefix (a record's partition hashes its key bytes, which carry the prefix or a
   registry id), runs until the sentinel is published, stops on SIGTERM (exit 0 required); every topic of the
   prefix is read from offset 0 to its end (read_committed), then the topics are deleted before the next side.
5. Compared per topic: the list of records in partition and offset order, each its partition, offset, key,
   value and headers (names and values, in order).

Normalized (and nothing else):
- the slot name: the current side's is replaced by the baseline's (same length, so Avro's length prefixes are
  untouched) in topic names, keys, values and header values (it is in the key of the snapshot progress topic);
- the envelope's top-level ``ts_ms``, ``ts_us``, ``ts_ns``: the serializer's clock when the record was made.
  JSON: in a document whose top level (or whose schemas_enable ``payload``) has ``op``, the digits of those three
  members of that object are replaced by ``0`` (a scanner finds them, checked against the parsed document). Avro: the record is
  decoded with its writer schema, re-encoded (which must give the original bytes back, else it is a difference),
  and re-encoded with those three fields at 0. ``source.ts_*`` (commit time) and the transaction topic's
  ``ts_ms`` are compared as they are;
Not normalized: Avro schema ids (both sides register the same subjects; a changed schema gets a new id: a
difference).
Not compared: the Kafka record timestamp (CreateTime: the producer's clock).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import fastavro
import psycopg
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

REPO = Path(__file__).resolve().parents[1]

FORMATS: dict[str, dict[str, Any]] = {
    "json": {"format": "json"},
    "json-schemas": {"format": "json", "json": {"schemas_enable": True}},
    "avro": {"format": "avro"},
}

SCHEMA = """
CREATE TABLE kinds (
    id int PRIMARY KEY, i2 smallint, i8 bigint, n numeric(12,3), nfree numeric, r real, d double precision,
    b boolean, t text, vc varchar(20), c char(3), dt date, tm time, tmtz timetz, ts timestamp(6),
    tstz timestamptz, iv interval, u uuid, j json, jb jsonb, ba bytea, ints int[], texts text[],
    ip inet, big text
);
CREATE TABLE kv (k text PRIMARY KEY, v int);
CREATE TABLE full_ident (id int, note text);
ALTER TABLE full_ident REPLICA IDENTITY FULL;
CREATE TABLE bulk (id bigint PRIMARY KEY, grp int NOT NULL, payload text, amount numeric(10,2));
CREATE TABLE sentinel (id int PRIMARY KEY);
"""
TABLES = ["public.kinds", "public.kv", "public.full_ident", "public.bulk", "public.sentinel"]

WORKLOAD: list[str | list[str]] = [  # a list is one transaction
    """INSERT INTO kinds VALUES
      (1, -32768, 9223372036854775807, 123456789.125, 0.000000001, 3.25, -1.5e300, true, 'héllo "q" \\ ',
       'vc', 'ab', '2024-02-29', '23:59:59.999999', '01:02:03+05:30', '1999-12-31 23:59:59.123456',
       '2024-06-01 12:00:00.5+02', '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
       '{"a": [1, 2.5, null]}', '{"z": {"y": true}, "a": "x"}', '\\x00ff10', '{1,NULL,3}', '{"a b",NULL,""}',
       '10.0.0.1/8', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 600) i)),
      (2, NULL, NULL, NULL, '-12345678901234567890.5', 'Infinity', '-Infinity', NULL, NULL, NULL, NULL, 'infinity', NULL, NULL,
       '-infinity', NULL, NULL, NULL, 'null', '[]', '\\x', '{}', '{}', '::1', NULL),
      (3, 0, 0, -0.001, 1e-20, 0, 0, false, '', '', '', '0001-01-01', '00:00', '00:00+00', '0001-01-01 00:00',
       '1970-01-01 00:00+00', '-1 days', '00000000-0000-0000-0000-000000000000', '0', '"s"', '\\x0a',
       '{4,5}', '{x}', '192.168.1.1', 'small')""",
    "UPDATE kinds SET i2 = 7, t = 'changed' WHERE id = 1",  # big is TOASTed and unchanged
    "UPDATE kinds SET big = big || 'x' WHERE id = 1",
    "UPDATE kinds SET n = 1.5, jb = jb || '{\"b\": 2}' WHERE id = 1",  # unchanged TOAST again
    "DELETE FROM kinds WHERE id = 3",
    [
        "INSERT INTO kv VALUES ('a', 1), ('b', 2), ('c', 3)",
        "UPDATE kv SET k = 'z' WHERE k = 'a'",  # a primary-key change
        "SELECT pg_logical_emit_message(true, 'compare.tx', 'inside the transaction')",
        "DELETE FROM kv WHERE k = 'b'",
    ],
    "INSERT INTO full_ident VALUES (1, 'one'), (2, NULL)",
    "UPDATE full_ident SET note = 'uno' WHERE id = 1",
    "DELETE FROM full_ident WHERE id = 2",
    "ALTER TABLE kv ADD COLUMN added timestamptz DEFAULT '2020-01-01 00:00+00'",
    "INSERT INTO kv (k, v) VALUES ('d', 4)",
    [
        "INSERT INTO bulk SELECT i, i % 7, repeat(md5(i::text), 1 + i % 3), i * 1.25 FROM generate_series(1, 3000) i",
        "UPDATE bulk SET amount = NULL WHERE grp = 3",
        "DELETE FROM bulk WHERE grp = 5",
    ],
    "TRUNCATE bulk",
    "INSERT INTO bulk VALUES (1, 1, 'after the truncate', 0.01)",
    "INSERT INTO sentinel VALUES (1)",
]


# --------------------------------------------------------------------------- records and their comparison


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Difference:
    topic: str
    partition: int | None
    offset: int | None
    part: str  # "key", "value", "headers", "partition", "count", ...
    baseline: str
    current: str

    def __str__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]@{self.offset}"
        return f"{where} {self.part}: baseline {self.baseline} / current {self.current}"


_CLOCK_FIELDS = (b"ts_ms", b"ts_us", b"ts_ns")


def _clock_spans(doc: bytes, envelope_path: tuple[bytes, ...]) -> list[tuple[bytes, int, int]]:
    """Where the numbers of ``ts_ms``/``ts_us``/``ts_ns`` directly in the object at ``envelope_path`` are:
    ``(name, start, end)``. A small scanner of JSON text (strings with escapes, nesting); it finds members of
    that one object only, never the ``source`` block's fields of the same names."""
    spans: list[tuple[bytes, int, int]] = []
    path: list[bytes | None] = []  # the key that led into each open container (None: array element)
    pending_key: bytes | None = None
    last_string: bytes | None = None
    i, n = 0, len(doc)
    while i < n:
        ch = doc[i : i + 1]
        if ch == b'"':
            j = i + 1
            while doc[j : j + 1] != b'"':
                j += 2 if doc[j : j + 1] == b"\\" else 1
            last_string = doc[i + 1 : j]
            i = j + 1
            continue
        if ch == b":":
            pending_key = last_string
            if tuple(path[1:]) == envelope_path and pending_key in _CLOCK_FIELDS:
                j = i + 1
                while doc[j : j + 1] in b"-0123456789":
                    j += 1
                if j > i + 1:
                    spans.append((pending_key, i + 1, j))
        elif ch in b"{[":
            path.append(pending_key)
            pending_key = None
        elif ch in b"}]":
            path.pop()
        elif ch == b",":
            pending_key = None
        i += 1
    return spans


def normalize_json_clock(value: bytes) -> bytes:
    """Zero the envelope's top-level ts_ms/ts_us/ts_ns (of the document, or of its schemas_enable ``payload``);
    a document that is not an envelope (no ``op`` there) is returned as it is."""
    if not value.startswith(b"{"):
        return value
    try:
        doc = json.loads(value)
    except ValueError:
        return value
    if not isinstance(doc, dict):
        return value
    path: tuple[bytes, ...] = (b"payload",) if "schema" in doc and isinstance(doc.get("payload"), dict) else ()
    envelope = doc["payload"] if path else doc
    if "op" not in envelope:
        return value
    out, at = [], 0
    for name, start, end in _clock_spans(value, path):
        if int(value[start:end]) != envelope.get(name.decode()):
            raise ValueError(f"clock field {name!r} found at {start} is not the envelope's own")
        out += [value[at:start], b"0"]
        at = end
    return b"".join(out) + value[at:]


SchemaLookup = Callable[[int], str]


def normalize_avro(data: bytes, schema_text: SchemaLookup) -> bytes:
    """Confluent wire format in; the same bytes out with the envelope's clock fields at 0. The schema id stays:
    both sides register the same subjects, so the same schema has the same id."""
    (schema_id,) = struct.unpack(">I", data[1:5])
    body = data[5:]
    parsed = fastavro.parse_schema(json.loads(schema_text(schema_id)))
    try:
        record = fastavro.schemaless_reader(io.BytesIO(body), parsed, None)
    except (EOFError, ValueError, IndexError, UnicodeDecodeError) as exc:
        return data + f" <avro that does not decode with schema {schema_id}: {exc!r}>".encode()
    again = io.BytesIO()
    fastavro.schemaless_writer(again, parsed, record)
    if again.getvalue() != body:
        return data + b" <avro that does not re-encode to its own bytes>"
    if isinstance(record, dict) and "op" in record and "ts_ms" in record:
        record = {**record, "ts_ms": 0}
        for name in ("ts_us", "ts_ns"):
            if name in record:
                record[name] = 0
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, record)
        body = out.getvalue()
    return data[:5] + body


def normalize(records: Sequence[Record], renames: dict[str, str], schema_text: SchemaLookup | None) -> list[Record]:
    """The records of one side with the legitimate differences taken out (see the module's docstring).
    ``renames``: this side's names (topic prefix, slot) -> the baseline's, each of the same length."""
    for mine, canonical in renames.items():
        if len(mine) != len(canonical):
            raise ValueError(f"{mine!r} and {canonical!r} differ in length (Avro strings carry their length)")
    pairs = [(m.encode(), c.encode()) for m, c in renames.items() if m != c]

    def fix(b: bytes) -> bytes:
        for mine, canonical in pairs:
            b = b.replace(mine, canonical)
        return b

    def part(b: bytes | None) -> bytes | None:
        if b is None:
            return None
        if schema_text is not None and b[:1] == b"\x00" and len(b) >= 5:
            return normalize_avro(fix(b), schema_text)
        return normalize_json_clock(fix(b))

    out = []
    for r in records:
        topic = fix(r.topic.encode()).decode()
        headers = tuple((k, None if v is None else fix(v)) for k, v in r.headers)
        out.append(replace(r, topic=topic, key=part(r.key), value=part(r.value), headers=headers))
    return out


def _show(b: object) -> str:
    text = repr(b)
    return text if len(text) <= 200 else text[:200] + f"... ({len(text)} chars)"


def _first_diff(a: bytes | None, b: bytes | None) -> tuple[str, str]:
    if a is None or b is None:
        return _show(a), _show(b)
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, i - 40)
    return f"byte {i} of {len(a)}: ...{_show(a[lo : i + 40])}", f"byte {i} of {len(b)}: ...{_show(b[lo : i + 40])}"


def compare(baseline: Sequence[Record], current: Sequence[Record]) -> list[Difference]:
    """Every difference between two normalized captures: topics, counts, and per record partition, offset,
    key, value, headers, in order (records are compared in the order each topic was read: by partition, offset)."""
    diffs: list[Difference] = []
    by_topic_a: dict[str, list[Record]] = {}
    by_topic_b: dict[str, list[Record]] = {}
    for r in baseline:
        by_topic_a.setdefault(r.topic, []).append(r)
    for r in current:
        by_topic_b.setdefault(r.topic, []).append(r)
    for topic in sorted(by_topic_a.keys() | by_topic_b.keys()):
        a, b = by_topic_a.get(topic, []), by_topic_b.get(topic, [])
        if len(a) != len(b):
            diffs.append(Difference(topic, None, None, "count", f"{len(a)} records", f"{len(b)} records"))
        for ra, rb in zip(a, b, strict=False):
            for name in ("partition", "offset", "key", "value", "headers"):
                va, vb = getattr(ra, name), getattr(rb, name)
                if va != vb:
                    shown = _first_diff(va, vb) if name in ("key", "value") else (_show(va), _show(vb))
                    diffs.append(Difference(topic, ra.partition, ra.offset, name, *shown))
    return diffs


# --------------------------------------------------------------------------- kafka


_NOT_READY = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)


def _watermarks(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """A topic just created can be listed before its partitions have a leader: ask again until the deadline."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic()))
            return int(low), int(high)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if not isinstance(err, KafkaError) or err.code() not in _NOT_READY or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _as_bytes(b: str | bytes | None) -> bytes | None:
    return b.encode() if isinstance(b, str) else b


def read_topics(bootstrap: str, topics: Sequence[str], timeout: float = 60.0) -> list[Record]:
    """Every record of the topics, from offset 0 to the end as of now (read_committed), by topic, partition, offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"compare-records-{secrets.token_hex(4)}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        metadata = consumer.list_topics(timeout=timeout)
        assignment, pending = [], set()
        for topic in topics:
            for partition in metadata.topics[topic].partitions:
                low, high = _watermarks(consumer, TopicPartition(topic, partition), time.monotonic() + timeout)
                assignment.append(TopicPartition(topic, partition, OFFSET_BEGINNING))
                if high > low:
                    pending.add((topic, partition))
        out: list[Record] = []
        if pending:
            consumer.assign(assignment)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"did not reach the end of {sorted(pending)} in {timeout}s")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                    continue
                raise KafkaException(err)
            if (msg.topic(), msg.partition()) in pending:
                raw_headers = msg.headers() or []
                pairs = list(raw_headers.items()) if isinstance(raw_headers, dict) else list(raw_headers)
                headers = tuple((str(k), _as_bytes(v)) for k, v in pairs)
                t, p, o = msg.topic(), msg.partition(), msg.offset()
                assert t is not None and p is not None and o is not None  # a record, not an event
                out.append(Record(t, p, o, _as_bytes(msg.key()), _as_bytes(msg.value()), headers))
    finally:
        consumer.close()
    out.sort(key=lambda r: (r.topic, r.partition, r.offset))
    return out


def prefix_topics(bootstrap: str, prefix: str) -> list[str]:
    names = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
    return sorted(t for t in names if t == prefix or t.startswith(prefix + ".") or t.endswith("." + prefix))


def delete_topics(bootstrap: str, prefixes: Sequence[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [t for p in prefixes for t in prefix_topics(bootstrap, p)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            try:
                future.result(timeout=60)
            except KafkaException:
                pass  # best effort: the prefixes are random, a leftover bothers no one


class Registry:
    """Schema text by id, from a Confluent-compatible registry (cached: an id never changes its schema)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._cache: dict[int, str] = {}

    def schema_text(self, schema_id: int) -> str:
        if schema_id not in self._cache:
            with urllib.request.urlopen(f"{self.url}/schemas/ids/{schema_id}", timeout=30) as resp:
                self._cache[schema_id] = str(json.loads(resp.read())["schema"])
        return self._cache[schema_id]


# --------------------------------------------------------------------------- trees, database, daemons


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def default_baseline() -> str:
    return git("merge-base", "HEAD", "main")


@contextmanager
def baseline_tree(rev: str) -> Iterator[Path]:
    """The revision checked out in a temporary git worktree, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="cdc-baseline-"))
    path = parent / "tree"
    git("worktree", "add", "--detach", str(path), rev)
    try:
        yield path
    finally:
        git("worktree", "remove", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)


@dataclass
class Side:
    name: str  # "baseline" or "current"
    tree: Path
    prefix: str


class Daemon:
    def __init__(self, side: Side, config: Path, log: Path) -> None:
        self.side, self.log = side, log
        env = {**os.environ, "PYTHONPATH": str(side.tree / "src")}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cdc.cli", "--log-format", "json", "run", "--config", str(config)],
                cwd=side.tree,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.side.name} daemon exited with {self.proc.returncode}:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"{self.side.name} daemon did not stop on SIGTERM:\n{self.tail()}") from None
        if code != 0:
            raise RuntimeError(f"{self.side.name} daemon exited with {code}:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


def prepare_database(admin_dsn: str, dbname: str, slots: Sequence[str], publication: str) -> str:
    """The database with the workload's tables, one publication, and every slot at the same LSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=dbname)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(publication), sql.SQL(", ").join(sql.Identifier(*t.split(".")) for t in TABLES)
        ))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slots[0],))
        for slot in slots[1:]:
            conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (slots[0], slot))
        lsns = {r[0] for r in conn.execute(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = ANY(%s)", (list(slots),)
        )}
        if len(lsns) != 1:
            raise RuntimeError(f"the slots do not start at one LSN: {lsns}")
    return dsn


def run_workload(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for step in WORKLOAD:
            if isinstance(step, str):
                conn.execute(step)
            else:
                with conn.transaction():
                    for statement in step:
                        conn.execute(statement)


def drop_database(admin_dsn: str, dbname: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        for (slot,) in admin.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (dbname,)):
            try:
                admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            except psycopg.errors.ObjectInUse:
                pass  # the DROP DATABASE below (FORCE) ends what still holds it
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def write_config(path: Path, fmt: dict[str, Any], *, dsn: str, slot: str, publication: str, prefix: str,
                 bootstrap: str, registry: str | None) -> Path:
    cfg: dict[str, Any] = {
        "source": {"dsn": dsn, "slot": slot, "publication": publication},
        "tables": [{"name": t, "key": ["id"]} if t == "public.full_ident" else t for t in TABLES],
        "kafka": {"bootstrap_servers": bootstrap, "partitions": 3},
        "topic_prefix": prefix,
        "transaction_metadata": True,
        "snapshot": {"mode": "no_data"},
        "status_interval_s": 1.0,
        "http": {"port": 0, "host": "127.0.0.1"},
        **fmt,
    }
    if fmt.get("format") == "avro":
        if registry is None:
            raise RuntimeError("the avro format needs the dev schema registry, and cdc.dev started none")
        cfg["schema_registry"] = {"url": registry}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def wait_deleted(bootstrap: str, prefix: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while prefix_topics(bootstrap, prefix):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the topics of {prefix} are still listed {timeout}s after their deletion")
        time.sleep(0.5)


def capture_side(
    fmt_name: str, side: Side, slot: str, *, dsn: str, publication: str, bootstrap: str, registry: str | None,
    workdir: Path, timeout: float,
) -> list[Record]:
    """Run one daemon on its slot until the sentinel is published, stop it (SIGTERM: it flushes), read every
    topic of its prefix."""
    cfg = write_config(workdir / f"{fmt_name}-{side.name}.yaml", FORMATS[fmt_name], dsn=dsn, slot=slot,
                       publication=publication, prefix=side.prefix, bootstrap=bootstrap, registry=registry)
    daemon = Daemon(side, cfg, workdir / f"{fmt_name}-{side.name}.log")
    try:
        sentinel = f"{side.prefix}.public.sentinel"
        deadline = time.monotonic() + timeout
        while True:
            daemon.check_alive()
            if sentinel in prefix_topics(bootstrap, side.prefix) and read_topics(bootstrap, [sentinel]):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{side.name}: no sentinel record after {timeout}s:\n{daemon.tail()}")
            time.sleep(0.5)
    finally:
        daemon.stop()
    return read_topics(bootstrap, prefix_topics(bootstrap, side.prefix))


def summary(fmt_name: str, records: Sequence[Record]) -> str:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.topic] = counts.get(r.topic, 0) + 1
    return f"{fmt_name}: {len(records)} records in {len(counts)} topics (" + ", ".join(
        f"{t.split('.', 1)[-1]}={n}" for t, n in sorted(counts.items())
    ) + ")"


Captures = dict[str, dict[str, list[Record]]]  # format -> side ("baseline"/"current") -> its records as read


def run(
    baseline_rev: str, current: Path, formats: Sequence[str], state: Path, timeout: float,
    captures: Captures | None = None,
) -> int:
    """Capture and compare every format; 0 when every record is the same, 1 otherwise. ``captures`` (when given)
    receives each side's records as read, before normalization (a test doctors them)."""
    sys.path.insert(0, str(REPO / "src"))
    from cdc import dev  # noqa: PLC0415 - the dev services of this tree

    endpoints = dev.up(state, registry="avro" in formats)
    run_id = secrets.token_hex(4)
    dbname, publication = f"cmp_{run_id}", f"cmp_{run_id}"
    slots = {f: (f"cmp_{run_id}_{i}_b", f"cmp_{run_id}_{i}_c") for i, f in enumerate(formats)}
    total = 0
    with baseline_tree(baseline_rev) as base_tree, tempfile.TemporaryDirectory(prefix="cdc-compare-") as tmp:
        workdir = Path(tmp)
        print(f"baseline {git('rev-parse', '--short', baseline_rev)} in {base_tree}; current {current}")
        dsn = prepare_database(endpoints.postgres_dsn, dbname, [s for pair in slots.values() for s in pair],
                               publication)
        try:
            run_workload(dsn)
            registry = Registry(endpoints.schema_registry_url) if endpoints.schema_registry_url else None
            for i, fmt_name in enumerate(formats):
                # One prefix for both sides, one after the other: the partition of a record hashes its key bytes,
                # which name the prefix (schemas_enable) or a registry id (avro) - the sides must share both.
                prefix = f"cmp{run_id}{i}"
                sides = [Side("baseline", base_tree, prefix), Side("current", current, prefix)]
                got: dict[str, list[Record]] = {}
                try:
                    for side, slot in zip(sides, slots[fmt_name], strict=True):
                        got[side.name] = capture_side(
                            fmt_name, side, slot, dsn=dsn, publication=publication,
                            bootstrap=endpoints.kafka_bootstrap, registry=endpoints.schema_registry_url,
                            workdir=workdir, timeout=timeout,
                        )
                        delete_topics(endpoints.kafka_bootstrap, [prefix])
                        wait_deleted(endpoints.kafka_bootstrap, prefix)
                finally:
                    delete_topics(endpoints.kafka_bootstrap, [prefix])
                if captures is not None:
                    captures[fmt_name] = got
                lookup = registry.schema_text if registry is not None and fmt_name == "avro" else None
                a = normalize(got["baseline"], {}, lookup)
                b = normalize(got["current"], {slots[fmt_name][1]: slots[fmt_name][0]}, lookup)
                diffs = compare(a, b)
                print(summary(fmt_name, got["baseline"]))
                if not any(r.topic.endswith(".sentinel") for r in a):
                    raise RuntimeError(f"{fmt_name}: the baseline published nothing to compare")
                for d in diffs[:50]:
                    print(f"  DIFF {fmt_name} {d}")
                if len(diffs) > 50:
                    print(f"  ... and {len(diffs) - 50} more differences")
                print(f"{fmt_name}: {'SAME' if not diffs else f'{len(diffs)} DIFFERENCES'}")
                total += len(diffs)
        finally:
            drop_database(endpoints.postgres_dsn, dbname)
    print("every record is the same, byte for byte" if total == 0 else f"{total} differences")
    return 0 if total == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", help="git revision of the baseline (default: merge-base of HEAD and main)")
    p.add_argument("--current", type=Path, default=REPO, help="the tree of the current side (default: this one)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    p.add_argument("--state", type=Path, default=REPO / ".cdc-dev" / "test", help="cdc.dev state folder")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for each format's daemons to publish all")
    args = p.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        p.error(f"unknown format(s) {unknown}; choose among {list(FORMATS)}")
    try:
        return run(args.baseline or default_baseline(), args.current.resolve(), formats, args.state, args.timeout)
    except (RuntimeError, subprocess.CalledProcessError, psycopg.Error, KafkaException, TimeoutError) as exc:
        detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
        print(f"compare_records: the run failed: {exc}\n{detail}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
