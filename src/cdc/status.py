"""``cdc status``: the slot, its lag, the confirmed position and per-table counts, from Postgres and Kafka."""

from __future__ import annotations

from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition

from cdc.catalog import StartupError, expand_config
from cdc.config import Config
from cdc.failover import FailoverWatch
from cdc.failover import read as failover_read
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.kafka import connection_settings, librdkafka_logger


def collect(config: Config) -> dict[str, Any]:
    """Everything ``cdc status`` prints; holds no secret (the DSN never carries the password)."""
    out: dict[str, Any] = {"slot": config.source.slot, "publication": config.source.publication}
    with psycopg.connect(
        config.source.conninfo(application_name="cdc-status"), autocommit=True, connect_timeout=10
    ) as conn:
        row = conn.execute(
            """
            SELECT active, active_pid, confirmed_flush_lsn::text, restart_lsn::text, wal_status,
                   pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
                   pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, safe_wal_size
              FROM pg_replication_slots WHERE slot_name = %s
            """,
            (config.source.slot,),
        ).fetchone()
        if row is None:
            out["slot_exists"] = False
        else:
            out.update(
                slot_exists=True,
                active=row[0],
                active_pid=row[1],
                confirmed_flush_lsn=row[2],
                restart_lsn=row[3],
                wal_status=row[4],
                lag_bytes=row[5],
                retained_wal_bytes=row[6],
                safe_wal_size_bytes=row[7],  # None: no max_slot_wal_keep_size (or the slot is lost)
            )
        naming = JsonSerializer(
            JsonSettings(topic_prefix=config.topic_prefix, database=config.source.database), lambda _: 1
        )
        tables = {}
        try:
            captured = expand_config(conn, config)[0].tables  # patterns as they expand now
        except StartupError as e:
            out["tables_error"] = str(e)
            captured = [t for t in config.tables if t.name is not None]
        for t in captured:
            est = conn.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", (t.qualified,)
            ).fetchone()
            tables[t.qualified] = {
                "topic": naming.topic_name(t.schema_name, t.table_name),
                "exists": est is not None,
                "estimated_rows": est[0] if est else None,
            }
    consumer = Consumer(
        {
            "bootstrap.servers": config.kafka.bootstrap_servers,
            "group.id": "cdc-status",
            **connection_settings(config.kafka.producer),
        },
        logger=librdkafka_logger(),
    )
    try:
        meta = consumer.list_topics(timeout=10)
        for info in tables.values():
            topic = meta.topics.get(info["topic"])
            if topic is None or topic.error is not None:
                info["records"] = None
                continue
            total = 0
            for p in topic.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(str(info["topic"]), p), timeout=10)
                total += high - low
            info["records"] = total
    except KafkaException as e:
        out["kafka_error"] = str(e.args[0].str() if e.args else e)
    finally:
        consumer.close()
    out["tables"] = tables
    if FailoverWatch.wanted(config.source.conninfo()):
        out["hosts"] = [h.as_dict() for h in failover_read(config.source.conninfo(), config.source.slot)]
    return out


def render(status: dict[str, Any]) -> str:
    lines = [f"slot {status['slot']} (publication {status['publication']})"]
    if not status.get("slot_exists"):
        lines.append("  slot: missing (created at the first `cdc run`)")
    else:
        lines.append(f"  active: {status['active']} (pid {status['active_pid']})  wal_status: {status['wal_status']}")
        lines.append(f"  confirmed: {status['confirmed_flush_lsn']}  lag: {status['lag_bytes']} bytes")
        lines.append(f"  retained WAL: {status['retained_wal_bytes']} bytes (restart_lsn {status['restart_lsn']})")
        safe = status.get("safe_wal_size_bytes")
        lines.append(
            "  safe_wal_size: no limit (max_slot_wal_keep_size = -1)"
            if safe is None
            else f"  safe_wal_size: {safe} bytes before the slot may be invalidated (max_slot_wal_keep_size)"
        )
    for h in status.get("hosts", []):
        where = f"{h['host']}:{h['port']}"
        if h["role"] == "standby":
            state = (
                "ready for failover"
                if h["ready"]
                else (
                    "NOT ready: its copy of the slot is temporary (not caught up yet)"
                    if h["synced"] and h["temporary"]
                    else "NOT ready: no synchronized copy of the slot "
                    "(see docs/operations.md, 'Beside a primary with standbys')"
                )
            )
            behind = "" if h["behind_bytes"] is None else f", {h['behind_bytes']} bytes behind"
            lines.append(f"  standby {where}: {state}{behind}")
        elif h["role"] == "primary":
            lines.append(f"  primary {where}")
        else:
            lines.append(f"  host {where}: unreachable ({h['error']})")
    if "kafka_error" in status:
        lines.append(f"  kafka: {status['kafka_error']}")
    if "tables_error" in status:
        lines.append(f"  tables: {status['tables_error']}")
    lines.append("tables:")
    for name, info in status["tables"].items():
        if not info.get("exists", True):
            lines.append(f"  {name:<32} MISSING: no such table in the database (create it, or remove it from 'tables')")
            continue
        records = "no topic yet" if info.get("records") is None else f"records {info['records']}"
        lines.append(f"  {name:<32} topic {info['topic']:<40} {records}  rows ~{info['estimated_rows']}")
    return "\n".join(lines)


def healthy(status: dict[str, Any]) -> bool:
    """``cdc status`` exits 1 unless this holds: every configured table exists and could be listed, and
    Kafka answered."""
    tables_ok = all(info.get("exists", True) for info in status["tables"].values())
    return tables_ok and "tables_error" not in status and "kafka_error" not in status
