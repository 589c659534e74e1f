"""Wiring: every start-up check, then the components the loop runs with, built once.

``wire`` does the start-up in this order: connect and check the server, take the
instance lock, expand the table selection and describe the tables, plan the
publication, look at the slot, check Kafka, create the topics, apply the
publication, then let the snapshot service drop, create (with an exported
snapshot) and copy as ``snapshot.mode`` says. What it returns is a frozen
``Components``: the loop (``cdc.pipeline.loop``) only runs them.

What a reload may change lives in ``Capture`` (the tables, their policies, the
expanded configuration, the topics' partition counts); the components read it
there, the reloader (``cdc.pipeline.reload``) writes it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import structlog

from cdc.catalog import (
    TableInfo,
    apply_publication,
    column_type_oids,
    load_types,
)
from cdc.columns import ColumnPolicy
from cdc.compiled import log_choice
from cdc.config import Config, TableConfig
from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.spool import Spool
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import ChangeEvent, PgType, TableSchema
from cdc.instance import InstanceLock
from cdc.observe import Stats
from cdc.outbox.route import OutboxRouter
from cdc.pipeline.checks import connect_source, source_checks
from cdc.pipeline.history import SchemaHistory, SchemaHistoryStage, acknowledged_writer
from cdc.pipeline.routing import OutboxStage, StandaloneMessages
from cdc.pipeline.stages import (
    Chain,
    ColumnPolicyStage,
    Deliver,
    MessageFilter,
    SnapshotStage,
    Stage,
    TransactionMetadataStage,
    emitted_prefix,
)
from cdc.pipeline.toast import (
    SourceReader,
    ToastCounts,
    ToastExposure,
    ToastFill,
    toast_exposure,
    toast_mode,
)
from cdc.render.codec import TableRenderer
from cdc.replication import ReplicationStream
from cdc.schema_history import topic_for as schema_history_topic
from cdc.selection import Selection, entry_for
from cdc.sink.avro import AvroSerializer
from cdc.sink.delivery import AtLeastOnce, DeadLetters, Delivery
from cdc.sink.exactly_once import ExactlyOnce, read_position
from cdc.sink.json import JsonSerializer
from cdc.sink.kafka import TopicSpec, admin_client, check_reachable, ensure_topics, producer_config
from cdc.sink.metadata import TransactionMetadata, heartbeat_topic, transaction_topic
from cdc.sink.records import EventSerializer
from cdc.sink.registry import RegistryClient
from cdc.sink.rendering import RowRendering
from cdc.sink.settings import AvroSettings, JsonSettings
from cdc.snapshot.modes import StartupPlan
from cdc.snapshot.output import ConfiguredOutput
from cdc.snapshot.plan import session_setup
from cdc.snapshot.service import Snapshots
from cdc.snapshot.state import KafkaStore, topics_holding_records

log = structlog.get_logger("cdc.pipeline")


@dataclass
class Capture:
    """What is captured right now; a reload replaces the tables and the configuration, and changes
    ``policies`` and ``partitions`` in place (the stages hold those very dicts)."""

    config: Config  # table patterns expanded
    declared: list[TableConfig]  # as configured, patterns included
    tables: dict[str, TableInfo]
    outbox_tables: dict[str, TableInfo]  # in the publication and the decoder, not the snapshot
    policies: dict[str, ColumnPolicy]
    partitions: dict[str, int]  # topic -> partitions, of every topic the daemon made sure of


@dataclass(frozen=True)
class Components:
    """Everything the loop runs with, built by ``wire``."""

    capture: Capture
    transport: Callable[[], ReplicationStream]  # a new replication connection per session
    decoder: ChangeDecoder
    serializer: EventSerializer[Any]
    delivery: Delivery
    snapshots: Snapshots
    snapshot_plan: StartupPlan
    chain: Chain
    topics: Topics
    router: OutboxRouter | None
    toast: ToastFill  # holds and fills unchanged TOASTed values before the loop dispatches them
    history: SchemaHistory | None = None  # the schema history topic's versions (None: not published)


class Topics:
    """Creates topics the daemon meets after start-up (an outbox's new aggregate type, a new table)."""

    def __init__(self, capture: Capture) -> None:
        self._capture = capture
        self._admin: Any = None

    def exists(self, topic: str) -> bool:
        return topic in self._capture.partitions

    def ensure(self, specs: list[TopicSpec]) -> None:
        cfg = self._capture.config
        if self._admin is None:
            self._admin = admin_client(cfg.kafka.bootstrap_servers, cfg.kafka.producer)
        self._capture.partitions.update(ensure_topics(self._admin, specs))

    def create_outbox_topic(self, topic: str) -> None:
        """The first event of a new aggregate type: its topic exists before its record is produced."""
        self.ensure([outbox_topic_spec(self._capture.config, topic)])
        log.info("outbox_topic_ready", topic=topic)


def wire(
    config: Config,
    stats: Stats,
    lock: InstanceLock,
    should_stop: Callable[[], bool],
    on_snapshots: Callable[[Snapshots], None] = lambda snapshots: None,
) -> Components:
    """Every check first, then create what is missing: topics, publication, slot; then the components.

    ``on_snapshots`` gets the snapshot service as soon as it exists, before it copies anything: what it
    did is there to see even when the copy fails."""
    conn = connect_source(config, "cdc-setup")
    declared = config.tables
    with conn:
        checked = source_checks(conn, config, before_selection=lock.acquire)
        cfg, tables, boxes = checked.config, checked.tables, checked.boxes
        log_selection(checked.selection)
        stats.phase_done("source_checks")
        capture = Capture(cfg, declared, tables, boxes, {}, {})
        capture.policies.update(checked.policies)
        oids = column_type_oids(conn, [t.oid for t in (*tables.values(), *boxes.values())])
        types = load_types(conn, [o for o in oids if o not in BUILTIN_TYPES])

        admin = admin_client(cfg.kafka.bootstrap_servers, cfg.kafka.producer)
        check_reachable(admin, cfg.kafka.bootstrap_servers)
        serializer = make_serializer(cfg, capture.partitions.__getitem__)
        router = make_router(cfg)
        progress_topic = cfg.snapshot.progress_topic_for(cfg.topic_prefix)
        specs = [
            *topic_specs(cfg, tables, serializer, router),
            TopicSpec(progress_topic, 1, cfg.kafka.replication_factor),
        ]
        capture.partitions.update(ensure_topics(admin, specs))
        stats.phase_done("kafka_topics")
        history = _publish_history(conn, cfg, [*tables.values(), *boxes.values()], types)
        apply_publication(conn, checked.publication)
        exposures = toast_exposure(conn, tables, lambda name: toast_mode(capture.config, name))
    stats.phase_done("schema_history")
    _log_toast_exposures(exposures)
    topics = Topics(capture)
    snapshots = make_snapshots(capture, serializer, types, progress_topic, stats, should_stop, history)
    stats.snapshot_progress = snapshots.progress
    on_snapshots(snapshots)
    # Drops, creates (with an exported snapshot) and copies as snapshot.mode says; resumes what was cut off.
    plan = snapshots.prepare(checked.slot_state)
    stats.phase_done("slot_and_snapshot")
    spool = _spool(cfg)
    delivery = make_delivery(cfg, stats)
    chain = make_chain(capture, serializer, delivery, snapshots, router, topics, stats, history)
    decoder = ChangeDecoder(
        {**tables, **boxes},
        types,
        spool=spool,
        renderer=TableRenderer(rendering_of(cfg, serializer, chain)),
        announce_relations=True,  # the schema history stage publishes the types they announce
    )
    log_choice(log)  # what cdc.compiled chose for each compiled extension: compiled, or the reference
    transport = _transport(cfg, delivery)
    toast = make_toast_fill(capture, stats)
    log.info(
        "ready",
        tables=sorted(tables),
        slot=cfg.source.slot,
        topics=sorted(capture.partitions),
        delivery=cfg.delivery.mode,
        outbox_tables=sorted(boxes),
        outbox_message_prefix=cfg.outbox.message_prefix,
    )
    return Components(
        capture, transport, decoder, serializer, delivery, snapshots, plan, chain, topics, router, toast, history
    )


def _publish_history(
    conn: psycopg.Connection[tuple[object, ...]], cfg: Config, tables: list[TableInfo], types: dict[int, PgType]
) -> SchemaHistory:
    """The schema history topic's versions, with every table's column types in it before any of its records."""
    history = SchemaHistory.load(
        cfg.topic_prefix,
        cfg.kafka.bootstrap_servers,
        cfg.kafka.producer,
        write_now=acknowledged_writer(history_producer_config(cfg)),
    )
    history.publish_catalog(conn, tables, types)
    return history


def _log_toast_exposures(exposures: Iterable[ToastExposure]) -> None:
    for exposure in exposures:
        log.info(
            "toast_unchanged_values",
            table=exposure.table,
            mode=exposure.mode,
            columns=list(exposure.columns),
            note=exposure.describe(),
        )


def _spool(cfg: Config) -> Spool | None:
    """Where streamed transactions wait for their commit (decoder.streaming); a new spool clears the old files."""
    if not cfg.decoder.streaming:
        return None
    spool_root = cfg.decoder.spool_dir or Path(tempfile.gettempdir()) / "cdc-spool"
    return Spool(spool_root / cfg.source.slot)


def _transport(cfg: Config, delivery: Delivery) -> Callable[[], ReplicationStream]:
    """A new replication connection per session."""

    def transport() -> ReplicationStream:
        return ReplicationStream(
            cfg.source.conninfo(),
            status_interval=cfg.status_interval_s,
            on_keepalive=delivery.position,
            slot_failover=cfg.source.slot_failover,
        )

    return transport


def make_toast_fill(capture: Capture, stats: Stats) -> ToastFill:
    cfg = capture.config
    counts = ToastCounts(stats.toast_filled, stats.toast_unresolved, stats.toast_fill_queries, stats.toast_fill_seconds)
    return ToastFill(
        SourceReader(cfg.source.conninfo(), session_setup),
        lambda table: toast_mode(capture.config, table.qualified) == "fill",
        cfg.toast.fill_batch,
        counts,
    )


def make_chain(
    capture: Capture,
    serializer: EventSerializer[Any],
    delivery: Delivery,
    snapshots: Snapshots,
    router: OutboxRouter | None,
    topics: Topics,
    stats: Stats,
    history: SchemaHistory | None = None,
) -> Chain:
    """The stages in the order an event meets them: the schema history takes the decoder's Relation
    announcements (it sees no rows), the outbox takes its rows and messages first (an
    outbox row reaches the rest only with produce_change_topic), the snapshot coordinator sees every
    event in commit order, messages outside transactions go out on their own, column policies shape what
    is left, and transaction metadata counts it."""
    cfg = capture.config
    deliver = Deliver(serializer, delivery, stats)
    history_stage = SchemaHistoryStage(history, delivery) if history is not None else None
    outbox = (
        OutboxStage(router, delivery, cfg, stats, topics.exists, topics.create_outbox_topic)
        if router is not None
        else None
    )

    def send_rows(rows: list[ChangeEvent]) -> None:
        """Snapshot rows the coordinator released at a high watermark: same policies, serializer, delivery.
        Their columns were read from the catalog at the chunk's read: in the schema history first."""
        announced: TableSchema | None = None
        for row in rows:
            if history_stage is not None and row.table is not announced:
                announced = row.table
                history_stage.observe(
                    announced, (int(row.commit_lsn), row.ordinal), 0
                )  # the watermark's commit has no other rows
            table = row.table.qualified
            policy = capture.policies.get(table)
            deliver.row(policy.apply(row) if policy is not None else row, table)
            stats.snapshot_rows[table] += 1

    stages: list[Stage] = []
    if history_stage is not None:
        stages.append(history_stage)
    if outbox is not None:
        stages.append(outbox)
    stages.append(SnapshotStage(snapshots, send_rows, delivery))
    own = [p for p in (emitted_prefix(cfg.heartbeat.action_query),) if p is not None]
    outbox_prefix = cfg.outbox.message_prefix if router is not None else None
    stages.append(MessageFilter(cfg.messages.include, cfg.messages.exclude, own, outbox_prefix, stats))
    stages.append(StandaloneMessages(delivery, deliver, stats, outbox))
    stages.append(ColumnPolicyStage(capture.policies))
    if cfg.transaction_metadata:
        stages.append(TransactionMetadataStage(TransactionMetadata(cfg.topic_prefix, serializer), delivery))
    return Chain(stages, deliver)


def rendering_of(
    cfg: Config, serializer: EventSerializer[Any], chain: Chain
) -> Callable[[TableSchema], RowRendering | None]:
    """Asked by the decoder per Relation message: whether it may write the table's rows straight in the
    sink format (JSON text, Avro binary). Only where no stage of the chain reads them column by column."""

    def rendering(table: TableSchema) -> RowRendering | None:
        if not cfg.decoder.render_rows or chain.typed_rows(table.qualified):
            return None
        return serializer.row_rendering(table)

    return rendering


def make_snapshots(
    capture: Capture,
    serializer: EventSerializer[Any],
    types: dict[int, Any],
    progress_topic: str,
    stats: Stats,
    should_stop: Callable[[], bool],
    history: SchemaHistory | None = None,
) -> Snapshots:
    cfg = capture.config
    topic_of = {name: serializer.topic_name(t.schema, t.name) for name, t in capture.tables.items()}

    def holding(names: Any) -> set[str]:
        full = topics_holding_records(cfg.kafka.bootstrap_servers, cfg.kafka.producer, [topic_of[n] for n in names])
        return {n for n in names if topic_of[n] in full}

    def alive() -> None:
        stats.heartbeat = time.monotonic()  # a long initial snapshot is not a hung daemon

    return Snapshots(
        cfg.snapshot,
        conninfo=cfg.source.conninfo(),
        slot=cfg.source.slot,
        slot_failover=cfg.source.slot_failover,
        tables=capture.tables,
        output=ConfiguredOutput(
            cfg,
            dict(capture.partitions),
            make_serializer,
            progress_topic if cfg.delivery.mode == "exactly_once" else None,
        ),
        store=KafkaStore(cfg.kafka.bootstrap_servers, progress_topic, cfg.source.slot, extra=cfg.kafka.producer),
        types=types,
        topics_holding_records=holding,
        should_stop=should_stop,
        alive=alive,
        in_transactions=cfg.delivery.mode == "exactly_once",
        described=history.publish_snapshot if history is not None else None,
    )


def make_serializer(cfg: Config, partitions_of: Callable[[str], int]) -> EventSerializer[Any]:
    """The configured format's serializer (module-level: snapshot workers build theirs with it)."""
    serializer = _format_serializer(cfg, partitions_of)
    serializer.position_headers = cfg.kafka.position_headers
    entries = tuple(cfg.tables)

    def skip_truncate(table: TableSchema) -> bool:
        entry = entry_for(entries, table.schema, table.name)
        return entry is not None and entry.truncate == "skip"

    if any(e.truncate == "skip" for e in entries):
        serializer.skip_truncate = skip_truncate
    return serializer


def _format_serializer(cfg: Config, partitions_of: Callable[[str], int]) -> EventSerializer[Any]:
    # the format's own section, with what the serializer takes from the rest of the configuration
    context = {
        "topic_prefix": cfg.topic_prefix,
        "database": cfg.source.database,
        "unavailable_value": cfg.toast.placeholder,
    }
    if cfg.format == "avro":
        assert cfg.schema_registry is not None  # the configuration model requires it
        registry = RegistryClient.from_settings(cfg.schema_registry)
        registry.check_reachable()
        return AvroSerializer(AvroSettings.of(cfg.avro_format, **context), partitions_of, registry)
    return JsonSerializer(JsonSettings.of(cfg.json_format, **context), partitions_of)


def make_router(cfg: Config) -> OutboxRouter | None:
    if not cfg.outbox.enabled:
        return None
    registry = None
    if cfg.format == "avro":
        assert cfg.schema_registry is not None
        registry = RegistryClient.from_settings(cfg.schema_registry)
    return OutboxRouter(cfg.outbox, cfg.topic_prefix, registry=registry)


def history_producer_config(cfg: Config) -> dict[str, Any]:
    """The producer settings the schema history's start-up versions are written with (not transactional)."""
    return producer_config(cfg.kafka.bootstrap_servers, cfg.kafka.producer, cfg.limits.max_record_bytes)


def make_delivery(cfg: Config, stats: Stats | None = None) -> Delivery:
    producer = producer_config(cfg.kafka.bootstrap_servers, cfg.kafka.producer, cfg.limits.max_record_bytes)
    if stats is not None:  # librdkafka's statistics of the daemon's producer: cdc_kafka_* metrics
        producer = stats.producer.hooks(producer)
    dead = DeadLetters(cfg.limits.dead_letter_topic) if cfg.limits.dead_letter_topic else None
    if cfg.delivery.mode == "at_least_once":
        return AtLeastOnce(producer, max_record_bytes=cfg.limits.max_record_bytes, dead_letters=dead)
    start = read_position(cfg.kafka.bootstrap_servers, cfg.kafka.producer, cfg.delivery.offsets_topic, cfg.source.slot)
    return ExactlyOnce(
        producer,
        slot=cfg.source.slot,
        offsets_topic=cfg.delivery.offsets_topic,
        start=start,
        max_record_bytes=cfg.limits.max_record_bytes,
        commit_interval_s=cfg.delivery.commit_interval_ms / 1000,
        commit_records=cfg.delivery.commit_records,
        split_records=cfg.delivery.split_records,
        dead_letters=dead,
    )


def outbox_topic_spec(cfg: Config, topic: str) -> TopicSpec:
    return TopicSpec(
        topic,
        cfg.outbox.partitions or cfg.kafka.partitions,
        cfg.outbox.replication_factor or cfg.kafka.replication_factor,
        cfg.outbox.topic_config,
        compacted=False,  # an aggregate's events are a stream: compaction would keep only its last one
    )


def topic_specs(
    cfg: Config, tables: dict[str, TableInfo], serializer: EventSerializer[Any], router: OutboxRouter | None
) -> list[TopicSpec]:
    by_name = {t.name: t for t in cfg.tables}
    specs = []
    for info in tables.values():
        t = by_name[info.qualified]
        specs.append(
            TopicSpec(
                serializer.topic_name(info.schema, info.name),
                t.partitions or cfg.kafka.partitions,
                t.replication_factor or cfg.kafka.replication_factor,
                {**cfg.kafka.topic_config, **t.topic_config},
            )
        )
    for box in cfg.outbox.tables:
        if box.produce_change_topic:
            specs.append(
                TopicSpec(
                    serializer.topic_name(box.schema_name, box.table_name),
                    cfg.kafka.partitions,
                    cfg.kafka.replication_factor,
                    cfg.kafka.topic_config,
                )
            )
    if router is not None:
        specs.extend(outbox_topic_spec(cfg, t) for t in router.startup_topics())
    if cfg.delivery.mode == "exactly_once":
        specs.append(TopicSpec(cfg.delivery.offsets_topic, 1, cfg.kafka.replication_factor))
    # Every version of every table's column types (cdc.schema_history): compacted, keyed by table and position.
    specs.append(TopicSpec(schema_history_topic(cfg.topic_prefix), 1, cfg.kafka.replication_factor))
    # Logical messages (pg_logical_emit_message) go here as Debezium does; keyed by prefix, so not compacted.
    specs.append(TopicSpec(f"{cfg.topic_prefix}.message", 1, cfg.kafka.replication_factor, compacted=False))
    if cfg.transaction_metadata:
        # BEGIN and END share a key: compaction would drop the BEGINs, so this topic is not compacted.
        specs.append(TopicSpec(transaction_topic(cfg.topic_prefix), 1, cfg.kafka.replication_factor, compacted=False))
    if cfg.heartbeat.interval_ms:
        specs.append(TopicSpec(heartbeat_topic(cfg.topic_prefix), 1, cfg.kafka.replication_factor))
    dead_letters = {cfg.limits.dead_letter_topic} - {None}
    if cfg.outbox.enabled and cfg.outbox.on_error == "dead_letter":
        dead_letters.add(cfg.outbox_dead_letter_topic)
    for topic in sorted(t for t in dead_letters if t):
        # Every dead letter is kept: compaction would keep only the last one of each key.
        specs.append(TopicSpec(topic, 1, cfg.kafka.replication_factor, {"retention.ms": "-1"}, compacted=False))
    return specs


def log_selection(selection: Selection) -> None:
    for selector, names in selection.expanded.items():
        log.info("table_pattern_expanded", selector=selector, tables=list(names))
    for selector in selection.empty:
        log.warning("table_pattern_empty", selector=selector, note="allow_empty is set: none of its tables yet")
