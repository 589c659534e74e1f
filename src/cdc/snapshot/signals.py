"""Asking for a snapshot while streaming: a row in the signal table, and ``cdc snapshot TABLE...`` that writes it.

The signal table has Debezium's layout, so tools that write Debezium signals
work unchanged::

    CREATE TABLE public.cdc_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));
    INSERT INTO public.cdc_signal VALUES
        ('any-unique-id', 'execute-snapshot', '{"data-collections": ["public.orders"], "type": "incremental"}');

The daemon reads the table every ``snapshot.signal_poll_s`` and handles each id
once per slot (``cdc.snapshot.reader``); the table needs no publication. A signal may
name the connector it is for (``"connector": "<slot>"`` in its data, as ``cdc snapshot``
writes it): another connector's daemon leaves it alone. Rows already in the table when a
daemon creates its slot are not for it (they are older than its snapshot) and are ignored.
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

__all__ = ["SignalTableError", "add_cli", "ensure_signal_table", "send_snapshot_signal", "signal_table_statements"]

LAYOUT = "(id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))"


class SignalTableError(Exception):
    """The signal table is missing and this role may not create it: the message holds the owner's statements."""


def signal_table_statements(signal_table: str, role: str) -> str:
    """What a role that may create tables runs once, so that ``role`` can request snapshots."""
    return f"CREATE TABLE {signal_table} {LAYOUT}; GRANT SELECT, INSERT ON {signal_table} TO {role};"


def ensure_signal_table(conn: psycopg.Connection[Any], signal_table: str) -> None:
    """Create the signal table when it is missing (only then: creating needs CREATE on the schema, which the
    least-privilege role has not); SignalTableError with the owner's statements when this role may not."""
    schema, _, name = signal_table.partition(".")
    ident = sql.Identifier(schema, name)
    row = conn.execute("SELECT to_regclass(%s)", (ident.as_string(conn),)).fetchone()
    if row is not None and row[0] is not None:
        return
    try:
        conn.execute(sql.SQL("CREATE TABLE {} " + LAYOUT).format(ident))
    except psycopg.errors.InsufficientPrivilege as e:
        raise SignalTableError(
            f"the signal table {signal_table} does not exist and role {conn.info.user} may not create it "
            f"({e.diag.message_primary}). Fix, as the schema's owner: "
            f"{signal_table_statements(signal_table, conn.info.user)}"
        ) from None


def send_snapshot_signal(
    conn: psycopg.Connection[Any], signal_table: str, tables: Sequence[str], *, connector: str | None = None
) -> str:
    """Insert an ``execute-snapshot`` signal for these tables (creating the table if it is missing and this
    role may); ``connector``: the slot of the only connector that acts on it. Returns its id."""
    ensure_signal_table(conn, signal_table)
    schema, _, name = signal_table.partition(".")
    signal_id = uuid.uuid4().hex
    body: dict[str, Any] = {"data-collections": list(tables), "type": "incremental"}
    if connector is not None:
        body["connector"] = connector
    data = orjson.dumps(body).decode()
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
    from cdc.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    from cdc.selection import selects

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
            signal_id = send_snapshot_signal(conn, settings.signal_table, names, connector=config.source.slot)
    except SignalTableError as e:
        print(str(e), file=sys.stderr)
        return 1
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
