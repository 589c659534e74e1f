"""The daemon: start-up checks, then Postgres -> decoder -> serializer -> Kafka, with the acknowledged LSN going back.

One thread does everything, in this order per frame: read, decode, serialize,
produce, serve delivery reports, confirm what is acknowledged. When in-flight
bytes pass the budget it stops reading WAL (Postgres keeps it in the slot) and
only serves delivery reports and status updates until the budget frees up.
"""

from __future__ import annotations

import signal
import struct
import time
from pathlib import Path
from types import FrameType

import psycopg
import structlog
import tenacity

from cdc.catalog import (
    StartupError,
    TableInfo,
    check_server,
    column_type_oids,
    describe_tables,
    ensure_publication,
    load_types,
    slot_exists,
)
from cdc.config import Config, ConfigError, load_config
from cdc.decoder import pgoutput
from cdc.decoder.changes import ChangeDecoder, ChangeError
from cdc.decoder.stream import (
    XLOGDATA_HEADER_SIZE,
    ConnectionLost,
    ReplicationError,
    ReplicationStream,
    SlotBusy,
)
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import ChangeEvent, Event, MessageEvent, TruncateEvent, TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.sink.delivery import (
    AtLeastOnce,
    DeadLetters,
    Delivery,
    ExactlyOnce,
    RetryableSinkError,
    read_position,
)
from cdc.sink.kafka import (
    SinkError,
    TopicSpec,
    admin_client,
    check_reachable,
    ensure_topics,
    producer_config,
)
from cdc.sink.serialize import JsonSerializer, JsonSettings, SerializationError

log = structlog.get_logger("cdc.pipeline")

_WAL_START = struct.Struct(">Q")
FATAL = (StartupError, SinkError, ReplicationError, ChangeError, SerializationError, pgoutput.DecodeError, ConfigError)


class Pipeline:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._stop = False
        self._tables: dict[str, TableInfo] = {}
        self._delivery: Delivery | None = None
        self._serializer: JsonSerializer | None = None
        self._decoder: ChangeDecoder | None = None
        self._partitions: dict[str, int] = {}
        self.events = 0

    def stop(self) -> None:
        self._stop = True

    # -- start-up -------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Every check first, then create what is missing: topics, publication, slot."""
        cfg = self.config
        try:
            conn = psycopg.connect(cfg.source.conninfo(application_name="cdc-setup"), autocommit=True)
        except psycopg.OperationalError as e:
            raise StartupError(
                f"cannot connect to Postgres ({cfg.source.dsn}): {str(e).strip()}. "
                "Fix: check source.dsn, the password (CDC_SOURCE__PASSWORD or source.password_file) and pg_hba.conf."
            ) from None
        with conn:
            check_server(conn)
            self._tables = describe_tables(conn, cfg.tables)
            has_slot, _ = slot_exists(conn, cfg.source.slot)
            oids = column_type_oids(conn, [t.oid for t in self._tables.values()])
            types = load_types(conn, [o for o in oids if o not in BUILTIN_TYPES])

            admin = admin_client(cfg.kafka.bootstrap_servers, cfg.kafka.producer)
            check_reachable(admin, cfg.kafka.bootstrap_servers)
            self._serializer = JsonSerializer(
                JsonSettings(
                    topic_prefix=cfg.topic_prefix,
                    database=cfg.source.database,
                    schemas_enable=cfg.json_format.schemas_enable,
                    decimal_handling=cfg.json_format.decimal_handling,
                    time_precision=cfg.json_format.time_precision,
                    interval_handling=cfg.json_format.interval_handling,
                ),
                self._partitions_of,
            )
            self._partitions = ensure_topics(admin, self._topic_specs(self._serializer))

            ensure_publication(conn, cfg.source.publication, self._tables.keys())
            if not has_slot:
                stream = ReplicationStream(cfg.source.conninfo())
                stream.connect()
                try:
                    stream.create_slot(cfg.source.slot)
                finally:
                    stream.close()
        self._decoder = ChangeDecoder(self._tables, types)
        self._delivery = self._make_delivery()
        log.info(
            "ready",
            tables=sorted(self._tables),
            slot=cfg.source.slot,
            topics=sorted(self._partitions),
            delivery=cfg.delivery.mode,
        )

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

    def _topic_specs(self, serializer: JsonSerializer) -> list[TopicSpec]:
        cfg = self.config
        specs = [
            TopicSpec(
                serializer.topic_name(t.schema, t.name),
                cfg.kafka.partitions,
                cfg.kafka.replication_factor,
                cfg.kafka.topic_config,
            )
            for t in self._tables.values()
        ]
        if cfg.delivery.mode == "exactly_once":
            specs.append(TopicSpec(cfg.delivery.offsets_topic, 1, cfg.kafka.replication_factor))
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
        self.prepare()
        retry = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((ConnectionLost, SlotBusy, RetryableSinkError)),
            wait=tenacity.wait_exponential(multiplier=0.5, max=30),
            stop=tenacity.stop_after_delay(self.config.reconnect_timeout_s),
            before_sleep=lambda rs: log.warning(
                "replication_retry",
                attempt=rs.attempt_number,
                error=str(rs.outcome.exception()) if rs.outcome else None,
            ),
            reraise=True,
        )
        for attempt in retry:
            with attempt:
                self._session()

    def _session(self) -> None:
        """One replication connection, from the slot's confirmed position until stop or failure."""
        cfg = self.config
        assert self._delivery is not None and self._decoder is not None and self._serializer is not None
        delivery, serializer = self._delivery, self._serializer
        stream = ReplicationStream(
            cfg.source.conninfo(), status_interval=cfg.status_interval_s, on_keepalive=delivery.position
        )
        budget = cfg.limits.max_inflight_bytes
        decode = pgoutput.decode
        handle = self._decoder.handle
        try:
            stream.connect()
            stream.start(cfg.source.slot, cfg.source.publication, delivery.acknowledged(), messages=False)
            self._decoder.reset()
            skipping = False
            while not self._stop:
                frame = stream.read(0.2)
                if frame is not None:
                    lsn = Lsn(_WAL_START.unpack_from(frame, 1)[0])
                    event: Event | None = handle(decode(frame[XLOGDATA_HEADER_SIZE:]), lsn)
                    if event is None:
                        pass
                    elif isinstance(event, ChangeEvent | TruncateEvent | MessageEvent):
                        if not skipping:
                            describe = _describe(event)
                            for record in serializer.records(event):
                                delivery.send(record, describe)
                            self.events += 1
                    elif isinstance(event, TxBegin):
                        skipping = not delivery.begin(event)
                    elif isinstance(event, TxCommit):
                        delivery.commit(event)
                        skipping = False
                delivery.tick()
                stream.confirm(delivery.acknowledged())
                if delivery.inflight_bytes > budget:
                    self._wait_for_kafka(stream, budget)
            self._drain(stream)
        except (ConnectionLost, RetryableSinkError):
            self._recover(stream)
            raise
        except BaseException:
            stream.close()
            raise

    def _wait_for_kafka(self, stream: ReplicationStream, budget: int) -> None:
        """Backpressure: stop reading WAL (Postgres keeps it) until Kafka took half the budget back."""
        assert self._delivery is not None
        delivery = self._delivery
        paused = time.monotonic()
        log.info("backpressure_on", inflight_bytes=delivery.inflight_bytes, budget=budget)
        while delivery.inflight_bytes > budget // 2 and not self._stop:
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
            log.warning("waiting_for_kafka", inflight_records=self._delivery.inflight_records)
        self._delivery.reset()
        log.warning("replication_reconnecting", acknowledged=str(self._delivery.acknowledged()))


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

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        pipeline.run()
    except FATAL as e:
        log.error("fatal", error=str(e), kind=type(e).__name__)
        return 1
    return 0
