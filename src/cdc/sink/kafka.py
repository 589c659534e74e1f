"""The Kafka side: topics, the idempotent producer, and the acknowledged position.

The commit order that keeps invariant 1 (Postgres is told an LSN is flushed
only after everything up to it is durable in Kafka):

1. Each source transaction gets an entry in the ``AckTracker``'s FIFO at Begin.
2. Every record of it is produced with that entry's delivery callback; the
   entry counts records not yet acknowledged by the broker (``acks=all``).
3. At Commit the entry is closed with the commit's end LSN.
4. ``AckTracker.acknowledged()`` is the end LSN of the longest prefix of closed
   entries with nothing pending. Only that LSN is ever confirmed to Postgres.
5. A failed delivery poisons the tracker: nothing after it is confirmed, and
   the pipeline stops (``DeliveryFailed``), so a restart resends from the last
   confirmed LSN.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # type: ignore[attr-defined]

from cdc.lsn import Lsn
from cdc.sink.record import Record

log = structlog.get_logger(__name__)


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


class AckTracker:
    """Knows the highest LSN below which everything handed to Kafka is durable."""

    def __init__(self, start: Lsn = Lsn(0)) -> None:
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


class KafkaSink:
    """Produces records and tracks their acknowledgment; reports in-flight bytes for backpressure."""

    def __init__(self, config: Mapping[str, Any], tracker: AckTracker, *, max_record_bytes: int) -> None:
        self._producer = Producer(dict(config))
        self._tracker = tracker
        self._max_record_bytes = max_record_bytes
        self.inflight_bytes = 0
        self.inflight_records = 0
        self.delivered = 0

    def send(self, record: Record, entry: _Entry, *, describe: str = "") -> None:
        """Hand one record to the producer, charged to ``entry``. Blocks (polling) while librdkafka's queue is full."""
        value = record.value
        if value is not None and len(value) > self._max_record_bytes:
            raise RecordTooLarge(
                f"record for {describe or record.topic} key {record.key[:200]!r} is {len(value)} bytes, "
                f"over limits.max_record_bytes={self._max_record_bytes}. Raise limits.max_record_bytes (and the "
                "topic's max.message.bytes), or exclude the large column."
            )
        size = record.size
        entry.pending += 1
        kwargs: dict[str, Any] = {}
        if record.partition is not None:
            kwargs["partition"] = record.partition
        if record.headers:
            kwargs["headers"] = list(record.headers)

        def delivered(err: KafkaError | None, msg: Message, _entry: _Entry = entry, _size: int = size) -> None:
            self.inflight_bytes -= _size
            self.inflight_records -= 1
            if err is not None:
                self._tracker.fail(
                    f"delivery to {msg.topic()} failed: {err.str()} (code {err.name()}); "
                    "nothing after the last acknowledged transaction is confirmed"
                )
                return
            _entry.pending -= 1
            self.delivered += 1

        while True:
            try:
                self._producer.produce(record.topic, value, record.key, on_delivery=delivered, **kwargs)
                break
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as e:
                entry.pending -= 1
                raise SinkError(f"cannot produce to {record.topic}: {e}") from None
        self.inflight_bytes += size
        self.inflight_records += 1

    def retarget(self, tracker: AckTracker) -> None:
        """Charge later deliveries to a new tracker (after a reconnect, once everything was flushed)."""
        self._tracker = tracker

    def poll(self, timeout: float = 0.0) -> None:
        self._producer.poll(timeout)
        if self._tracker.failure is not None:
            raise DeliveryFailed(self._tracker.failure)

    def flush(self, timeout: float) -> int:
        """Wait for outstanding deliveries; returns how many are still outstanding."""
        remaining: int = self._producer.flush(timeout)
        if self._tracker.failure is not None:
            raise DeliveryFailed(self._tracker.failure)
        return remaining


def admin_client(bootstrap_servers: str, extra: Mapping[str, Any]) -> AdminClient:
    conf = {k: v for k, v in extra.items() if k.startswith(("security.", "sasl.", "ssl.", "client."))}
    conf["bootstrap.servers"] = bootstrap_servers
    return AdminClient(conf)


def check_reachable(admin: AdminClient, bootstrap_servers: str, timeout: float = 15.0) -> None:
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as e:
        raise SinkError(
            f"cannot reach Kafka at {bootstrap_servers} within {timeout:.0f}s ({e.args[0].str() if e.args else e}). "
            "Fix: check kafka.bootstrap_servers and that the broker is running and reachable."
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
        config = {"cleanup.policy": "compact", **spec.config}
        to_create.append(NewTopic(spec.name, spec.partitions, spec.replication_factor, config=config))
    existing_specs = [s for s in specs if s.name in existing]
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
    return {s.name: existing.get(s.name, s.partitions) for s in specs}
