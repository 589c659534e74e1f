"""Flink's debezium-json format over the daemon's topics: what a Flink user gets on a TRUNCATE (make flink-compat).

Two tables, REPLICA IDENTITY FULL (Flink needs ``before``), the daemon with the schema block and decimals
as strings: ``kept`` with ``truncate: skip``, ``marked`` with truncate markers (the default). Each table
gets a snapshot, updates, a delete, a TRUNCATE and rows after it; then a PyFlink job (apache-flink 2.2.1,
flink-sql-connector-kafka 5.0.0-2.2) reads each topic with ``'format' = 'debezium-json'``:

* ``kept``: the job runs and ends with the source rows plus the rows the TRUNCATE removed (Flink's
  changelog has no "every row is gone"; Debezium's own topics, which skip truncates by default, give
  the same);
* ``marked``: the job fails at the first marker (``Unknown "op" value "t"``), which is why a table a Flink
  job reads should be set to ``truncate: skip``.

Exit status 0 when both happen as described, 1 otherwise. Usage:
``.venv/bin/python scripts/flink_compat.py --flink-python .venv-flink/bin/python``
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import structlog
import yaml
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from cdc import dev
from cdc.dev.flink import kafka_connector_jar

log = structlog.get_logger("flink_compat")
ROOT = Path(__file__).resolve().parents[1]


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"flink-compat-{secrets.token_hex(3)}"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(high)
    except KafkaException:  # not created yet
        return 0
    finally:
        consumer.close()


def _wait_quiet(bootstrap: str, topics: list[str], seconds: float = 4.0, timeout: float = 90.0) -> None:
    """Until the topics' end offsets have not moved for ``seconds`` (the daemon has delivered everything)."""
    deadline = time.monotonic() + timeout
    last: list[int] = []
    since = time.monotonic()
    while time.monotonic() < deadline:
        now = [_end_offset(bootstrap, t) for t in topics]
        if now != last:
            last, since = now, time.monotonic()
        elif all(now) and time.monotonic() - since >= seconds:
            return
        time.sleep(0.5)
    raise SystemExit(f"the topics {topics} did not settle within {timeout:.0f}s (end offsets {last})")


def _rows(conn: psycopg.Connection[Any], table: str) -> list[dict[str, Any]]:
    cur = conn.execute(
        sql.SQL("SELECT id, name, price::text AS price, qty FROM {} ORDER BY id").format(sql.Identifier(table))
    )
    return [dict(zip([d.name for d in cur.description or []], r, strict=True)) for r in cur.fetchall()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flink-python", required=True, help="a Python with apache-flink 2.2.1 installed")
    args = parser.parse_args()
    endpoints = dev.up(dev.default_state_dir(), registry=False)
    jar = kafka_connector_jar(log)
    suffix = secrets.token_hex(3)
    dbname, prefix = f"flink_compat_{suffix}", f"flink_{suffix}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    dsn = psycopg.conninfo.make_conninfo(endpoints.postgres_dsn, dbname=dbname)
    work = Path(tempfile.mkdtemp(prefix="flink-compat-"))
    daemon: subprocess.Popen[bytes] | None = None
    ok = True
    try:
        expected_kept: dict[int, dict[str, Any]] = {}
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("kept", "marked"):
                conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text, price numeric(12,2), qty int)")
                conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
                for i in range(1, 6):
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s)", (i, f"n{i}", Decimal(f"{i}.50"), i))
        config = {
            "source": {"dsn": dsn, "slot": f"slot_{suffix}", "publication": f"pub_{suffix}"},
            "tables": [{"name": "public.kept", "truncate": "skip"}, "public.marked"],
            "kafka": {"bootstrap_servers": endpoints.kafka_bootstrap},
            "topic_prefix": prefix,
            "json": {"schemas_enable": True, "decimal_handling": "string"},
            "http": {"port": 0, "host": "127.0.0.1"},
            "status_interval_s": 1.0,
        }
        (work / "cdc.yaml").write_text(yaml.safe_dump(config))
        with (work / "cdc.log").open("ab") as out:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "cdc.cli", "run", "--config", str(work / "cdc.yaml")],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        topics = [f"{prefix}.public.kept", f"{prefix}.public.marked"]
        _wait_quiet(endpoints.kafka_bootstrap, topics)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("kept", "marked"):
                conn.execute(f"UPDATE {table} SET name = NULL, qty = qty * 10 WHERE id = 2")
                conn.execute(f"DELETE FROM {table} WHERE id = 3")
            expected_kept = {r["id"]: r for r in _rows(conn, "kept")}  # what the TRUNCATE removes, Flink keeps
            for table in ("kept", "marked"):
                conn.execute(f"TRUNCATE {table}")
                conn.execute(f"INSERT INTO {table} VALUES (10, 'after', 9.99, 1), (11, 'after', 0.01, 2)")
            conn.execute("UPDATE kept SET qty = 3 WHERE id = 11")
            expected_kept.update({r["id"]: r for r in _rows(conn, "kept")})
        _wait_quiet(endpoints.kafka_bootstrap, topics)
        for topic in topics:
            started = time.monotonic()
            job = subprocess.run(
                [
                    args.flink_python,
                    str(ROOT / "scripts" / "flink_debezium_job.py"),
                    endpoints.kafka_bootstrap,
                    topic,
                    str(jar),
                ],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            seconds = round(time.monotonic() - started, 1)
            if topic.endswith(".kept"):
                got = {r["id"]: r for r in map(json.loads, job.stdout.splitlines())} if job.returncode == 0 else None
                want = {
                    k: {**v, "price": str(v["price"]) if v["price"] is not None else None}
                    for k, v in expected_kept.items()
                }
                same = got == want
                ok &= same
                print(
                    f"kept (truncate: skip): job exit {job.returncode} in {seconds}s; rows {len(got or {})}, "
                    f"expected {len(want)} (source rows plus the truncated ones): {'equal' if same else 'DIFFERENT'}"
                )
                if not same:
                    print(f"  got {got}\n  want {want}\n  stderr: {job.stderr[-3000:]}")
            else:
                failed = job.returncode != 0 and 'Unknown "op" value "t"' in job.stderr
                ok &= failed
                print(
                    f"marked (truncate markers): job exit {job.returncode} in {seconds}s; "
                    f"{'fails at the marker as expected' if failed else 'UNEXPECTED'}"
                )
                if not failed:
                    print(f"  stdout: {job.stdout[-2000:]}\n  stderr: {job.stderr[-3000:]}")
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(60)
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
            for (slot,) in admin.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (dbname,)
            ).fetchall():
                admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        admin_client = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
        names = [t for t in admin_client.list_topics(timeout=30).topics if t.startswith(prefix + ".")]
        if names:
            for future in admin_client.delete_topics(names, operation_timeout=30).values():
                future.result(timeout=60)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
