"""The daemon: start-up checks, then Postgres -> decoder -> serializer -> Kafka, with the acknowledged LSN going back.

One thread does everything, in this order per frame: read, decode, serialize,
produce, serve delivery reports, confirm what is acknowledged. When in-flight
bytes pass the budget it stops reading WAL (Postgres keeps it in the slot) and
only serves delivery reports and status updates until the budget frees up.
"""

from __future__ import annotations

import signal
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Final

import psycopg
import structlog
import tenacity

from cdc.catalog import (
    StartupError,
    TableInfo,
    check_server,
    column_type_oids,
    describe_outbox_tables,
    describe_tables,
    expand_config,
    apply_publication,
    load_types,
    plan_publication,
)
from cdc.columns import ColumnPolicy, ColumnPolicyError, policies
from cdc.config import Config, ConfigError, TableConfig, load_config
from cdc.decoder import pgoutput
from cdc.decoder.changes import ChangeDecoder, ChangeError
from cdc.decoder.spool import Spool, SpoolError
from cdc.decoder.stream import (
    XLOGDATA_HEADER_SIZE,
    ConnectionLost,
    ReplicationError,
    ReplicationStream,
    SlotBusy,
    protocol_for,
)
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import ChangeEvent, MessageEvent, RowRendering, TableSchema, TruncateEvent, TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.process import tune_gc
from cdc.outbox.route import Malformed, OutboxError, OutboxEvent, OutboxRouter
from cdc.sink.delivery import (
    AtLeastOnce,
    DeadLetters,
    Delivery,
    ExactlyOnce,
    RetryableSinkError,
    read_position,
)
from cdc.sink.kafka import (
    DeliveryFailed,
    SinkError,
    TopicSpec,
    admin_client,
    check_reachable,
    ensure_topics,
    producer_config,
)
from cdc.sink.avro import AvroSerializer, AvroSettings
from cdc.sink.metadata import Heartbeat, TransactionMetadata, heartbeat_topic, transaction_topic
from cdc.sink.registry import RegistryClient, RegistryError
from cdc.snapshot.errors import SnapshotError, SnapshotInterrupted
from cdc.snapshot.incremental import is_watermark
from cdc.snapshot.modes import StartupPlan, inspect_slot
from cdc.snapshot.output import ConfiguredOutput
from cdc.snapshot.service import Snapshots
from cdc.snapshot.state import KafkaStore, topics_holding_records
from cdc.sink.errors import SerializationError
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.records import EventSerializer
from cdc.instance import InstanceLock
from cdc.observe import HttpEndpoint, Stats
from cdc.selection import Selection

log = structlog.get_logger("cdc.pipeline")

_WAL_START = struct.Struct(">Q")
# A replication session that has streamed this long ends an outage (or reconnect_timeout_s, when shorter):
# the next loss starts a new one, with the whole timeout and the backoff from its start. Sessions that
# fail sooner belong to the outage they came out of, so a flapping connection backs off and gives up.
_STABLE_SESSION_S: Final = 30.0
_RECONNECTABLE: Final = (ConnectionLost, SlotBusy, RetryableSinkError)
# Lsn without Lsn.__new__'s range check (a Python call per frame): an unsigned 64-bit field is in range.
_NEW_LSN: Final = int.__new__
FATAL = (
    StartupError,
    SinkError,
    ReplicationError,
    ChangeError,
    SpoolError,
    SerializationError,
    RegistryError,
    pgoutput.DecodeError,
    ConfigError,
    SnapshotError,
    OutboxError,
)


class _OutageOver(Exception):
    """A session that had streamed stably was lost: the retries of the outage before it are over."""

    def __init__(self, streamed_s: float) -> None:
        super().__init__(f"lost after streaming for {streamed_s:.1f}s")
        self.streamed_s = streamed_s


class Pipeline:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._stop = False
        self._tables: dict[str, TableInfo] = {}
        self._outbox_tables: dict[str, TableInfo] = {}  # in the publication and the decoder, not the snapshot
        self._router: OutboxRouter | None = None
        self._admin: Any = None  # creates an outbox topic on the first event of a new aggregate type
        self._delivery: Delivery | None = None
        self._serializer: EventSerializer[Any] | None = None
        self._decoder: ChangeDecoder | None = None
        self._partitions: dict[str, int] = {}
        self._reload_requested = False
        self._config_path: Path | None = None
        self._declared = config.tables  # as configured, patterns included; self.config.tables has them expanded
        self._next_rescan = float("inf")
        self._policies: dict[str, ColumnPolicy] = {}
        self._lock = InstanceLock(config.source.conninfo(), config.source.slot)
        self.stats = Stats()
        self._lag_conn: psycopg.Connection[tuple[object, ...]] | None = None  # the metrics thread's
        self._side_conn: psycopg.Connection[tuple[object, ...]] | None = None  # the main loop's
        self._snapshots: Snapshots | None = None
        self._snapshot_plan: StartupPlan | None = None
        self._streaming_since: float | None = None  # monotonic; None while the session is not streaming

    @property
    def events(self) -> int:
        return sum(self.stats.events.values())

    def stop(self) -> None:
        self._stop = True

    @property
    def stopping(self) -> bool:
        return self._stop

    def request_reload(self, config_path: Path) -> None:
        """SIGHUP: re-read the table list at the next transaction boundary."""
        self._config_path = config_path
        self._reload_requested = True

    # -- start-up -------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Every check first, then create what is missing: topics, publication, slot."""
        cfg = self.config
        try:
            conn = psycopg.connect(cfg.source.conninfo(application_name="cdc-setup"), autocommit=True)
        except psycopg.OperationalError as e:
            raise StartupError(
                f"cannot connect to Postgres ({cfg.source.dsn}): {str(e).strip()}. Fix: {_connect_fix(str(e))}"
            ) from None
        with conn:
            check_server(conn)
            self._lock.acquire()
            self.config, selection = expand_config(conn, cfg)
            cfg = self.config
            _log_selection(selection)
            self._tables = describe_tables(conn, cfg.tables)
            self._outbox_tables = describe_outbox_tables(conn, cfg.outbox.tables)
            self._policies = self._column_policies()
            publication = plan_publication(
                conn, cfg.source.publication, [*self._tables.keys(), *self._outbox_tables.keys()]
            )
            slot_state = inspect_slot(conn, cfg.source.slot)
            oids = column_type_oids(conn, [t.oid for t in (*self._tables.values(), *self._outbox_tables.values())])
            types = load_types(conn, [o for o in oids if o not in BUILTIN_TYPES])

            admin = admin_client(cfg.kafka.bootstrap_servers, cfg.kafka.producer)
            check_reachable(admin, cfg.kafka.bootstrap_servers)
            self._serializer = self._make_serializer()
            self._router = self._make_router()
            self._admin = admin
            progress_topic = cfg.snapshot.progress_topic_for(cfg.topic_prefix)
            self._partitions = ensure_topics(
                admin,
                [*self._topic_specs(self._serializer), TopicSpec(progress_topic, 1, cfg.kafka.replication_factor)],
            )

            apply_publication(conn, publication)
        self._snapshots = self._make_snapshots(types, progress_topic)
        self.stats.snapshot_progress = self._snapshots.progress
        # Drops, creates (with an exported snapshot) and copies as snapshot.mode says; resumes what was cut off.
        self._snapshot_plan = self._snapshots.prepare(slot_state)
        spool = None
        if cfg.decoder.streaming:
            spool_root = cfg.decoder.spool_dir or Path(tempfile.gettempdir()) / "cdc-spool"
            spool = Spool(spool_root / cfg.source.slot)
        self._decoder = ChangeDecoder(
            {**self._tables, **self._outbox_tables}, types, spool=spool, rendering=self._rendering
        )
        self._delivery = self._make_delivery()
        self._schedule_rescan()
        log.info(
            "ready",
            tables=sorted(self._tables),
            slot=cfg.source.slot,
            topics=sorted(self._partitions),
            delivery=cfg.delivery.mode,
            outbox_tables=sorted(self._outbox_tables),
            outbox_message_prefix=cfg.outbox.message_prefix,
        )

    def _make_snapshots(self, types: dict[int, Any], progress_topic: str) -> Snapshots:
        cfg = self.config
        assert self._serializer is not None
        topic_of = {name: self._serializer.topic_name(t.schema, t.name) for name, t in self._tables.items()}

        def holding(names: Any) -> set[str]:
            full = topics_holding_records(cfg.kafka.bootstrap_servers, cfg.kafka.producer, [topic_of[n] for n in names])
            return {n for n in names if topic_of[n] in full}

        return Snapshots(
            cfg.snapshot,
            conninfo=cfg.source.conninfo(),
            slot=cfg.source.slot,
            tables=self._tables,
            output=ConfiguredOutput(cfg, dict(self._partitions), make_serializer),
            store=KafkaStore(cfg.kafka.bootstrap_servers, progress_topic, cfg.source.slot, extra=cfg.kafka.producer),
            types=types,
            topics_holding_records=holding,
            should_stop=lambda: self._stop,
            alive=self._alive,
        )

    def _rendering(self, table: TableSchema) -> RowRendering | None:
        """Asked by the decoder per Relation message: whether it may write the table's rows straight in the
        sink format (JSON text, Avro binary). Not for tables whose rows something reads column by column
        first: a column policy (include/exclude/mask) or the outbox."""
        serializer = self._serializer
        if serializer is None or not self.config.decoder.render_rows:
            return None
        name = table.qualified
        if name in self._policies or name in self._outbox_tables:
            return None
        return serializer.row_rendering(table)

    def _alive(self) -> None:
        self.stats.heartbeat = time.monotonic()  # a long initial snapshot is not a hung daemon

    def _make_serializer(self) -> EventSerializer[Any]:
        return make_serializer(self.config, self._partitions_of)

    def _make_router(self) -> OutboxRouter | None:
        cfg = self.config
        if not cfg.outbox.enabled:
            return None
        registry = None
        if cfg.format == "avro":
            assert cfg.schema_registry is not None
            registry = RegistryClient.from_settings(cfg.schema_registry)
        return OutboxRouter(cfg.outbox, cfg.topic_prefix, registry=registry)

    def _outbox_topic_spec(self, topic: str) -> TopicSpec:
        cfg = self.config
        return TopicSpec(
            topic,
            cfg.outbox.partitions or cfg.kafka.partitions,
            cfg.outbox.replication_factor or cfg.kafka.replication_factor,
            cfg.outbox.topic_config,
            compacted=False,  # an aggregate's events are a stream: compaction would keep only its last one
        )

    def _column_policies(self) -> dict[str, ColumnPolicy]:
        cfg = self.config
        salt = cfg.masking.salt.get_secret_value() if cfg.masking.salt is not None else None
        result = policies(cfg.tables, cfg.masking.fixed_value, salt)
        problems = []
        for name, policy in result.items():
            info = self._tables[name]
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

    def _make_delivery(self) -> Delivery:
        cfg = self.config
        producer = producer_config(cfg.kafka.bootstrap_servers, cfg.kafka.producer, cfg.limits.max_record_bytes)
        dead = DeadLetters(cfg.limits.dead_letter_topic) if cfg.limits.dead_letter_topic else None
        if cfg.delivery.mode == "at_least_once":
            return AtLeastOnce(producer, max_record_bytes=cfg.limits.max_record_bytes, dead_letters=dead)
        start = read_position(
            cfg.kafka.bootstrap_servers, cfg.kafka.producer, cfg.delivery.offsets_topic, cfg.source.slot
        )
        return ExactlyOnce(
            producer,
            slot=cfg.source.slot,
            offsets_topic=cfg.delivery.offsets_topic,
            start=start,
            max_record_bytes=cfg.limits.max_record_bytes,
            commit_interval_s=cfg.delivery.commit_interval_ms / 1000,
            commit_records=cfg.delivery.commit_records,
            dead_letters=dead,
        )

    def _topic_specs(self, serializer: EventSerializer[Any]) -> list[TopicSpec]:
        cfg = self.config
        by_name = {t.name: t for t in cfg.tables}
        specs = []
        for info in self._tables.values():
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
        if self._router is not None:
            specs.extend(self._outbox_topic_spec(t) for t in self._router.startup_topics())
        if cfg.delivery.mode == "exactly_once":
            specs.append(TopicSpec(cfg.delivery.offsets_topic, 1, cfg.kafka.replication_factor))
        # Logical messages (pg_logical_emit_message) go here as Debezium does; keyed by prefix, so not compacted.
        specs.append(TopicSpec(f"{cfg.topic_prefix}.message", 1, cfg.kafka.replication_factor, compacted=False))
        if cfg.transaction_metadata:
            # BEGIN and END share a key: compaction would drop the BEGINs, so this topic is not compacted.
            specs.append(
                TopicSpec(transaction_topic(cfg.topic_prefix), 1, cfg.kafka.replication_factor, compacted=False)
            )
        if cfg.heartbeat.interval_ms:
            specs.append(TopicSpec(heartbeat_topic(cfg.topic_prefix), 1, cfg.kafka.replication_factor))
        if cfg.limits.dead_letter_topic:
            # Every dead letter is kept: compaction would keep only the last one of each key.
            specs.append(
                TopicSpec(
                    cfg.limits.dead_letter_topic, 1, cfg.kafka.replication_factor, {"retention.ms": "-1"}, compacted=False
                )
            )
        return specs

    def _partitions_of(self, topic: str) -> int:
        return self._partitions[topic]

    # -- streaming ------------------------------------------------------------------------------

    def run(self) -> None:
        http = None
        try:
            if self.config.http.enabled:  # before prepare(): progress and health during the initial snapshot
                http = HttpEndpoint(self.stats, self.config.http.host, self.config.http.port)
                http.start()
            self.prepare()
            if self._snapshot_plan is not None and not self._snapshot_plan.stream:
                log.info("snapshot_only_done", mode=self.config.snapshot.mode)  # initial_only
                return
            self._stream_with_retries()
        finally:
            if http is not None:
                http.stop()
            if self._snapshots is not None:
                self._snapshots.stop()
            self._lock.release()
            for side in (self._lag_conn, self._side_conn):
                if side is not None:
                    side.close()

    def _stream_with_retries(self) -> None:
        """Replication sessions until stop, reconnecting after a lost connection.

        ``reconnect_timeout_s`` bounds one outage. tenacity's clock and backoff run from the first
        attempt of its loop, so each outage gets a loop of its own: one loop for the daemon's life
        would stop at the first loss after ``reconnect_timeout_s`` of healthy streaming.
        """
        stable_s = min(_STABLE_SESSION_S, self.config.reconnect_timeout_s)
        while True:
            retry = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(_RECONNECTABLE),
                wait=tenacity.wait_exponential(multiplier=0.5, max=30),
                stop=tenacity.stop_after_delay(self.config.reconnect_timeout_s),
                before_sleep=lambda rs: log.warning(
                    "replication_retry",
                    attempt=rs.attempt_number,
                    error=str(rs.outcome.exception()) if rs.outcome else None,
                ),
                reraise=True,
            )
            try:
                for attempt in retry:
                    with attempt:
                        self._session_of_outage(stable_s)
                return
            except _OutageOver as over:
                log.warning("replication_lost", error=str(over.__cause__), streamed_s=round(over.streamed_s, 1))

    def _session_of_outage(self, stable_s: float) -> None:
        """One session; its loss after ``stable_s`` of streaming ends the outage it came out of."""
        try:
            self._session()
        except _RECONNECTABLE as exc:
            since = self._streaming_since
            if since is not None and time.monotonic() - since >= stable_s:
                raise _OutageOver(time.monotonic() - since) from exc
            raise

    def _session(self) -> None:
        """One replication connection, from the slot's confirmed position until stop or failure."""
        cfg = self.config
        assert self._delivery is not None and self._decoder is not None and self._serializer is not None
        delivery, serializer = self._delivery, self._serializer
        stream = ReplicationStream(
            cfg.source.conninfo(), status_interval=cfg.status_interval_s, on_keepalive=delivery.position
        )
        self._streaming_since = None
        budget = cfg.limits.max_inflight_bytes
        feed = self._decoder.feed
        assert self._snapshots is not None
        snapshots = self._snapshots
        on_event = snapshots.on_event
        # A row change's part of on_event, without its dispatch and the reader check (both run at every
        # Begin and Commit): it is called per row.
        on_change = snapshots.coordinator.on_change
        stats = self.stats
        counts = stats.events
        column_policies = self._policies
        router = self._router
        outbox_tables = router.tables if router is not None else {}
        outbox_prefix = router.message_prefix if router is not None else None
        txmeta = TransactionMetadata(cfg.topic_prefix) if cfg.transaction_metadata else None
        heartbeat = Heartbeat(cfg.topic_prefix, cfg.heartbeat.interval_ms / 1000) if cfg.heartbeat.interval_ms else None
        stats.inflight_bytes = lambda: delivery.inflight_bytes
        stats.inflight_records = lambda: delivery.inflight_records
        stats.confirmed_lsn = lambda: int(stream.flushed)
        stats.slot_lag_bytes = self._slot_lag
        try:
            self._lock.ensure()
            stream.connect()
            proto, options = protocol_for(stream.server_version, streaming=cfg.decoder.streaming)
            stream.start(
                cfg.source.slot,
                cfg.source.publication,
                delivery.acknowledged(),
                proto_version=proto,
                options=options,
                messages=True,  # watermarks
            )
            self._decoder.reset()
            snapshots.reset()  # windows open in the last session are read again
            snapshots.start()  # DBLog jobs and the signal table
            stats.streaming = True
            self._streaming_since = time.monotonic()
            skipping = False
            in_tx = False
            frames = events = 0
            while not self._stop:
                frame = stream.read(0.2)
                if frame is not None:
                    lsn = _NEW_LSN(Lsn, _WAL_START.unpack_from(frame, 1)[0])
                    # Usually one event or none; the commit of a streamed transaction releases all of it.
                    for event in feed(frame[XLOGDATA_HEADER_SIZE:], lsn):
                        if isinstance(event, ChangeEvent):
                            if not skipping:
                                describe = event.table.qualified
                                box = outbox_tables.get(describe)
                                if box is not None:  # an outbox row: its event; its change only when asked
                                    assert router is not None
                                    self._outbox(router.from_row(box, event))
                                if box is None or box.produce_change_topic:
                                    on_change(event, describe)
                                    policy = column_policies.get(describe)
                                    if policy is not None:
                                        event = policy.apply(event)
                                    for record in serializer.records(event):
                                        delivery.send(record, describe)
                                    # Op is a StrEnum: the member is the same key as its code ("c"), without
                                    # Enum.value's descriptor call on every row
                                    counts[(describe, event.op)] += 1
                                    if txmeta is not None:
                                        txmeta.count(describe)
                        elif isinstance(event, TruncateEvent | MessageEvent):
                            if not skipping:
                                snapshot_rows = on_event(event)
                                if isinstance(event, MessageEvent) and event.prefix == outbox_prefix:
                                    assert router is not None
                                    if event.transactional:
                                        self._outbox(router.from_message(event))
                                    else:
                                        self._send_standalone_message(event)
                                elif isinstance(event, MessageEvent) and not event.transactional:
                                    self._send_standalone_message(event)
                                elif not is_watermark(event):
                                    describe = _describe(event)
                                    for record in serializer.records(event):
                                        delivery.send(record, describe)
                                    counts[(describe, "t" if isinstance(event, TruncateEvent) else "m")] += 1
                                if snapshot_rows:  # a high watermark: the chunk's rows, inside its transaction
                                    self._send_snapshot_rows(snapshot_rows)
                        elif isinstance(event, TxBegin):
                            skipping = not delivery.begin(event)
                            if not skipping:
                                on_event(event)
                            in_tx = True
                            if txmeta is not None and not skipping:
                                delivery.send(txmeta.begin(event), "transaction metadata")
                        elif isinstance(event, TxCommit):
                            if txmeta is not None and not skipping:
                                delivery.send(txmeta.end(event), "transaction metadata")
                            if not skipping:
                                on_event(event)
                            delivery.commit(event)
                            skipping = in_tx = False
                            stats.last_commit_ts_us = event.commit_ts_us
                            stats.last_processed_us = time.time_ns() // 1000
                        events += 1
                        if events & 1023 == 0:  # also inside a replay of millions of events
                            self._keep_up(stream, budget)
                    frames += 1
                    if frames < 64:
                        continue  # housekeeping below runs every 64 frames, or when the stream is idle
                frames = 0
                self._keep_up(stream, budget)
                if self._reload_requested and not in_tx:
                    self._reload()
                elif not in_tx and time.monotonic() >= self._next_rescan:
                    self._apply_tables(self._declared, "rescan")
                if heartbeat is not None and not in_tx:
                    beat = heartbeat.due()
                    if beat is not None:
                        delivery.send_outside(beat)
                        self._heartbeat_action()
            self._drain(stream)
        except (ConnectionLost, RetryableSinkError):
            stats.streaming = False
            self._recover(stream)
            raise
        except DeliveryFailed:
            stats.delivery_errors += 1
            stats.streaming = False
            stream.close()
            raise
        except BaseException:
            stats.streaming = False
            stream.close()
            raise

    def _send_standalone_message(self, event: MessageEvent) -> None:
        """A non-transactional message arrives between transactions at its own LSN: deliver it as a
        transaction of one, so the confirmed LSN never passes it undelivered and exactly-once skips it
        when it was already committed."""
        assert self._delivery is not None and self._serializer is not None
        ts = event.commit_ts_us if event.commit_ts_us is not None else time.time_ns() // 1000
        if self._delivery.begin(TxBegin(0, event.lsn, ts)):
            if self._router is not None and event.prefix == self._router.message_prefix:
                self._outbox(self._router.from_message(event))  # refused: not transactional
            else:
                for record in self._serializer.records(event):
                    self._delivery.send(record, f"message {event.prefix}")
                self.stats.events[(f"message {event.prefix}", "m")] += 1
        self._delivery.commit(TxCommit(0, event.lsn, event.lsn, ts, 1))

    def _outbox(self, found: OutboxEvent | Malformed | None) -> None:
        """Produce an outbox event, in the current source transaction like any change event; a malformed
        one goes to the dead-letter topic or stops the pipeline (outbox.on_error), never nowhere."""
        if found is None:  # UPDATE or DELETE on an outbox table: ignored by design
            return
        assert self._delivery is not None and self._router is not None
        if isinstance(found, OutboxEvent):
            record = self._router.record(found)
            if record.topic not in self._partitions:
                self._create_outbox_topic(record.topic)
            self._delivery.send(record, f"outbox {found.source}")
            self.stats.outbox_events[(found.aggregate_type, found.route)] += 1
            return
        dead_letter_topic = self.config.limits.dead_letter_topic
        if self.config.outbox.on_error == "fail" or dead_letter_topic is None:
            raise OutboxError(
                f"{found.describe()} ({found.reason}); content {_clip(found.content)}. Nothing from this "
                "transaction on is confirmed, so a restart meets it again. Fix: set outbox.on_error: dead_letter "
                "(with limits.dead_letter_topic) to set such events aside and go on"
                + ("; or allow the type in outbox.aggregate_types" if found.reason == "aggregate_type_not_allowed" else "")
            )
        self._delivery.send(self._router.dead_letter(found, dead_letter_topic), f"outbox {found.source}")
        self.stats.outbox_dead_letters[found.reason] += 1
        log.error(
            "outbox_dead_lettered",
            source=found.source,
            reason=found.reason,
            detail=found.detail,
            lsn=str(found.lsn),
            txid=found.xid,
            dead_letter_topic=dead_letter_topic,
        )

    def _create_outbox_topic(self, topic: str) -> None:
        """The first event of a new aggregate type: its topic exists before its record is produced."""
        if self._admin is None:
            self._admin = admin_client(self.config.kafka.bootstrap_servers, self.config.kafka.producer)
        self._partitions.update(ensure_topics(self._admin, [self._outbox_topic_spec(topic)]))
        log.info("outbox_topic_ready", topic=topic)

    def _send_snapshot_rows(self, rows: list[ChangeEvent]) -> None:
        """Snapshot rows the coordinator released at a high watermark: same policies, serializer, delivery."""
        assert self._delivery is not None and self._serializer is not None
        for row in rows:
            describe = row.table.qualified
            policy = self._policies.get(describe)
            event = policy.apply(row) if policy is not None else row
            for record in self._serializer.records(event):
                self._delivery.send(record, describe)
            self.stats.events[(describe, "r")] += 1
            self.stats.snapshot_rows[describe] += 1

    def _heartbeat_action(self) -> None:
        query = self.config.heartbeat.action_query
        if not query:
            return
        try:
            if self._side_conn is None or self._side_conn.closed or self._side_conn.broken:
                self._side_conn = psycopg.connect(
                    self.config.source.conninfo(application_name="cdc-heartbeat"), autocommit=True, connect_timeout=5
                )
            self._side_conn.execute(query.encode())
        except psycopg.Error as e:
            log.warning("heartbeat_action_failed", error=str(e).strip())

    def _slot_lag(self) -> int | None:
        """Bytes of WAL the slot holds back (read at scrape time, on a connection of its own)."""
        try:
            if self._lag_conn is None or self._lag_conn.closed or self._lag_conn.broken:
                self._lag_conn = psycopg.connect(
                    self.config.source.conninfo(application_name="cdc-metrics"), autocommit=True, connect_timeout=5
                )
            row = self._lag_conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = %s",
                (self.config.source.slot,),
            ).fetchone()
        except psycopg.Error as e:
            log.warning("slot_lag_unavailable", error=str(e).strip())
            return None
        return int(str(row[0])) if row and row[0] is not None else None

    def _reload(self) -> None:
        """Pick up a changed table list (and new tables matching its patterns) without a restart; other
        changes need one."""
        self._reload_requested = False
        assert self._config_path is not None
        try:
            new = load_config(self._config_path)
        except ConfigError as e:
            log.error("reload_rejected", error=str(e))
            return
        others_changed = new.model_copy(update={"tables": self._declared}) != self.config.model_copy(
            update={"tables": self._declared}
        )
        if others_changed:
            log.warning("reload_needs_restart", reason="settings other than 'tables' changed; they apply at restart")
        self._apply_tables(new.tables, "reload")

    def _schedule_rescan(self) -> None:
        interval = self.config.table_rescan_interval_s
        patterns = any(t.name is None for t in self._declared)
        self._next_rescan = time.monotonic() + interval if interval and patterns else float("inf")

    def _apply_tables(self, declared: list[TableConfig], reason: str) -> None:
        """Capture the tables ``declared`` selects now (patterns expanded against the catalog): new ones get
        their topics, join the publication and are snapshotted while streaming; removed ones stop."""
        assert self._decoder is not None and self._serializer is not None
        cfg = self.config
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
            self._declared = declared
            self._schedule_rescan()
            if candidate.tables == cfg.tables:
                if reason == "reload":
                    log.info("reload_no_table_change")
                return
            _log_selection(selection)
            try:
                tables = describe_tables(conn, candidate.tables)
                publication = plan_publication(
                    conn, cfg.source.publication, [*tables.keys(), *self._outbox_tables.keys()]
                )
            except StartupError as e:
                log.error("reload_rejected", reason=reason, error=str(e))
                return
            oids = column_type_oids(conn, [t.oid for t in (*tables.values(), *self._outbox_tables.values())])
            types = load_types(conn, [o for o in oids if o not in BUILTIN_TYPES])
            admin = admin_client(cfg.kafka.bootstrap_servers, cfg.kafka.producer)
            old_tables = self._tables
            self._tables = tables
            self.config = candidate
            try:
                policies = self._column_policies()
            except StartupError as e:
                self._tables, self.config = old_tables, cfg
                log.error("reload_rejected", reason=reason, error=str(e))
                return
            # In place: the running session holds this dict, and an added table's masks must apply at once.
            self._policies.clear()
            self._policies.update(policies)
            self._decoder.set_rendering(self._rendering)  # a table that gained a policy: typed rows
            self._partitions.update(ensure_topics(admin, self._topic_specs(self._serializer)))
            apply_publication(conn, publication)
            self._decoder.update_tables({**tables, **self._outbox_tables}, types)
            snapshotted = self._snapshots.tables_changed(tables, types) if self._snapshots is not None else []
        log.info(
            "reload_tables",
            reason=reason,
            added=sorted(set(tables) - set(old_tables)),
            removed=sorted(set(old_tables) - set(tables)),
            snapshot=snapshotted,
        )

    def _keep_up(self, stream: ReplicationStream, budget: int) -> None:
        """Housekeeping: serve delivery reports, confirm, keep the server and /healthz answered, apply the budget.

        Runs every 64 frames, when the stream is idle, and every 1,024 events inside one frame (the commit
        of a streamed transaction releases all of it at once).
        """
        assert self._delivery is not None
        delivery = self._delivery
        delivery.tick()
        stream.confirm(delivery.acknowledged())
        stream.send_status_if_due()  # the server ends a connection that stays silent for wal_sender_timeout
        self.stats.heartbeat = time.monotonic()
        self.stats.dead_letters = delivery.dead_lettered + sum(self.stats.outbox_dead_letters.values())
        if delivery.inflight_bytes > budget:
            self._wait_for_kafka(stream, budget)

    def _wait_for_kafka(self, stream: ReplicationStream, budget: int) -> None:
        """Backpressure: stop reading WAL (Postgres keeps it) until Kafka took half the budget back."""
        assert self._delivery is not None
        delivery = self._delivery
        paused = time.monotonic()
        log.info("backpressure_on", inflight_bytes=delivery.inflight_bytes, budget=budget)
        while delivery.inflight_bytes > budget // 2 and not self._stop:
            self.stats.heartbeat = time.monotonic()  # waiting on Kafka is not a hung daemon
            delivery.tick()
            time.sleep(0.01)
            stream.confirm(delivery.acknowledged())
            stream.send_status_if_due()
        log.info("backpressure_off", paused_s=round(time.monotonic() - paused, 3))

    def _drain(self, stream: ReplicationStream) -> None:
        """Clean stop: deliver what is in flight, confirm it, close."""
        assert self._delivery is not None
        log.info("stopping", inflight_records=self._delivery.inflight_records)
        remaining = self._delivery.drain(self.config.shutdown_timeout_s)
        stream.confirm(self._delivery.acknowledged())
        stream.close()
        log.info("stopped", confirmed=str(stream.flushed), undelivered=remaining, events=self.events)

    def _recover(self, stream: ReplicationStream) -> None:
        """After a lost connection or an aborted Kafka transaction: deliver what was sent, then start afresh."""
        assert self._delivery is not None
        stream.close()
        while self._delivery.drain(5.0) and not self._stop:
            self.stats.heartbeat = time.monotonic()
            log.warning("waiting_for_kafka", inflight_records=self._delivery.inflight_records)
        self._delivery.reset()
        log.warning("replication_reconnecting", acknowledged=str(self._delivery.acknowledged()))


def make_serializer(cfg: Config, partitions_of: Callable[[str], int]) -> EventSerializer[Any]:
    """The configured format's serializer (module-level: snapshot workers build theirs with it)."""
    if cfg.format == "avro":
        assert cfg.schema_registry is not None  # the configuration model requires it
        registry = RegistryClient.from_settings(cfg.schema_registry)
        registry.check_reachable()
        return AvroSerializer(
            AvroSettings(
                topic_prefix=cfg.topic_prefix,
                database=cfg.source.database,
                decimal_handling=cfg.avro_format.decimal_handling,
                time_precision=cfg.avro_format.time_precision,
                interval_handling=cfg.avro_format.interval_handling,
            ),
            partitions_of,
            registry,
        )
    return JsonSerializer(
        JsonSettings(
            topic_prefix=cfg.topic_prefix,
            database=cfg.source.database,
            schemas_enable=cfg.json_format.schemas_enable,
            decimal_handling=cfg.json_format.decimal_handling,
            time_precision=cfg.json_format.time_precision,
            interval_handling=cfg.json_format.interval_handling,
        ),
        partitions_of,
    )


def _clip(content: Any, limit: int = 500) -> str:
    text = repr(dict(content))
    return text if len(text) <= limit else text[:limit] + "..."


def _connect_fix(error: str) -> str:
    if any(word in error for word in ("SSL", "certificate", "sslmode", "server does not support SSL")):
        return (
            "check the TLS settings in source.dsn: sslrootcert must name the CA that signed the server's "
            "certificate (sslmode=verify-full also checks the host name against it), sslcert/sslkey a client "
            "certificate if the server asks for one; and that the server runs with ssl=on."
        )
    return "check source.dsn, the password (CDC_SOURCE__PASSWORD or source.password_file) and pg_hba.conf."


def _log_selection(selection: Selection) -> None:
    for selector, names in selection.expanded.items():
        log.info("table_pattern_expanded", selector=selector, tables=list(names))
    for selector in selection.empty:
        log.warning("table_pattern_empty", selector=selector, note="allow_empty is set: none of its tables yet")


def _describe(event: ChangeEvent | TruncateEvent | MessageEvent) -> str:
    if isinstance(event, ChangeEvent):
        return event.table.qualified
    if isinstance(event, TruncateEvent):
        return ",".join(t.qualified for t in event.tables)
    return f"message {event.prefix}"


def run(config_path: Path) -> int:
    """Entry point of ``cdc run``: 0 after a clean stop, 1 on a fatal error, 2 on a bad configuration."""
    try:
        config = load_config(config_path)
    except ConfigError as e:
        log.error("config_invalid", error=str(e))
        return 2
    pipeline = Pipeline(config)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        pipeline.stop()

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        log.info("signal", signal="SIGHUP")
        pipeline.request_reload(config_path)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    tune_gc()
    try:
        pipeline.run()
    except SnapshotInterrupted as e:
        log.warning("snapshot_interrupted", error=str(e))
        return 0 if pipeline.stopping else 1
    except FATAL as e:
        log.error("fatal", error=str(e), kind=type(e).__name__)
        return 1
    except OSError as e:  # e.g. the HTTP port is taken
        log.error("fatal", error=str(e), kind=type(e).__name__)
        return 1
    return 0
