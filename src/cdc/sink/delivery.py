"""How records reach Kafka and when a source position counts as delivered: at least once, or exactly once.

Both strategies answer the pipeline through the same small interface
(``Delivery``): the pipeline opens and closes source transactions, hands over
records, and asks for the LSN it may confirm to Postgres. Nothing in here
knows pgoutput.

At least once (default), the order of things:

1. Each source transaction gets an entry in the ``AckTracker`` at Begin.
2. Its records are produced (idempotent producer, ``acks=all``); each delivery
   report decrements the entry's pending count.
3. At Commit the entry is closed with the commit's end LSN.
4. The LSN confirmed to Postgres is the end LSN of the longest prefix of closed
   entries with nothing pending (invariant 1). A failed delivery freezes it and
   stops the pipeline; a restart resends from there.

Exactly once, the order of things:

1. At start, ``init_transactions`` fences any older producer with the same
   ``transactional.id`` (derived from the slot) and aborts its open transaction.
2. The last committed position is read (``read_committed``) from the compacted
   offsets topic, key = slot. Source transactions whose commit LSN is at or
   below it are skipped: they are already in Kafka.
3. Whole source transactions are appended to one open Kafka transaction.
4. When the open Kafka transaction is due (age or record count, always at a
   source transaction boundary), the position record (commit LSN and end LSN of
   the last included source transaction) is produced to the offsets topic, last.
5. ``commit_transaction``; only after it returns is that end LSN confirmable.

A source transaction of any size: once the open Kafka transaction holds
``split_records`` records, or has been open half of ``transaction.timeout.ms``,
it is committed inside the source transaction, with a position that says so: the
source transaction's commit LSN, the records of it already in Kafka, and a digest
of the last one (``Position.records``, ``Position.last``). The confirmable LSN
stays at the previous whole transaction. A restart (Postgres sends the whole
transaction again) drops that many of its records, checks that the last one
dropped is the recorded one, and goes on from there: no duplicate, no gap. A
read_committed consumer then sees such a transaction in several Kafka commits.
Where several records must stay in one Kafka transaction (a snapshot chunk's rows
and its progress record), ``keep_together`` holds the split back.

The initial snapshot's workers deliver exactly once with
``cdc.sink.chunks.ChunkTransactions``: a chunk's rows and its progress record in
one Kafka transaction per chunk.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from cdc.event import TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.sink.kafka import AckTracker, DeliveryFailed, RecordTooLarge, SinkError, librdkafka_logger, read_to_end
from cdc.sink.record import Record
from cdc.sink.wire import DEAD_LETTER_REASON_HEADER

log = structlog.get_logger(__name__)


class RetryableSinkError(SinkError):
    """Kafka aborted the open transaction; resume from the last committed position."""


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """Where records that cannot be delivered go instead of stopping the pipeline."""

    topic: str


class Delivery(Protocol):
    inflight_bytes: int
    inflight_records: int
    dead_lettered: int

    def begin(self, tx: TxBegin) -> bool: ...  # False: already delivered, skip the transaction
    def send(self, record: Record, describe: str) -> None: ...
    def commit(self, tx: TxCommit) -> None: ...
    def position(self, lsn: Lsn) -> None: ...  # the server sent everything up to lsn (keepalive)
    def send_outside(self, record: Record) -> None: ...  # a record outside source transactions (heartbeat)
    def tick(self) -> None: ...  # serve delivery reports; finish what is due
    def acknowledged(self) -> Lsn: ...
    def drain(self, timeout: float) -> int: ...  # deliver what is in flight; returns what is left
    def reset(self) -> None: ...  # after a lost replication connection, once drained
    def keep_together(self, on: bool) -> None: ...  # exactly once: no Kafka commit inside what follows, until off


class Producing:
    """What both strategies share: produce with accounting, the size limit, dead letters."""

    def __init__(self, producer: Producer, max_record_bytes: int, dead_letters: DeadLetters | None) -> None:
        self._producer = producer
        self._max_record_bytes = max_record_bytes
        self._dead_letters = dead_letters
        self.inflight_bytes = 0
        self.inflight_records = 0
        self.dead_lettered = 0
        self.delivered = 0
        self.failure: str | None = None

    def _oversized(self, record: Record, describe: str) -> Record | None:
        """The record to send in place of an oversized one, or an error."""
        assert record.value is not None
        size = len(record.value)
        if self._dead_letters is None:
            raise RecordTooLarge(
                f"record for {describe} key {record.key[:200].decode(errors='replace')} is {size} bytes, over "
                f"limits.max_record_bytes={self._max_record_bytes}. Fix: raise limits.max_record_bytes (and the "
                "topic's max.message.bytes), exclude the large column, or set limits.dead_letter_topic."
            )
        self.dead_lettered += 1
        log.error(
            "record_dead_lettered",
            table=describe,
            topic=record.topic,
            key=record.key[:200].decode(errors="replace"),
            size=size,
            limit=self._max_record_bytes,
            dead_letter_topic=self._dead_letters.topic,
        )
        reason = {
            "reason": "record_too_large",
            "topic": record.topic,
            "size": size,
            "limit": self._max_record_bytes,
            "table": describe,
        }
        return Record(
            self._dead_letters.topic,
            record.key,
            orjson.dumps(reason),
            record.headers + ((DEAD_LETTER_REASON_HEADER, b"record_too_large"),),
        )

    def _produce(self, record: Record, describe: str, on_done: Any, *, critical: bool = True) -> None:
        topic, key, value, headers, partition = record
        if value is not None and len(value) > self._max_record_bytes:
            replacement = self._oversized(record, describe)
            if replacement is None:
                return
            record = replacement
            topic, key, value, headers, partition = record
        # The bytes the record holds while in flight; position headers (four short ones) are counted
        # as a flat allowance, anything longer (key-change headers carry keys) exactly.
        if len(headers) <= 4:
            size = len(topic) + len(key) + (len(value) if value is not None else 0) + 64 * len(headers)
        else:
            size = record.size

        def delivered(err: KafkaError | None, msg: Message) -> None:
            self.inflight_bytes -= size
            self.inflight_records -= 1
            if err is not None:
                if not critical:
                    log.warning("delivery_failed_noncritical", topic=msg.topic(), error=err.str())
                    return
                if self.failure is None:
                    self.failure = (
                        f"delivery to {msg.topic()} failed: {err.str()} ({err.name()}); "
                        "nothing after the last delivered transaction is confirmed"
                    )
                on_done(False)
                return
            self.delivered += 1
            on_done(True)

        # Headers as a dict: confluent-kafka converts one faster than a list of pairs; a list when
        # two headers share a name (a dict would keep one); None when there are none (kafka.position_headers
        # off): an empty dict still gives librdkafka a header list to carry.
        by_name: Any = None
        if headers:
            by_name = dict(headers)
            if len(by_name) != len(headers):
                by_name = list(headers)
        produce = self._producer.produce
        while True:
            try:
                if partition is None:
                    produce(topic, value, key, on_delivery=delivered, headers=by_name)
                else:
                    produce(topic, value, key, on_delivery=delivered, headers=by_name, partition=partition)
                break
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as e:
                raise classify(e, f"cannot produce to {topic}") from None
        self.inflight_bytes += size
        self.inflight_records += 1


def classify(e: KafkaException, what: str) -> SinkError:
    err = e.args[0] if e.args else None
    if isinstance(err, KafkaError):
        text = f"{what}: {err.str()} ({err.name()})"
        if err.txn_requires_abort() or err.retriable():
            return RetryableSinkError(text)
        if err.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED):
            return SinkError(text + ". Fix: grant this client WRITE on the topics (and the transactional id).")
        return SinkError(text)
    return SinkError(f"{what}: {e}")


class AtLeastOnce(Producing):
    """Idempotent producer; Postgres holds the durable position (the slot's confirmed LSN)."""

    def __init__(
        self, config: Mapping[str, Any], *, max_record_bytes: int, dead_letters: DeadLetters | None = None
    ) -> None:
        super().__init__(Producer(dict(config), logger=librdkafka_logger()), max_record_bytes, dead_letters)
        self._tracker = AckTracker()
        self._entry: Any = None
        self._done: Any = ignore

    def begin(self, tx: TxBegin) -> bool:
        entry = self._tracker.begin()
        tracker = self._tracker

        def done(ok: bool) -> None:
            if ok:
                entry.pending -= 1
            else:
                tracker.fail(self.failure or "delivery failed")

        # One callback per source transaction, not one per record: send() is on the per-row path.
        self._entry, self._done = entry, done
        return True

    def send(self, record: Record, describe: str) -> None:
        entry = self._entry
        if entry is None:
            raise SinkError(f"a record for {describe} arrived outside a source transaction")
        entry.pending += 1
        try:
            self._produce(record, describe, self._done)
        except BaseException:  # not delivered after all: uncount it, and let the error go on
            entry.pending -= 1
            raise

    def send_outside(self, record: Record) -> None:
        self._produce(record, record.topic, ignore, critical=False)

    def commit(self, tx: TxCommit) -> None:
        if self._entry is None:
            raise SinkError("a Commit arrived without its Begin")
        self._tracker.commit(self._entry, tx.end_lsn)
        self._entry = None

    def position(self, lsn: Lsn) -> None:
        self._tracker.position(lsn)

    def tick(self) -> None:
        self._producer.poll(0)
        if self.failure is not None:
            raise DeliveryFailed(self.failure)

    def acknowledged(self) -> Lsn:
        return self._tracker.acknowledged()

    def drain(self, timeout: float) -> int:
        remaining: int = self._producer.flush(timeout)
        if self.failure is not None:
            raise DeliveryFailed(self.failure)
        return remaining

    def reset(self) -> None:
        """A new replication session resends from the confirmed LSN: start a fresh tracker there."""
        self._tracker = AckTracker(self._tracker.acknowledged())
        self._entry = None

    def keep_together(self, on: bool) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Position:
    commit_lsn: Lsn
    end_lsn: Lsn  # of the last whole source transaction in Kafka: what may be confirmed
    records: int | None = None  # the transaction at commit_lsn is in Kafka up to this many records; None: whole
    last: str | None = None  # digest of that last record (topic and key), checked when resuming after it


def _digest(record: Record) -> str:
    return hashlib.sha256(record.topic.encode() + b"\0" + record.key).hexdigest()[:32]


def read_position(bootstrap: str, extra: Mapping[str, Any], topic: str, slot: str, timeout: float = 30.0) -> Position | None:
    """The last committed position of ``slot`` in the offsets topic, read as read_committed consumers see it."""
    key = slot.encode()
    found: list[Position] = []

    def record(record_key: bytes | None, value: bytes | None) -> None:
        if record_key == key and value is not None:
            data = orjson.loads(value)
            records = data.get("records")
            found.append(Position(Lsn(int(data["commit_lsn"])), Lsn(int(data["end_lsn"])),
                                  int(records) if records is not None else None, data.get("last")))  # fmt: skip

    read_to_end(
        bootstrap, extra, topic, group_id=f"cdc-offsets-reader-{slot}", what="the offsets topic", on_record=record, timeout=timeout
    )
    return found[-1] if found else None


class ExactlyOnce(Producing):
    """Transactional producer: records and the committed position share one Kafka transaction."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        slot: str,
        offsets_topic: str,
        start: Position | None,
        max_record_bytes: int,
        commit_interval_s: float = 0.1,
        commit_records: int = 10_000,
        split_records: int = 1_000_000,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        conf = transactional_config(config, f"cdc-{slot}")
        # Past transaction.timeout.ms the broker would abort the open transaction and fence the producer,
        # which reports only "Local: Fatal error". A source transaction is split at half of it; one that
        # cannot be split (keep_together) stops at 90% with an error that names it.
        self._tx_timeout_ms = int(conf["transaction.timeout.ms"])
        self._max_tx_age = 0.9 * self._tx_timeout_ms / 1000
        self._split_age = 0.5 * self._tx_timeout_ms / 1000
        self._split_records = split_records
        self._together = False
        self._source_records = 0  # records of the current source transaction produced (or dropped as in Kafka)
        self._drop = 0  # records of the current source transaction still to drop: in Kafka before a restart
        producer = Producer(conf, logger=librdkafka_logger())
        super().__init__(producer, max_record_bytes, dead_letters)
        try:
            producer.init_transactions(60)  # step 1: fence zombies, finish or abort their transaction
        except KafkaException as e:
            raise classify(e, "cannot initialise the transactional producer") from None
        self._slot_key = slot.encode()
        self._offsets_topic = offsets_topic
        self._committed = start or Position(Lsn(0), Lsn(0))
        self._acked = self._committed.end_lsn
        self._commit_interval = commit_interval_s
        self._commit_records = commit_records
        self._open = False
        self._opened_at = 0.0
        self._records = 0
        self._last: TxCommit | None = None
        self._in_source_tx = False  # records of an unfinished source transaction are in the open Kafka one
        self._source_tx: TxBegin | None = None
        self._skipping = False
        self.kafka_commits = 0
        self.skipped_transactions = 0
        self.splits = 0
        log.info("exactly_once_resume", commit_lsn=str(self._committed.commit_lsn), end_lsn=str(self._committed.end_lsn),
                 records=self._committed.records)  # fmt: skip

    @property
    def committed(self) -> Position:
        return self._committed

    def begin(self, tx: TxBegin) -> bool:
        committed = self._committed
        if tx.commit_lsn < committed.commit_lsn or (tx.commit_lsn == committed.commit_lsn and committed.records is None):
            self._skipping = True  # step 2: already in Kafka
            self.skipped_transactions += 1
            return False
        self._skipping = False
        self._in_source_tx = True
        self._source_tx = tx
        self._source_records = 0
        self._drop = (committed.records or 0) if tx.commit_lsn == committed.commit_lsn else 0
        if self._drop:
            log.info("exactly_once_resume_inside", xid=tx.xid, commit_lsn=str(tx.commit_lsn), records_in_kafka=self._drop)
        if not self._open:
            self._begin_kafka()
        return True

    def _begin_kafka(self) -> None:
        try:
            self._producer.begin_transaction()
        except KafkaException as e:
            raise classify(e, "cannot begin a Kafka transaction") from None
        self._open = True
        self._opened_at = time.monotonic()
        self._records = 0

    def send(self, record: Record, describe: str) -> None:
        if self._skipping:
            return
        if self._drop:
            self._dropped(record)
            return
        self._produce(record, describe, ignore)
        self._records += 1
        self._source_records += 1
        if not self._records & 1023 and (
            self._records >= self._split_records or time.monotonic() - self._opened_at >= self._split_age
        ):
            self._split(record)

    def keep_together(self, on: bool) -> None:
        """While on, the open Kafka transaction is not split (records that only make sense together)."""
        self._together = on

    def _dropped(self, record: Record) -> None:
        """A record of a split source transaction that is already in Kafka; the last one is checked."""
        self._drop -= 1
        self._source_records += 1
        if not self._drop and self._committed.last is not None and _digest(record) != self._committed.last:
            tx = self._source_tx
            assert tx is not None
            raise SinkError(
                f"source transaction {tx.xid} (commit LSN {tx.commit_lsn}) was half in Kafka when the daemon "
                f"stopped, up to its record {self._committed.records}, but that record is now another one "
                f"({record.topic}): the configuration changed what this transaction produces (tables, columns, "
                "format, outbox) since then. Fix: start once more with the configuration it ran with, until "
                "this transaction is past (the log says exactly_once_resume_inside no more), then change it."
            )

    def _split(self, record: Record) -> None:
        """Commit the open Kafka transaction inside the source transaction (see the module's notes)."""
        if self._together:
            if time.monotonic() - self._opened_at >= self._max_tx_age:
                self._too_long()
            return
        tx = self._source_tx
        assert tx is not None and self._in_source_tx
        # whole source transactions before this one may share the Kafka transaction: confirmable up to them
        end_lsn = self._last.end_lsn if self._last is not None else self._committed.end_lsn
        position = Position(tx.commit_lsn, end_lsn, self._source_records, _digest(record))
        self._commit_kafka(position)
        self.splits += 1
        log.info("kafka_transaction_split", xid=tx.xid, commit_lsn=str(tx.commit_lsn), records_in_kafka=self._source_records)
        self._begin_kafka()

    def _too_long(self) -> None:
        tx = self._source_tx
        assert tx is not None
        raise SinkError(
            f"source transaction {tx.xid} (commit LSN {tx.commit_lsn}) has been producing for "
            f"{time.monotonic() - self._opened_at:.0f}s, {self._records} records so far, in a part that must stay "
            f"in one Kafka transaction (a snapshot chunk), and Kafka aborts a transaction open for "
            f"transaction.timeout.ms={self._tx_timeout_ms} ms. None of this Kafka transaction is visible to "
            "read_committed consumers, and a restart sends it again. Fix: raise "
            "kafka.producer.transaction.timeout.ms (the broker caps it at its transaction.max.timeout.ms, "
            "900000 by default), or lower snapshot.incremental_chunk_rows."
        )

    def send_outside(self, record: Record) -> None:
        if self._open:
            self._produce(record, record.topic, ignore, critical=False)
            return
        try:
            self._producer.begin_transaction()
            self._produce(record, record.topic, ignore, critical=False)
            self._producer.commit_transaction(60)
        except KafkaException as e:
            raise classify(e, "cannot write a heartbeat in a Kafka transaction") from None

    def commit(self, tx: TxCommit) -> None:
        if self._skipping:
            self._skipping = False
            return
        self._last = tx  # step 3: the open Kafka transaction now ends at this source transaction
        self._in_source_tx = False
        if self._records >= self._commit_records or time.monotonic() - self._opened_at >= self._commit_interval:
            self._commit_kafka()

    def position(self, lsn: Lsn) -> None:
        if not self._open and lsn > self._acked:
            self._acked = lsn

    def tick(self) -> None:
        self._producer.poll(0)
        if (
            self._open
            and not self._in_source_tx
            and self._last is not None
            and time.monotonic() - self._opened_at >= self._commit_interval
        ):
            self._commit_kafka()

    def _commit_kafka(self, inside: Position | None = None) -> None:
        """Commit the open Kafka transaction: at the end of ``self._last``, or ``inside`` a source
        transaction (a split)."""
        last = self._last
        assert (last is not None or inside is not None) and self._open
        if inside is not None:
            assert self._source_tx is not None
            position = {"commit_lsn": int(inside.commit_lsn), "end_lsn": int(inside.end_lsn), "xid": self._source_tx.xid,
                        "records": inside.records, "last": inside.last}  # fmt: skip
        else:
            assert last is not None
            position = {"commit_lsn": int(last.commit_lsn), "end_lsn": int(last.end_lsn), "xid": last.xid}
        value = orjson.dumps({**position, "slot": self._slot_key.decode()})
        try:
            # step 4: the position record goes last
            self._producer.produce(self._offsets_topic, value, self._slot_key, partition=0)
            commit_transaction(self._producer)  # step 5
        except KafkaException as e:
            problem = classify(e, "cannot commit the Kafka transaction")
            if isinstance(problem, RetryableSinkError):
                self._abort()
            raise problem from None
        if self.failure is not None:
            raise DeliveryFailed(self.failure)
        self._open = False
        self._last = None
        if inside is not None:
            self._committed = inside
        else:
            assert last is not None
            self._committed = Position(last.commit_lsn, last.end_lsn)
        if self._committed.end_lsn > self._acked:
            self._acked = self._committed.end_lsn
        self.kafka_commits += 1

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(60)
        except KafkaException as e:
            raise classify(e, "cannot abort the Kafka transaction") from None
        self._open = False
        self._last = None
        self._in_source_tx = False
        self.failure = None
        log.warning("kafka_transaction_aborted", resume_from=str(self._committed.end_lsn))

    def acknowledged(self) -> Lsn:
        return self._acked

    def drain(self, timeout: float) -> int:
        if self._open:
            if self._in_source_tx or self._last is None:
                # A source transaction was cut off mid-way (stop or lost connection): Kafka must not keep
                # part of it, so the whole open Kafka transaction goes; Postgres resends it.
                self._abort()
            else:
                self._commit_kafka()
        remaining: int = self._producer.flush(timeout)
        return remaining

    def reset(self) -> None:
        self._skipping = False
        self._in_source_tx = False
        self._drop = 0


def transactional_config(config: Mapping[str, Any], transactional_id: str) -> dict[str, Any]:
    conf = dict(config)
    conf["transactional.id"] = transactional_id
    conf.setdefault("transaction.timeout.ms", 900_000)
    conf["message.timeout.ms"] = min(int(conf.get("message.timeout.ms", 900_000)), int(conf["transaction.timeout.ms"]))
    conf.pop("on_delivery", None)
    conf.pop("delivery.report.only.error", None)
    return conf


def commit_transaction(producer: Producer) -> None:
    """``commit_transaction``, again while Kafka says the error is retriable and needs no abort."""
    while True:
        try:
            producer.commit_transaction(60)
            return
        except KafkaException as e:
            err = e.args[0]
            if isinstance(err, KafkaError) and err.retriable() and not err.txn_requires_abort():
                log.warning("kafka_commit_retry", error=err.str())
                continue
            raise


def ignore(ok: bool) -> None:
    """Exactly-once: a failed delivery surfaces at commit_transaction, not per record."""
