"""The Kafka side: topics, producer settings, and the acknowledgment tracker.

How records are produced and positions confirmed (at least once, exactly once)
is in ``cdc.sink.delivery``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from cdc.lsn import Lsn

log = structlog.get_logger(__name__)

# librdkafka's RD_KAFKA_PARTITION_UA: a produce call's partition argument that leaves the choice to the
# configured partitioner, as leaving the argument out does (for positional calls, which parse faster).
ANY_PARTITION: Final = -1


class SinkError(Exception):
    """Kafka cannot take the data; the message names the problem and the fix."""


class DeliveryFailed(SinkError):
    pass


class RecordTooLarge(SinkError):
    pass


class _Entry:
    """One source transaction (or a keepalive position) awaiting acknowledgment."""

    __slots__ = ("end_lsn", "pending", "closed")

    def __init__(self) -> None:
        self.end_lsn = Lsn(0)
        self.pending = 0
        self.closed = False


_NOTHING_ACKED = Lsn(0)


class AckTracker:
    """Knows the highest LSN below which everything handed to Kafka is durable."""

    def __init__(self, start: Lsn = _NOTHING_ACKED) -> None:
        self._fifo: deque[_Entry] = deque()
        self._acked = start
        self.failure: str | None = None

    def begin(self) -> _Entry:
        entry = _Entry()
        self._fifo.append(entry)
        return entry

    @staticmethod
    def commit(entry: _Entry, end_lsn: Lsn) -> None:
        entry.end_lsn = end_lsn
        entry.closed = True

    def position(self, lsn: Lsn) -> None:
        """The server has sent everything up to ``lsn`` (a keepalive): confirmable once all before it is."""
        if not self._fifo:
            if lsn > self._acked and self.failure is None:
                self._acked = lsn
            return
        entry = _Entry()
        entry.end_lsn = lsn
        entry.closed = True
        self._fifo.append(entry)

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason

    def acknowledged(self) -> Lsn:
        if self.failure is not None:
            return self._acked
        fifo = self._fifo
        while fifo and fifo[0].closed and fifo[0].pending == 0:
            end = fifo.popleft().end_lsn
            if end > self._acked:
                self._acked = end
        return self._acked

    @property
    def idle(self) -> bool:
        """Nothing open and nothing awaiting acknowledgment."""
        self.acknowledged()
        return not self._fifo


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str] = field(default_factory=dict)
    compacted: bool = True  # change topics are; a dead-letter topic keeps every record


def producer_config(bootstrap_servers: str, extra: Mapping[str, Any], max_record_bytes: int) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        # Retry through broker outages of minutes; a record still undelivered after this stops the pipeline.
        "message.timeout.ms": 900_000,
    }
    conf.update(extra)
    conf.update(
        {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,  # per-partition order and no retry duplicates
            "acks": "all",
            "partitioner": "murmur2_random",  # agree with JVM clients on partitions
            "message.max.bytes": max(max_record_bytes + 64 * 1024, 1_000_000),
        }
    )
    return conf


class _ToStructlog(logging.Handler):
    """librdkafka's own log lines, as structured events instead of raw stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        log.log(record.levelno, "librdkafka", message=record.getMessage())


def librdkafka_logger() -> logging.Logger:
    logger = logging.getLogger("cdc.librdkafka")
    if not logger.handlers:
        logger.addHandler(_ToStructlog())
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


_CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "client.")


def connection_settings(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The librdkafka settings of ``kafka.producer`` that every other client of the same cluster needs
    too: security (``security.protocol``, ``sasl.*``, ``ssl.*``) and ``client.*``."""
    return {k: v for k, v in extra.items() if k.startswith(_CONNECTION_PREFIXES)}


def admin_client(bootstrap_servers: str, extra: Mapping[str, Any]) -> AdminClient:
    conf = connection_settings(extra)
    conf["bootstrap.servers"] = bootstrap_servers
    conf["logger"] = librdkafka_logger()
    return AdminClient(conf)


def check_reachable(admin: AdminClient, bootstrap_servers: str, timeout: float = 15.0) -> None:
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as e:
        raise SinkError(
            f"cannot reach Kafka at {bootstrap_servers} within {timeout:.0f}s ({e.args[0].str() if e.args else e}). "
            "Fix: check kafka.bootstrap_servers, that the broker is running and reachable, and that the listener's "
            "security matches kafka.producer (security.protocol; ssl.ca.location: the CA that signed the broker's "
            "certificate; sasl.*): a TLS or SASL failure is logged before this (librdkafka events)."
        ) from None


def ensure_topics(admin: AdminClient, specs: Iterable[TopicSpec], timeout: float = 30.0) -> dict[str, int]:
    """Create missing topics compacted; refuse existing ones whose policy or partitions contradict the spec.

    Returns the partition count of every topic.
    """
    specs = list(specs)
    metadata = admin.list_topics(timeout=timeout)
    existing = {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}
    problems: list[str] = []
    to_create = []
    for spec in specs:
        if spec.name in existing:
            if existing[spec.name] != spec.partitions:
                problems.append(
                    f"topic {spec.name} has {existing[spec.name]} partitions, the configuration says "
                    f"{spec.partitions}. Changing a change topic's partitions would reorder rows: set "
                    f"kafka.partitions to {existing[spec.name]} (or a per-table override), or delete the topic."
                )
            continue
        config = {"cleanup.policy": "compact" if spec.compacted else "delete", **spec.config}
        to_create.append(NewTopic(spec.name, spec.partitions, spec.replication_factor, config=config))
    existing_specs = [s for s in specs if s.name in existing and s.compacted]
    if existing_specs:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in existing_specs]
        for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
            configs = future.result()
            policy = configs["cleanup.policy"].value if "cleanup.policy" in configs else "delete"
            if "compact" not in str(policy).split(","):
                problems.append(
                    f"topic {resource.name} has cleanup.policy={policy}; change topics must be compacted. Fix: "
                    f"kafka-configs --alter --entity-type topics --entity-name {resource.name} "
                    "--add-config cleanup.policy=compact (or delete the topic so it is recreated)."
                )
    if problems:
        raise SinkError("topics do not match the configuration:\n  " + "\n  ".join(problems))
    if to_create:
        for name, future in admin.create_topics(to_create, request_timeout=timeout).items():
            try:
                future.result()
            except KafkaException as e:
                err = e.args[0]
                if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise SinkError(f"cannot create topic {name}: {err.str()}") from None
            log.info("topic_created", topic=name)
        wait_until_led(admin, [(t.topic, t.num_partitions) for t in to_create], timeout)
    return {s.name: existing.get(s.name, s.partitions) for s in specs}


_REFUSED = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError._INVALID_ARG,
    KafkaError.UNSUPPORTED_VERSION,
)


def wait_until_led(admin: AdminClient, topics: Iterable[tuple[str, int]], timeout: float = 30.0) -> None:
    """Return once every partition of these just-created topics answers ListOffsets from its leader.

    A created topic is in the metadata, with a leader, a moment before that broker leads the partition.
    A produce in that moment fails NOT_LEADER_FOR_PARTITION and is retried, but librdkafka (2.16) may
    count those first batches as delivered when a later batch in flight succeeds: the broker, holding no
    state for the producer on a new partition, takes the later sequence without a gap error, and the
    first records are gone with a success report (measured: 14 topics in 700 lost 1-2 of 40
    records; confluent-kafka-go#921 describes the same implicit ack). Nothing is produced to a topic
    before this returns.
    """
    pending = [TopicPartition(topic, p) for topic, n in topics for p in range(n)]
    deadline = time.monotonic() + timeout
    next_log = 0.0
    last = ""
    while pending:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = admin.list_offsets({tp: latest for tp in pending}, request_timeout=timeout)
        failed = []
        for tp, future in futures.items():
            try:
                future.result()
            except KafkaException as e:
                err = e.args[0] if e.args else None
                # A new partition answers a handful of transient codes before it is led (NOT_LEADER,
                # UNKNOWN_LEADER_EPOCH, _NOENT while the admin client's cache lacks the leader...):
                # all are waited out until the deadline, except a refusal that waiting cannot change.
                if not isinstance(err, KafkaError) or err.code() in _REFUSED:
                    raise SinkError(f"topic {tp.topic} partition {tp.partition} is not readable: {e}") from None
                failed.append(TopicPartition(tp.topic, tp.partition))
                last = err.str()
        pending = failed
        if pending and time.monotonic() > deadline:
            raise SinkError(
                f"{len(pending)} partitions of just-created topics have no ready leader after {timeout:.0f}s "
                f"({last}), e.g. {pending[0].topic} [{pending[0].partition}]: check the brokers' health "
                "(kafka-topics --describe) and restart"
            )
        if pending:
            if time.monotonic() >= next_log:  # the first time, then every 5 s while it lasts
                log.info("topic_leaders_waiting", partitions=len(pending), error=last)
                next_log = time.monotonic() + 5.0
            time.sleep(0.1)
            for topic in {tp.topic for tp in pending}:  # list_offsets finds leaders in this cache only
                admin.list_topics(topic=topic, timeout=max(1.0, deadline - time.monotonic()))


_NOT_READY = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
)


def watermarks(consumer: Consumer, partition: TopicPartition, timeout: float) -> tuple[int, int]:
    """(low, high) of a partition, waiting out a topic created a moment ago (no leader yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=max(1.0, deadline - time.monotonic()))
            return int(low), int(high)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            retry = isinstance(err, KafkaError) and (err.retriable() or err.code() in _NOT_READY)
            if not retry or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_to_end(
    bootstrap_servers: str,
    extra: Mapping[str, Any],
    topic: str,
    *,
    group_id: str,
    what: str,
    on_record: Callable[[bytes | None, bytes | None], None],
    timeout: float = 30.0,
) -> None:
    """Hand every record of the single-partition compacted ``topic`` to ``on_record(key, value)``, in
    offset order, from its first offset to its end when reading began, as read_committed consumers
    see it. A missing topic has no records. ``what`` names the topic in errors (``SinkError``)."""
    conf = connection_settings(extra)
    conf.update(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer = Consumer(conf, logger=librdkafka_logger())
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return  # no topic yet: nothing was written
        low, high = watermarks(consumer, TopicPartition(topic, 0), timeout)
        if high <= low:
            return
        consumer.assign([TopicPartition(topic, 0, low)])
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise SinkError(f"reading {what} {topic} did not finish within {timeout:.0f}s")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return
                raise SinkError(f"cannot read {what} {topic}: {err.str()}")
            on_record(msg.key(), msg.value())
            offset = msg.offset()
            if offset is not None and offset + 1 >= high:
                return
    except KafkaException as e:
        raise SinkError(f"cannot read {what} {topic}: {e}") from None
    finally:
        consumer.close()
