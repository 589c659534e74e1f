"""Records byte for byte: the daemon of a baseline revision and the daemon of this tree, on the same WAL.

    .venv/bin/python bench/compare_records.py --baseline e687a2a

A temporary git worktree holds the baseline revision. On the dev services (started if needed), one
mixed workload runs on a fresh database after two slots per format were created at the same LSN, so
both daemons read the same WAL: many column types, NULLs, an unchanged TOASTed value in an update, a
delete, a primary-key change, a truncate, a transaction of many rows, logical messages. Each daemon
(its own tree's ``src`` on PYTHONPATH, ``python -m cdc.cli run``) streams that WAL with transaction
metadata on, in JSON, JSON with schemas and Avro (the dev registry), one after the other into the same
topics; the records each wrote are then compared in order, per topic and partition: key, value,
headers. Only processing times differ legitimately, and they are set to 0 on both sides: the envelope's
``ts_ms``, ``ts_us`` and ``ts_ns`` at its top level (when the daemon handled the event), and the source
block's for a logical message outside a transaction (it has no commit time: the daemon's clock). The
snapshot progress topic is keyed by slot, and each daemon has its own: the slot names are replaced
there. Nothing else is normalized.
Avro values are compared as their schema id plus the record read with the registered writer schema.
Exits 1 on any difference, naming topic, partition, offset and what differs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fastavro
import orjson
import psycopg
import yaml
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from cdc import dev

FORMATS = {
    "json": {"format": "json"},
    "json-schemas": {"format": "json", "json": {"schemas_enable": True}},
    "avro": {"format": "avro"},
}
PROCESSING_TIMES = ("ts_ms", "ts_us", "ts_ns")

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE kinds (
    id bigint PRIMARY KEY, i2 smallint, i4 int, f4 real, f8 double precision, n numeric(12,2), nu numeric,
    b boolean, t text, vc varchar(20), ch char(3), by bytea, d date, tm time, tmtz timetz, ts timestamp,
    tstz timestamptz, iv interval, u uuid, j json, jb jsonb, arr int[], tarr text[], m mood, big text,
    inet_col inet, pt point
);
ALTER TABLE kinds ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE pairs (a int, b text, v text, PRIMARY KEY (a, b));
CREATE TABLE wide (id int PRIMARY KEY, payload text);
"""

ROW = (
    "INSERT INTO kinds VALUES (%s, 7, -42, 1.5, -2.25e300, 1234.56, 3.14159265358979, true, 'text é ✓', 'varchar',"
    " 'abc', '\\xdeadbeef', '2024-02-29', '13:45:59.123456', '10:00+02', '2024-05-01 12:00:00.5',"
    " '2024-05-01 12:00:00.123456+00', '1 year 2 mons 3 days 04:05:06.7', '6f1d7c6a-2c3e-4d5a-9b8c-1a2b3c4d5e6f',"
    " '{\"a\": [1, 2]}', '{\"b\": {\"c\": null}}', '{1,NULL,3}', '{\"x y\",z}', 'happy', %s, '10.0.0.1/24', '(1.5,2)')"
)


def workload(dsn: str) -> None:
    big = "toast-" * 4000  # stored out of line: an update that leaves it alone sends it as unchanged
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(1, 6):
            conn.execute(ROW, (i, big if i == 1 else None))
        conn.execute(
            "INSERT INTO kinds (id) VALUES (100)"  # NULL in every other column
        )
        conn.execute(
            "INSERT INTO kinds (id, f4, f8, n, nu, d, ts, tstz) VALUES (101, 'NaN', '-Infinity', -0.5, -1e-20,"
            " 'infinity', '-infinity', 'infinity')"
        )
        conn.execute("UPDATE kinds SET t = 'changed', vc = NULL WHERE id = 1")  # big: unchanged TOAST
        conn.execute("UPDATE kinds SET id = 50 WHERE id = 2")  # a key change
        conn.execute("DELETE FROM kinds WHERE id = 3")
        with conn.transaction():
            for a in range(200):
                conn.execute("INSERT INTO pairs VALUES (%s, %s, %s)", (a, f"k{a % 7}", "v" * (a % 13)))
            conn.execute("SELECT pg_logical_emit_message(true, 'app.audit', 'in a transaction')")
        conn.execute("SELECT pg_logical_emit_message(false, 'app.audit', 'outside')")
        conn.execute("UPDATE pairs SET v = 'updated' WHERE a < 20")
        conn.execute("DELETE FROM pairs WHERE a >= 190")
        conn.execute("INSERT INTO wide SELECT g, repeat('w', g % 50) FROM generate_series(1, 300) g")
        conn.execute("TRUNCATE wide")
        conn.execute("INSERT INTO wide VALUES (1, 'after the truncate')")
        conn.execute("ALTER TABLE pairs ADD COLUMN extra int DEFAULT 5")
        conn.execute("INSERT INTO pairs VALUES (1000, 'new', 'with extra', 9)")


@contextmanager
def baseline_tree(rev: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cdc-baseline-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), rev], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


def run_daemon(tree: Path, config: dict[str, Any], dsn: str, slot: str, end_lsn: str, workdir: Path, name: str) -> None:
    """Stream the slot up to ``end_lsn`` with the daemon of ``tree``, then stop it with SIGTERM (exit 0)."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log_path = workdir / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdc.cli", "--log-format", "json", "run", "--config", str(path)],
            cwd=tree,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"{name}: the daemon exited with {proc.returncode}:\n{log_path.read_text()}")
                with psycopg.connect(dsn, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                        (end_lsn, slot),
                    ).fetchone()
                if row and row[0]:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: the slot did not reach {end_lsn} in 180 s:\n{log_path.read_text()}")
                time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            if proc.wait(60) != 0:
                raise SystemExit(f"{name}: the daemon exited with {proc.returncode}:\n{log_path.read_text()}")
        finally:
            if proc.poll() is None:
                proc.kill()


def end_offsets(bootstrap: str, prefix: str) -> dict[tuple[str, int], int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + ".") or t.endswith("." + prefix)]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cmp-{secrets.token_hex(4)}"})
    out: dict[tuple[str, int], int] = {}
    try:
        meta = consumer.list_topics(timeout=10)
        for topic in topics:
            for partition in meta.topics[topic].partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                out[(topic, partition)] = high
    finally:
        consumer.close()
    return out


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int) -> list[Any]:
    if end <= start:
        return []
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"cmp-{secrets.token_hex(4)}", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while len(out) < end - start:
            msg = consumer.poll(1.0)
            if msg is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{topic}[{partition}]: read {len(out)} of {end - start} records")
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise SystemExit(f"{topic}[{partition}]: {msg.error()}")
            if msg.offset() < end:
                out.append(msg)
        return out
    finally:
        consumer.close()


class Avro:
    """Avro bodies read with the writer schema the registry holds under their id."""

    def __init__(self, url: str) -> None:
        self._url = url.rstrip("/")
        self._schemas: dict[int, Any] = {}

    def read(self, data: bytes) -> tuple[int, Any]:
        if len(data) < 5 or data[0] != 0:
            return -1, data
        schema_id = int.from_bytes(data[1:5], "big")
        schema = self._schemas.get(schema_id)
        if schema is None:
            with urllib.request.urlopen(f"{self._url}/schemas/ids/{schema_id}", timeout=10) as response:
                schema = self._schemas[schema_id] = fastavro.parse_schema(json.loads(json.load(response)["schema"]))
        return schema_id, fastavro.schemaless_reader(io.BytesIO(data[5:]), schema)


def normalized(value: bytes | None, avro: Avro | None) -> Any:
    """The record's value with the envelope's processing times set to 0, as comparable bytes."""
    if value is None:
        return None
    if avro is not None:
        schema_id, record = avro.read(value)
        if isinstance(record, dict):
            _zero_processing_times(record)
        return schema_id, repr(record)
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
    envelope = doc.get("payload", doc) if isinstance(doc, dict) else None
    if isinstance(envelope, dict) and "op" in envelope:
        _zero_processing_times(envelope)
        return orjson.dumps(doc)
    return value


def _zero_processing_times(envelope: dict[str, Any]) -> None:
    for name in PROCESSING_TIMES:
        if name in envelope:
            envelope[name] = 0
    source = envelope.get("source")
    if envelope.get("op") == "m" and isinstance(source, dict) and source.get("txId") is None:
        for name in PROCESSING_TIMES:  # a message outside a transaction: stamped with the daemon's clock
            if name in source:
                source[name] = 0


def compare(
    base: list[Any], new: list[Any], topic: str, partition: int, avro: Avro | None, slots: tuple[str, str]
) -> list[str]:
    problems = []
    if topic.endswith(".__cdc_snapshot"):  # keyed by slot: each daemon has its own
        return _compare_progress(base, new, topic, partition, slots)
    if len(base) != len(new):
        problems.append(f"{topic}[{partition}]: {len(base)} records from the baseline, {len(new)} from this tree")
    for a, b in zip(base, new, strict=False):
        where = f"{topic}[{partition}] baseline offset {a.offset()}, this tree's {b.offset()}"
        key_a = normalized(a.key(), avro) if avro else a.key()
        key_b = normalized(b.key(), avro) if avro else b.key()
        if key_a != key_b:
            problems.append(f"{where}: key {a.key()!r} != {b.key()!r}")
        if normalized(a.value(), avro) != normalized(b.value(), avro):
            problems.append(f"{where}: value\n    {a.value()!r}\n != {b.value()!r}")
        if (a.headers() or []) != (b.headers() or []):
            problems.append(f"{where}: headers {a.headers()!r} != {b.headers()!r}")
        if len(problems) > 20:
            break
    return problems


def _compare_progress(base: list[Any], new: list[Any], topic: str, partition: int, slots: tuple[str, str]) -> list[str]:
    def plain(records: list[Any], slot: str) -> list[tuple[bytes, bytes]]:
        return [
            ((m.key() or b"").replace(slot.encode(), b"<slot>"), (m.value() or b"").replace(slot.encode(), b"<slot>"))
            for m in records
        ]

    if plain(base, slots[0]) != plain(new, slots[1]):
        return [f"{topic}[{partition}]: {plain(base, slots[0])!r} != {plain(new, slots[1])!r}"]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="the revision to compare this tree with")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: " + ", ".join(FORMATS))
    parser.add_argument(
        "--position-headers",
        choices=("on", "default"),
        default="on",
        help="this tree's kafka.position_headers: on (as every revision before the setting wrote them), or its default",
    )
    args = parser.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    services = dev.up(dev.default_state_dir(), registry="avro" in formats)
    database = f"cmp_{secrets.token_hex(4)}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
    dsn = services.postgres_dsn.rsplit("/", 1)[0] + "/" + database
    workdir = Path(tempfile.mkdtemp(prefix="cdc-compare-"))
    slots = {fmt: (f"{database}_{fmt.replace('-', '_')}_a", f"{database}_{fmt.replace('-', '_')}_b") for fmt in formats}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            # Before the slots: pgoutput reads the publication as of each change's WAL position.
            conn.execute(f"CREATE PUBLICATION {database}_pub FOR TABLE kinds, pairs, wide")
            for pair in slots.values():
                for slot in pair:
                    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        workload(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        end_lsn = str(row[0])
        failures = 0
        with baseline_tree(args.baseline) as base_tree:
            for fmt in formats:
                prefix = f"{database}_{fmt.replace('-', '_')}"
                config: dict[str, Any] = {
                    "source": {"dsn": dsn, "publication": f"{database}_pub"},
                    "tables": ["public.kinds", "public.pairs", "public.wide"],
                    "kafka": {"bootstrap_servers": services.kafka_bootstrap, "partitions": 3},
                    "topic_prefix": prefix,
                    "transaction_metadata": True,
                    "snapshot": {"mode": "no_data", "progress_bar": False},
                    "http": {"enabled": False},
                    "status_interval_s": 1.0,
                    **FORMATS[fmt],
                }
                if fmt == "avro":
                    config["schema_registry"] = {"url": services.schema_registry_url}
                first, second = slots[fmt]
                run_daemon(
                    base_tree,
                    {**config, "source": {**config["source"], "slot": first}},
                    dsn,
                    first,
                    end_lsn,
                    workdir,
                    f"{fmt}-baseline",
                )
                middle = end_offsets(services.kafka_bootstrap, prefix)
                # kafka.position_headers (off by default since #21): on for this tree unless told otherwise, so
                # that its records compare with a baseline from before the setting, headers included
                mine = (
                    config
                    if args.position_headers == "default"
                    else {**config, "kafka": {**config["kafka"], "position_headers": True}}
                )
                run_daemon(
                    REPO,
                    {**mine, "source": {**config["source"], "slot": second}},
                    dsn,
                    second,
                    end_lsn,
                    workdir,
                    f"{fmt}-this-tree",
                )
                end = end_offsets(services.kafka_bootstrap, prefix)
                avro = Avro(services.schema_registry_url) if fmt == "avro" and services.schema_registry_url else None
                problems: list[str] = []
                records = 0
                for (topic, partition), stop in sorted(end.items()):
                    mid = middle.get((topic, partition), 0)
                    base = read_range(services.kafka_bootstrap, topic, partition, 0, mid)
                    new = read_range(services.kafka_bootstrap, topic, partition, mid, stop)
                    records += len(base)
                    problems += compare(base, new, topic, partition, avro, slots[fmt])
                verdict = "identical" if not problems else f"{len(problems)} differences"
                print(f"{fmt}: {len(end)} topic partitions, {records} records from each daemon: {verdict}")
                for p in problems[:20]:
                    print("  " + p)
                failures += bool(problems) or records == 0
        return 1 if failures else 0
    finally:
        with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
            for pair in slots.values():
                for slot in pair:
                    admin.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s "
                        "AND NOT active",
                        (slot,),
                    )
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        # the topics too: every invocation writes new ones, and a broker full of dead bench topics costs the
        # next benchmark's measurements CPU (their log cleaner, their metadata)
        kafka = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
        ours = [t for t in kafka.list_topics(timeout=10).topics if t.startswith(f"{database}_")]
        for future in (kafka.delete_topics(ours, operation_timeout=30) if ours else {}).values():
            future.result()


if __name__ == "__main__":
    sys.exit(main())
