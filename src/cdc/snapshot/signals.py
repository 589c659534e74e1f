"""Asking for a snapshot while streaming: a row in the signal table, and ``cdc snapshot TABLE...`` that writes it.

The signal table has Debezium's layout, so tools that write Debezium signals
work unchanged::

    CREATE TABLE public.cdc_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));
    INSERT INTO public.cdc_signal VALUES
        ('any-unique-id', 'execute-snapshot', '{"data-collections": ["public.orders"], "type": "incremental"}');

The daemon reads the table every ``snapshot.signal_poll_s`` and handles each id
once per slot (``cdc.snapshot.reader``); the table needs no publication.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg
from psycopg import sql

from cdc.snapshot.config import SnapshotConfig

__all__ = ["add_cli", "ensure_signal_table", "send_snapshot_signal"]


def ensure_signal_table(conn: psycopg.Connection[Any], signal_table: str) -> None:
    schema, _, name = signal_table.partition(".")
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))"
        ).format(sql.Identifier(schema, name))
    )


def send_snapshot_signal(conn: psycopg.Connection[Any], signal_table: str, tables: Sequence[str]) -> str:
    """Insert an ``execute-snapshot`` signal for these tables (creating the table if needed); returns its id."""
    ensure_signal_table(conn, signal_table)
    schema, _, name = signal_table.partition(".")
    signal_id = uuid.uuid4().hex
    data = orjson.dumps({"data-collections": list(tables), "type": "incremental"}).decode()
    conn.execute(
        sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, 'execute-snapshot', %s)").format(
            sql.Identifier(schema, name)
        ),
        (signal_id, data),
    )
    return signal_id


def snapshot_settings(config: Any) -> SnapshotConfig:
    """The configuration's ``snapshot`` section (its defaults while the tree has none)."""
    section = getattr(config, "snapshot", None)
    return section if isinstance(section, SnapshotConfig) else SnapshotConfig()


def _cmd_snapshot(args: argparse.Namespace) -> int:
    from cdc.config import ConfigError, load_config  # noqa: PLC0415 - the CLI imports lazily

    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    from cdc.selection import selects  # noqa: PLC0415

    captured = sorted(t.selector for t in config.tables)
    names = [t if "." in t else f"public.{t}" for t in args.tables]
    unknown = [t for t in names if not selects(config.tables, t)]
    if unknown:
        print(
            f"not captured by this configuration: {', '.join(unknown)} (captured: {', '.join(captured)}). "
            "Add the table to 'tables' first: a table added there is snapshotted at the next start anyway.",
            file=sys.stderr,
        )
        return 2
    settings = snapshot_settings(config)
    try:
        with psycopg.connect(config.source.conninfo(application_name="cdc-snapshot-signal"), autocommit=True) as conn:
            signal_id = send_snapshot_signal(conn, settings.signal_table, names)
    except psycopg.Error as e:
        print(f"cannot write the snapshot signal into {settings.signal_table}: {str(e).strip()}", file=sys.stderr)
        return 1
    print(f"snapshot requested for {', '.join(names)}: signal {signal_id} in {settings.signal_table}")
    return 0


def add_cli(subparsers: Any) -> None:
    """``cdc snapshot --config FILE TABLE...`` (``subparsers`` from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser("snapshot", help="snapshot tables while the daemon streams (writes a signal row)")
    p.add_argument("--config", "-c", required=True, help="YAML configuration file")
    p.add_argument("tables", nargs="+", help="schema.table names of captured tables")
    p.set_defaults(func=_cmd_snapshot)
