"""The application side: publish an event inside the caller's own database transaction.

    with psycopg.connect(dsn) as conn:          # a transaction is open until the block ends
        conn.execute("INSERT INTO orders ...")
        publish(conn, "order", "42", "OrderPlaced", {"total": "9.90"})
    # committed together: the order and its event, or neither

``publish`` never commits and never opens a transaction of its own: it runs one statement on
the caller's connection, so the event is committed with the caller's changes or rolled back
with them. That is the outbox's whole point (no dual write to Kafka).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from cdc.outbox.config import OutboxColumns

DEFAULT_TABLE = "public.outbox"
DEFAULT_PREFIX = "cdc.outbox"

_DEFAULT_COLUMNS = OutboxColumns()


class PublishError(ValueError):
    """``publish`` was called in a way that would not be atomic with the caller's transaction."""


def insert_statement(
    table: str, columns: OutboxColumns = _DEFAULT_COLUMNS, extra_columns: tuple[str, ...] = ()
) -> sql.Composed:
    """``INSERT INTO "schema"."table" (id, aggregatetype, aggregateid, type, payload, extras...) VALUES (%s, ...)``."""
    schema, _, name = table.partition(".") if "." in table else ("public", "", table)
    names = [columns.id, columns.aggregate_type, columns.aggregate_id, columns.type, columns.payload, *extra_columns]
    return sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(schema, name),
        sql.SQL(", ").join(sql.Identifier(n) for n in names),
        sql.SQL(", ").join(sql.Placeholder() for _ in names),
    )


MESSAGE_STATEMENT = sql.SQL("SELECT pg_logical_emit_message(true, %s, %s::text)")


def message_content(
    event_id: str, aggregate_type: str, aggregate_id: str, event_type: str, payload: Any, headers: Mapping[str, str]
) -> str:
    """The JSON object the table-less route reads (``cdc.outbox.route.OutboxRouter.from_message``)."""
    body: dict[str, Any] = {
        "id": event_id,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "type": event_type,
        "payload": payload,
    }
    if headers:
        body["headers"] = dict(headers)
    return json.dumps(body, separators=(",", ":"), default=str)


def publish(
    conn: psycopg.Connection[Any],
    aggregate_type: str,
    aggregate_id: str | int,
    event_type: str,
    payload: Any,
    *,
    table: str = DEFAULT_TABLE,
    columns: OutboxColumns = _DEFAULT_COLUMNS,
    headers: Mapping[str, Any] | None = None,
    via: Literal["table", "message"] = "table",
    prefix: str = DEFAULT_PREFIX,
    event_id: uuid.UUID | str | None = None,
) -> str:
    """Write one outbox event in the caller's open transaction; return its id.

    ``payload`` is serialized to JSON (``json.dumps``; non-JSON values such as Decimal or
    datetime as their text). ``via="table"`` inserts a row into ``table`` (its column names from
    ``columns``; ``headers`` maps further columns of the table to their values, which the
    daemon publishes as configured in ``outbox.tables[].extra``). ``via="message"`` emits a
    transactional logical message with ``prefix`` (the daemon's ``outbox.message_prefix``);
    ``headers`` become string headers of the record.

    The connection must be inside a transaction (the default: psycopg opens one at the first
    statement) and is left inside it: nothing is committed here. An autocommit connection
    outside ``conn.transaction()`` is refused, since the event would commit alone.
    """
    if not aggregate_type or aggregate_id is None or aggregate_id == "" or not event_type:
        raise PublishError("aggregate_type, aggregate_id and event_type must be non-empty")
    if conn.autocommit and conn.info.transaction_status != TransactionStatus.INTRANS:
        raise PublishError(
            "the connection is in autocommit mode outside a transaction, so the event would commit alone, "
            "apart from your changes; call publish inside 'with conn.transaction():' or without autocommit"
        )
    ident = str(event_id) if event_id is not None else str(uuid.uuid4())
    body = json.dumps(payload, separators=(",", ":"), default=str)
    extra = dict(headers or {})
    if via == "table":
        statement = insert_statement(table, columns, tuple(extra))
        conn.execute(statement, (ident, aggregate_type, str(aggregate_id), event_type, body, *extra.values()))
    elif via == "message":
        content = message_content(
            ident, aggregate_type, str(aggregate_id), event_type, payload, {k: str(v) for k, v in extra.items()}
        )
        conn.execute(MESSAGE_STATEMENT, (prefix, content))
    else:
        raise PublishError(f"via must be 'table' or 'message', not {via!r}")
    return ident
