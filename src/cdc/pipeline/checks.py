"""The start-up checks, apart from creating anything: the daemon runs them before it creates its topics,
publication and slot, and ``cdc validate`` runs the same ones and stops there, with the same messages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from cdc.catalog import (
    PublicationPlan,
    StartupError,
    TableInfo,
    check_server,
    check_slot_failover,
    describe_outbox_tables,
    describe_tables,
    expand_config,
    plan_publication,
    publication_shape,
)
from cdc.columns import ColumnPolicy, ColumnPolicyError, policies
from cdc.config import Config
from cdc.selection import Selection
from cdc.sink.kafka import SinkError, admin_client, check_reachable
from cdc.sink.registry import RegistryClient
from cdc.snapshot.modes import SlotState, inspect_slot


@dataclass(frozen=True)
class SourceCheck:
    """What the checks found: the expanded configuration and everything the daemon builds on."""

    config: Config  # patterns expanded into tables
    selection: Selection
    tables: dict[str, TableInfo]
    boxes: dict[str, TableInfo]  # outbox tables
    policies: dict[str, ColumnPolicy]
    publication: PublicationPlan
    slot_state: SlotState


def connect_source(config: Config, application_name: str) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(config.source.conninfo(application_name=application_name), autocommit=True)
    except psycopg.OperationalError as e:
        raise StartupError(
            f"cannot connect to Postgres ({config.source.dsn}): {str(e).strip()}. Fix: {connect_fix(str(e))}"
        ) from None


def source_checks(
    conn: psycopg.Connection[tuple[object, ...]], config: Config, *, before_selection: Callable[[], None] = lambda: None
) -> SourceCheck:
    """Server settings and role, failover slot support, the tables (they exist, keys, replica identity,
    partitions, privileges), the column settings, the publication's shape and the slot; StartupError on
    the first kind of problem, naming every instance of it and the fix. Creates nothing.

    ``before_selection`` runs once the server is known good (the daemon takes its instance lock there)."""
    check_server(conn)
    check_slot_failover(conn, config.source.slot_failover)
    before_selection()
    cfg, selection = expand_config(conn, config)
    tables = describe_tables(conn, cfg.tables)
    boxes = describe_outbox_tables(conn, cfg.outbox.tables)
    found = column_policies(cfg, tables)
    publication = plan_publication(conn, cfg.source.publication, [*tables.keys(), *boxes.keys()])
    if publication.current is not None:  # an existing publication may filter rows or columns: snapshots follow
        tables = publication_shape(conn, cfg.source.publication, tables)
    slot_state = inspect_slot(conn, cfg.source.slot)
    return SourceCheck(cfg, selection, tables, boxes, found, publication, slot_state)


def service_problems(cfg: Config) -> list[str]:
    """Kafka (and the schema registry, for Avro) reachable with the configured settings: what is not."""
    problems: list[str] = []
    try:
        check_reachable(admin_client(cfg.kafka.bootstrap_servers, cfg.kafka.producer), cfg.kafka.bootstrap_servers)
    except SinkError as e:
        problems.append(str(e))
    if cfg.format == "avro" and cfg.schema_registry is not None:
        try:
            RegistryClient.from_settings(cfg.schema_registry).check_reachable()
        except Exception as e:
            problems.append(str(e))
    return problems


def column_policies(cfg: Config, tables: dict[str, TableInfo]) -> dict[str, ColumnPolicy]:
    salt = cfg.masking.salt.get_secret_value() if cfg.masking.salt is not None else None
    result = policies(cfg.tables, cfg.masking.fixed_value, salt)
    problems = []
    for name, policy in result.items():
        info = tables[name]
        try:
            policy.check(info.columns)
        except ColumnPolicyError as e:
            problems.append(str(e))
        table = next(t for t in cfg.tables if t.name == name)
        hidden = set(info.key) & (set(table.exclude_columns) | set(table.mask))
        if hidden:
            problems.append(f"tables[{name}]: key columns cannot be excluded or masked: {', '.join(sorted(hidden))}")
    if problems:
        raise StartupError("column settings do not fit the tables:\n  " + "\n  ".join(problems))
    return result


def connect_fix(error: str) -> str:
    if any(word in error for word in ("SSL", "certificate", "sslmode", "server does not support SSL")):
        return (
            "check the TLS settings in source.dsn: sslrootcert must name the CA that signed the server's "
            "certificate (sslmode=verify-full also checks the host name against it), sslcert/sslkey a client "
            "certificate if the server asks for one; and that the server runs with ssl=on."
        )
    return "check source.dsn, the password (CDC_SOURCE__PASSWORD or source.password_file) and pg_hba.conf."
