"""Snapshot progress that survives a crash: what was planned, which chunks are in Kafka, what DBLog still owes.

The records live in a compacted topic (``<topic_prefix>.__cdc_snapshot`` by
default, one partition), keyed ``<slot>/<what>``, values JSON:

=============================  ==================================================================
key                            value
=============================  ==================================================================
``<slot>/initial``             the initial snapshot: status (pending, copying, done, resumed),
                               consistent point, snapshot xmin, when it started
``<slot>/plan/<table>``        how the table was cut (``TablePlan``)
``<slot>/chunk/<table>/<i>``   chunk i of the table is acknowledged by Kafka: ``{"rows": n}``
``<slot>/covered``             the tables the slot's topics are complete for, by name and oid
``<slot>/job/<id>``            a DBLog pass over some key ranges of one table (``Job``)
``<slot>/signal/<id>``         a signal-table row handled: accepted or rejected, and why
=============================  ==================================================================

A chunk's record is written only after Kafka acknowledged every row of the chunk;
a DBLog job's progress only after Postgres confirmed the slot past the chunk's
high watermark (see ``cdc.snapshot.incremental``). Losing a progress record
therefore only repeats work, never skips it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import orjson
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from cdc.lsn import Lsn
from cdc.sink.kafka import (
    SinkError,
    TopicSpec,
    admin_client,
    connection_settings,
    ensure_topics,
    librdkafka_logger,
    read_to_end,
    watermarks,
)
from cdc.sink.record import Record
from cdc.snapshot.plan import KeyRange, KeyValue, TablePlan

log = structlog.get_logger(__name__)

__all__ = [
    "InitialStatus",
    "Job",
    "JobRange",
    "JobReason",
    "JobStatus",
    "KafkaStore",
    "MemoryStore",
    "ProgressStore",
    "SnapshotState",
    "StoreError",
    "chunk_key",
    "chunk_record",
    "progress_record",
    "topics_holding_records",
]


class StoreError(Exception):
    """The progress topic cannot be read or written; the message names the problem and the fix."""


class ProgressStore(Protocol):
    """Key -> JSON object; a None value deletes the key."""

    def load(self) -> dict[str, dict[str, Any]]: ...
    def put(self, key: str, value: Mapping[str, Any] | None) -> None: ...
    def flush(self, timeout: float = 30.0) -> None: ...
    def record(self, key: str, value: Mapping[str, Any]) -> Record | None: ...  # for another producer to write


class MemoryStore:
    """A ProgressStore in memory, for tests and for snapshots that need not resume."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, Any]] = {}
        self.writes = 0

    def load(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self.data.items()}

    def put(self, key: str, value: Mapping[str, Any] | None) -> None:
        self.writes += 1
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = orjson.loads(orjson.dumps(value))

    def flush(self, timeout: float = 30.0) -> None:
        return None

    def record(self, key: str, value: Mapping[str, Any]) -> Record | None:
        """None: nothing to produce; the value is kept here at once."""
        self.put(key, value)
        return None


class KafkaStore:
    """A ProgressStore on a compacted single-partition topic, one namespace per slot."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        slot: str,
        *,
        extra: Mapping[str, Any] | None = None,
        replication_factor: int = 1,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._prefix = f"{slot}/"
        self._extra = dict(extra or {})
        self._replication_factor = replication_factor
        self._producer: Producer | None = None
        self._failure: str | None = None
        self._lock = threading.Lock()

    @property
    def topic(self) -> str:
        return self._topic

    def ensure_topic(self) -> None:
        admin = admin_client(self._bootstrap, self._extra)
        ensure_topics(admin, [TopicSpec(self._topic, 1, self._replication_factor)])

    def _producer_for_puts(self) -> Producer:
        if self._producer is None:
            conf = connection_settings(self._extra)
            conf.update(
                {"bootstrap.servers": self._bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
            )
            self._producer = Producer(conf, logger=librdkafka_logger())
        return self._producer

    def load(self, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        state: dict[str, dict[str, Any]] = {}
        prefix = self._prefix

        def record(raw_key: bytes | None, value: bytes | None) -> None:
            key = raw_key.decode() if isinstance(raw_key, bytes) else ""
            if not key.startswith(prefix):
                return
            if value is None:
                state.pop(key[len(prefix) :], None)
            else:
                state[key[len(prefix) :]] = orjson.loads(value)

        try:
            read_to_end(
                self._bootstrap,
                self._extra,
                self._topic,
                group_id=f"cdc-snapshot-state-{prefix[:-1]}",
                what="the snapshot progress topic",
                on_record=record,
                timeout=timeout,
            )
        except SinkError as e:
            raise StoreError(str(e)) from None
        return state

    def record(self, key: str, value: Mapping[str, Any]) -> Record:
        """What ``put`` would write, as a record for another producer (a transactional one) to write."""
        return progress_record(self._topic, self._prefix[:-1], key, value)

    def put(self, key: str, value: Mapping[str, Any] | None) -> None:
        payload = orjson.dumps(value) if value is not None else None

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None and self._failure is None:
                self._failure = f"cannot write snapshot progress to {self._topic}: {err.str()}"

        with self._lock:
            producer = self._producer_for_puts()
            while True:
                try:
                    producer.produce(
                        self._topic, payload, (self._prefix + key).encode(), partition=0, on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        with self._lock:
            if self._producer is not None and self._producer.flush(timeout):
                raise StoreError(
                    f"snapshot progress was not acknowledged by Kafka ({self._topic}) within {timeout:.0f}s"
                )
        if self._failure is not None:
            raise StoreError(self._failure)


def progress_record(topic: str, slot: str, key: str, value: Mapping[str, Any]) -> Record:
    """The record a ``KafkaStore`` of ``slot`` on ``topic`` holds for ``key``."""
    return Record(topic, f"{slot}/{key}".encode(), orjson.dumps(value), (), 0)


def chunk_key(table: str, index: int) -> str:
    return f"chunk/{table}/{index}"


def chunk_record(topic: str, slot: str, table: str, index: int, rows: int) -> Record:
    """The record that says chunk ``index`` of ``table`` is copied (``SnapshotState.chunk_done``)."""
    return progress_record(topic, slot, chunk_key(table, index), {"rows": rows})


def topics_holding_records(
    bootstrap_servers: str, extra: Mapping[str, Any], topics: Iterable[str], timeout: float = 30.0
) -> set[str]:
    """Which of these topics already hold records (a new initial snapshot must first mark them truncated)."""
    conf = connection_settings(extra)
    conf.update({"bootstrap.servers": bootstrap_servers, "group.id": "cdc-snapshot-probe", "enable.auto.commit": False})
    consumer = Consumer(conf, logger=librdkafka_logger())
    holding: set[str] = set()
    try:
        metadata = consumer.list_topics(timeout=timeout)
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                continue
            for p in meta.partitions:
                low, high = watermarks(consumer, TopicPartition(topic, p), timeout)
                if high > low:
                    holding.add(topic)
                    break
    except KafkaException as e:
        raise StoreError(f"cannot read the offsets of {sorted(topics)}: {e}") from None
    finally:
        consumer.close()
    return holding


# --------------------------------------------------------------------------- typed state


class InitialStatus(StrEnum):
    """Where a slot's initial snapshot stands: the ``status`` of the ``<slot>/initial`` record. Every
    state persists (it is written to the progress topic); the values are the stored strings.

    Transitions, and who makes them:

    * (none) -> ``PENDING``: ``SnapshotState.begin_initial``, when ``InitialSnapshot`` starts a new
      snapshot, before the slot exists; the previous snapshot's records are forgotten.
    * ``PENDING`` -> ``COPYING``: ``InitialSnapshot``, once the slot stands at its consistent point and
      every table is planned.
    * ``COPYING`` -> ``DONE``: ``InitialSnapshot``, when every chunk is in Kafka.
    * ``COPYING`` -> ``COPYING`` (with ``deferred`` tables): ``InitialSnapshot``, when chunks of tables
      rewritten during the copy were left; ``Snapshots`` then resumes at once (below).
    * ``PENDING``/``COPYING`` -> ``RESUMED``: ``Snapshots._resume``, after an interruption (the next
      start's plan, ``cdc.snapshot.modes``, resumes on these two) or deferred chunks: what was not
      recorded as copied became DBLog jobs (``JobReason.RESUME_INITIAL``).
    """

    PENDING = "pending"  # about to create the slot; nothing read yet
    COPYING = "copying"  # slot at the consistent point, chunks being copied
    DONE = "done"  # every chunk in Kafka; streaming from the consistent point
    RESUMED = "resumed"  # interrupted; what was left became DBLog jobs


class JobStatus(StrEnum):
    """Where a DBLog job stands: ``Job.status``, persisted in its ``<slot>/job/<id>`` record.

    * (new) -> ``PENDING``: ``new_job`` (``cdc.snapshot.reader``), for every reason in ``JobReason``.
    * ``PENDING`` -> ``DONE``: ``IncrementalReader._finish``, when its last range is read; the record
      is written once Postgres confirmed the slot past the last chunk's high watermark.
    * ``PENDING`` -> ``FAILED``: ``IncrementalReader._finish``, when the table is no longer captured,
      was dropped or recreated, or cannot be read (``Job.error`` says why); written at once.

    ``DONE`` and ``FAILED`` are final (``Job.finished``).
    """

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class JobReason(StrEnum):
    """Why a DBLog job exists: ``Job.reason``, persisted with the job; set once, by whoever creates it."""

    RESUME_INITIAL = "resume_initial"  # Snapshots._resume: chunks of an interrupted initial snapshot
    NEW_TABLE = "new_table"  # Snapshots: a table captured after the initial snapshot (start-up or reload)
    SIGNAL = "signal"  # IncrementalReader: an accepted signal-table row asking for a snapshot
    REQUEST = "request"  # Snapshots.request (no caller in the daemon today)


@dataclass(slots=True)
class JobRange:
    """Part of a DBLog job: rows with ``lower < key <= upper``, done up to ``last``.

    ``upper`` None on an unresolved range means "the largest key when the range
    starts" (rows inserted later come through the stream); it is then fixed.
    """

    lower: KeyValue | None
    upper: KeyValue | None
    last: KeyValue | None = None
    resolved: bool = False
    done: bool = False

    def remaining(self) -> KeyRange:
        return KeyRange(self.last if self.last is not None else self.lower, self.upper)

    def to_json(self) -> dict[str, Any]:
        return {
            "lower": list(self.lower) if self.lower is not None else None,
            "upper": list(self.upper) if self.upper is not None else None,
            "last": list(self.last) if self.last is not None else None,
            "resolved": self.resolved,
            "done": self.done,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobRange:
        def key(v: Any) -> KeyValue | None:
            return tuple(str(x) for x in v) if v is not None else None

        return cls(
            key(data.get("lower")),
            key(data.get("upper")),
            key(data.get("last")),
            bool(data.get("resolved")),
            bool(data.get("done")),
        )


@dataclass(slots=True)
class Job:
    """A DBLog pass over key ranges of one table, resumable from each range's last key."""

    id: str
    table: str
    oid: int
    reason: JobReason
    ranges: list[JobRange]
    status: JobStatus = JobStatus.PENDING
    error: str | None = None
    rows: int = 0
    created_us: int = field(default_factory=lambda: time.time_ns() // 1000)
    key: tuple[str, ...] = ()  # the chunk key the ranges' values belong to; () until the first read

    @property
    def finished(self) -> bool:
        return self.status != JobStatus.PENDING

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "table": self.table,
            "oid": self.oid,
            "reason": self.reason,
            "ranges": [r.to_json() for r in self.ranges],
            "status": self.status,
            "error": self.error,
            "rows": self.rows,
            "created_us": self.created_us,
            "key": list(self.key),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        return cls(
            id=str(data["id"]),
            table=str(data["table"]),
            oid=int(data["oid"]),
            reason=JobReason(data["reason"]),
            ranges=[JobRange.from_json(r) for r in data["ranges"]],
            status=JobStatus(data.get("status", JobStatus.PENDING)),
            error=data.get("error"),
            rows=int(data.get("rows", 0)),
            created_us=int(data.get("created_us", 0)),
            key=tuple(str(k) for k in data.get("key", ())),
        )

    def copy(self) -> Job:
        return Job.from_json(self.to_json())


class SnapshotState:
    """The typed view of one slot's records in a ProgressStore. Thread-safe."""

    def __init__(self, store: ProgressStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._data = store.load()

    @property
    def store(self) -> ProgressStore:
        return self._store

    def _put(self, key: str, value: Mapping[str, Any] | None) -> None:
        if value is None:
            self._data.pop(key, None)
        else:
            self._data[key] = dict(value)
        self._store.put(key, value)

    def flush(self) -> None:
        self._store.flush()

    # -- the initial snapshot -------------------------------------------------------------------

    def initial(self) -> dict[str, Any] | None:
        with self._lock:
            value = self._data.get("initial")
            return dict(value) if value is not None else None

    def begin_initial(self) -> None:
        """A new initial snapshot: forget everything of the previous one (and of its jobs), mark it pending."""
        with self._lock:
            for key in list(self._data):
                if key.startswith(("plan/", "chunk/", "job/")) or key in ("covered", "initial"):
                    self._put(key, None)
            self._put("initial", {"status": InitialStatus.PENDING, "started_us": time.time_ns() // 1000})
        self._store.flush()

    def set_initial(self, status: InitialStatus, **fields: Any) -> None:
        with self._lock:
            value = dict(self._data.get("initial") or {})
            value.update(fields)
            value["status"] = status
            self._put("initial", value)

    def save_plan(self, plan: TablePlan) -> None:
        with self._lock:
            self._put(f"plan/{plan.table}", plan.to_json())

    def plans(self) -> dict[str, TablePlan]:
        with self._lock:
            return {k[5:]: TablePlan.from_json(v) for k, v in self._data.items() if k.startswith("plan/")}

    def chunk_done(self, table: str, index: int, rows: int) -> None:
        with self._lock:
            self._put(chunk_key(table, index), {"rows": rows})

    def done_chunks(self, table: str) -> dict[int, int]:
        prefix = f"chunk/{table}/"
        with self._lock:
            return {int(k[len(prefix) :]): int(v["rows"]) for k, v in self._data.items() if k.startswith(prefix)}

    # -- coverage: the tables whose topics are (or will be, by a pending job) complete ----------

    def covered(self) -> dict[str, int]:
        with self._lock:
            value = self._data.get("covered")
            return {str(k): int(v) for k, v in (value or {}).get("tables", {}).items()}

    def cover(self, tables: Mapping[str, int]) -> None:
        with self._lock:
            current = {str(k): int(v) for k, v in (self._data.get("covered") or {}).get("tables", {}).items()}
            current.update(tables)
            self._put("covered", {"tables": current})

    # -- DBLog jobs ----------------------------------------------------------------------------

    def jobs(self) -> list[Job]:
        with self._lock:
            jobs = [Job.from_json(v) for k, v in self._data.items() if k.startswith("job/")]
        return sorted(jobs, key=lambda j: (j.created_us, j.id))

    def save_job(self, job: Job) -> None:
        with self._lock:
            self._put(f"job/{job.id}", job.to_json())

    def job_record(self, job: Job) -> Record | None:
        """The job's record for the caller to produce (in a Kafka transaction) instead of ``save_job``; None
        when the store keeps it without one."""
        with self._lock:
            value = job.to_json()
            self._data[f"job/{job.id}"] = value
            return self._store.record(f"job/{job.id}", value)

    # -- signals -------------------------------------------------------------------------------

    def signal_handled(self, signal_id: str) -> bool:
        with self._lock:
            return f"signal/{signal_id}" in self._data

    def handle_signal(self, signal_id: str, status: str, reason: str | None = None) -> None:
        with self._lock:
            self._put(f"signal/{signal_id}", {"status": status, "reason": reason})


def lsn_of(value: Any) -> Lsn | None:
    return Lsn.parse(str(value)) if value else None
