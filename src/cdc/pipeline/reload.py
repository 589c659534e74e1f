"""Tables that change while the daemon runs: SIGHUP reloads and the periodic rescan of table patterns."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import structlog

from cdc.catalog import (
    StartupError,
    apply_publication,
    column_type_oids,
    describe_tables,
    expand_config,
    load_types,
    plan_publication,
    publication_shape,
    table_partitions,
)
from cdc.columns import ColumnPolicy
from cdc.config import Config, ConfigError, TableConfig, load_config
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import PgType, TableInfo
from cdc.pipeline.checks import column_policies
from cdc.pipeline.wiring import Components, log_selection, rendering_of, topic_specs
from cdc.render.codec import TableRenderer
from cdc.sink.kafka import SinkError
from cdc.snapshot.errors import SnapshotRefused

log = structlog.get_logger("cdc.pipeline")


def changed_keys(old: Any, new: Any, path: str = "") -> list[str]:
    """The dotted keys whose values differ between two configurations (as ``model_dump`` gives them)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += changed_keys(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if old == new else [path]


@dataclass(frozen=True, slots=True)
class _Accepted:
    """A reload's tables as the catalog accepted them (the publication already brought to them)."""

    tables: dict[str, TableInfo]
    policies: dict[str, ColumnPolicy]


class Reloader:
    """Acts between transactions: a requested reload first, else a due rescan."""

    def __init__(self, components: Components) -> None:
        self._c = components
        self._config_path: Path | None = None
        self._requested = False
        self._next_rescan = float("inf")
        self._reported: set[str] = set()  # uncaptured tables already adopted or reported
        self._schedule_rescan()

    def request(self, config_path: Path) -> None:
        """SIGHUP: re-read the table list at the next transaction boundary."""
        self._config_path = config_path
        self._requested = True

    def between_transactions(self) -> None:
        decoder = self._c.decoder
        if self._requested:
            self._reload()
        elif decoder.recreated:
            recreated, decoder.recreated = sorted(decoder.recreated), set()
            self.apply_tables(self._c.capture.declared, "recreated", force=True)
            log.info("table_recreated_snapshot", tables=recreated)
        elif decoder.uncaptured.keys() - self._reported:
            self._adopt_or_report()
        elif time.monotonic() >= self._next_rescan:
            self.apply_tables(self._c.capture.declared, "rescan")

    def _adopt_or_report(self) -> None:
        """Tables the publication sends that the configuration did not capture when the daemon started: a
        configured pattern that matches one adopts it at once (topic, publication, snapshot while
        streaming, as on SIGHUP); any other is reported once, with the fix, and its changes stay skipped
        and counted (cdc_uncaptured_changes_total)."""
        decoder = self._c.decoder
        new = sorted(decoder.uncaptured.keys() - self._reported)
        self._reported.update(new)
        if any(t.name is None for t in self._c.capture.declared):
            self.apply_tables(self._c.capture.declared, "adopt")
        publication = self._c.capture.config.source.publication
        for table in new:
            if table in self._c.capture.tables:
                continue
            log.warning(
                "table_uncaptured",
                table=table,
                skipped_changes=decoder.uncaptured[table],
                fix=f"add {table} to 'tables' (or a pattern that matches it) and send SIGHUP, or remove it from "
                f"the publication: ALTER PUBLICATION {publication} DROP TABLE {table};",
            )

    def _reload(self) -> None:
        """Pick up a changed table list (and new tables matching its patterns) without a restart; other
        changes need one."""
        self._requested = False
        assert self._config_path is not None
        try:
            new = load_config(self._config_path)
        except ConfigError as e:
            log.error("reload_rejected", error=str(e))
            return
        capture = self._c.capture
        changed = changed_keys(capture.config.model_dump(exclude={"tables"}), new.model_dump(exclude={"tables"}))
        if changed:
            log.warning(
                "reload_needs_restart",
                keys=changed,
                reason="settings other than 'tables' changed; they apply at restart",
            )
        self.apply_tables(new.tables, "reload")

    def _partitions_changed(self, conn: psycopg.Connection[tuple[object, ...]], candidate: Config) -> bool:
        """Whether a captured partitioned table gained or lost partitions since it was described."""
        for info in self._c.capture.tables.values():
            if info.partitions and table_partitions(conn, info.oid) != info.partitions:
                return True
        return False

    def _schedule_rescan(self) -> None:
        capture = self._c.capture
        interval = capture.config.table_rescan_interval_s
        patterns = any(t.name is None for t in capture.declared)
        partitioned = any(info.partitions for info in capture.tables.values())  # partitions attached, detached
        self._next_rescan = time.monotonic() + interval if interval and (patterns or partitioned) else float("inf")

    def apply_tables(self, declared: list[TableConfig], reason: str, *, force: bool = False) -> None:
        """Capture the tables ``declared`` selects now (patterns expanded against the catalog): new ones get
        their topics, join the publication and are snapshotted while streaming; removed ones stop."""
        c = self._c
        capture = c.capture
        cfg = capture.config
        try:
            conn = psycopg.connect(cfg.source.conninfo(application_name=f"cdc-{reason}"), autocommit=True)
        except psycopg.OperationalError as e:
            log.error("reload_rejected", reason=reason, error="cannot connect to Postgres: " + str(e).strip())
            self._schedule_rescan()
            return
        with conn:
            try:
                candidate, selection = expand_config(conn, cfg.model_copy(update={"tables": declared}))
            except StartupError as e:
                log.error("reload_rejected", reason=reason, error=str(e))
                self._schedule_rescan()
                return
            capture.declared = declared
            self._schedule_rescan()
            if candidate.tables == cfg.tables and not force and not self._partitions_changed(conn, candidate):
                if reason == "reload":
                    log.info("reload_no_table_change")
                return
            log_selection(selection)
            accepted = self._accept(conn, candidate, reason)
            if accepted is None:
                return
            tables = accepted.tables
            oids = column_type_oids(conn, [t.oid for t in (*tables.values(), *capture.outbox_tables.values())])
            types = load_types(conn, [o for o in oids if o not in BUILTIN_TYPES])
            if c.history is not None:  # an added table's types are in the schema history before its first record
                try:
                    c.history.publish_catalog(conn, [t for n, t in tables.items() if n not in capture.tables], types)
                except (SinkError, LookupError) as e:
                    log.error("reload_rejected", reason=reason, error=str(e))
                    return
            old_tables = capture.tables
            self._switch(candidate, accepted, types)
            snapshotted = c.snapshots.tables_changed(tables, types)
            self._follow_partitions(tables, old_tables, snapshotted)
        log.info(
            "reload_tables",
            reason=reason,
            added=sorted(set(tables) - set(old_tables)),
            removed=sorted(set(old_tables) - set(tables)),
            snapshot=snapshotted,
        )

    def _accept(self, conn: psycopg.Connection[tuple[object, ...]], candidate: Config, reason: str) -> _Accepted | None:
        """The candidate's tables described, their policies checked and the publication brought to them; None
        (logged) when the catalog refuses, leaving everything as it was."""
        capture = self._c.capture
        publication_name = candidate.source.publication
        try:
            tables = describe_tables(conn, candidate.tables)
            publication = plan_publication(conn, publication_name, [*tables.keys(), *capture.outbox_tables.keys()])
            policies = column_policies(candidate, tables)
            if publication.current is not None:
                tables = publication_shape(conn, publication_name, tables)
            # Before the capture changes: a publication that could not be changed leaves everything as it
            # was. Nothing is read from the stream until this returns, so no change of an added table
            # arrives before the decoder knows the table.
            apply_publication(conn, publication)
        except StartupError as e:
            log.error("reload_rejected", reason=reason, error=str(e))
            return None
        return _Accepted(tables, policies)

    def _switch(self, candidate: Config, accepted: _Accepted, types: dict[int, PgType]) -> None:
        """The capture, the stages, the topics and the decoder move to the accepted tables."""
        c = self._c
        capture = c.capture
        tables = accepted.tables
        capture.tables = tables
        capture.config = candidate
        # In place: the column-policy stage holds this dict, and an added table's masks must apply at once.
        capture.policies.clear()
        capture.policies.update(accepted.policies)
        c.chain.invalidate()
        c.decoder.set_renderer(
            TableRenderer(rendering_of(candidate, c.serializer, c.chain))
        )  # a table that gained a policy
        c.topics.ensure(topic_specs(candidate, tables, c.serializer, c.router))
        c.decoder.update_tables({**tables, **capture.outbox_tables}, types)

    def _follow_partitions(
        self, tables: dict[str, TableInfo], old_tables: dict[str, TableInfo], snapshotted: list[str]
    ) -> None:
        """Partitions attached to a captured table are snapshotted (their rows never came through the stream);
        detached ones are logged (their rows stay in the topic). ``snapshotted`` gains the tables requested."""
        for name in sorted(set(tables) & set(old_tables)):
            attached = sorted(tables[name].partitions - old_tables[name].partitions)
            detached = sorted(old_tables[name].partitions - tables[name].partitions)
            if detached:
                log.warning(
                    "partition_detached",
                    table=name,
                    partitions=detached,
                    effect="their rows stay in the topic (a detach sends no deletes); request a snapshot of the "
                    "table after truncating its topic if consumers must drop them",
                )
            if attached and name not in snapshotted:
                # An attached partition brings rows the stream never carried (ATTACH sends no inserts).
                log.info("partition_attached", table=name, partitions=attached)
                try:
                    self._c.snapshots.request(name)
                except SnapshotRefused as e:
                    log.error("snapshot_refused", table=name, error=str(e))
                    continue
                snapshotted.append(name)
