"""Exactly once: records and the committed source position share one Kafka transaction (``ExactlyOnce``, one of the
two strategies behind ``cdc.sink.delivery.Delivery``).

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
from typing import Any

import orjson
import structlog
from confluent_kafka import KafkaError, KafkaException, Producer

from cdc.event import TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.sink.delivery import DeadLetters, Producing, RetryableSinkError, classify, ignore
from cdc.sink.kafka import DeliveryFailed, SinkError, librdkafka_logger, read_to_end
from cdc.sink.record import Record

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Position:
    commit_lsn: Lsn
    end_lsn: Lsn  # of the last whole source transaction in Kafka: what may be confirmed
    records: int | None = None  # the transaction at commit_lsn is in Kafka up to this many records; None: whole
    last: str | None = None  # digest of that last record (topic and key), checked when resuming after it


def _digest(record: Record) -> str:
    return hashlib.sha256(record.topic.encode() + b"\0" + record.key).hexdigest()[:32]


def read_position(
    bootstrap: str, extra: Mapping[str, Any], topic: str, slot: str, timeout: float = 30.0
) -> Position | None:
    """The last committed position of ``slot`` in the offsets topic, read as read_committed consumers see it."""
    key = slot.encode()
    found: list[Position] = []

    def record(record_key: bytes | None, value: bytes | None) -> None:
        if record_key == key and value is not None:
            data = orjson.loads(value)
            records = data.get("records")
            found.append(
                Position(
                    Lsn(int(data["commit_lsn"])),
                    Lsn(int(data["end_lsn"])),
                    int(records) if records is not None else None,
                    data.get("last"),
                )
            )

    read_to_end(
        bootstrap,
        extra,
        topic,
        group_id=f"cdc-offsets-reader-{slot}",
        what="the offsets topic",
        on_record=record,
        timeout=timeout,
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
        log.info(
            "exactly_once_resume",
            commit_lsn=str(self._committed.commit_lsn),
            end_lsn=str(self._committed.end_lsn),
            records=self._committed.records,
        )

    @property
    def committed(self) -> Position:
        return self._committed

    def begin(self, tx: TxBegin) -> bool:
        committed = self._committed
        if tx.commit_lsn < committed.commit_lsn or (
            tx.commit_lsn == committed.commit_lsn and committed.records is None
        ):
            self._skipping = True  # step 2: already in Kafka
            self.skipped_transactions += 1
            return False
        self._skipping = False
        self._in_source_tx = True
        self._source_tx = tx
        self._source_records = 0
        self._drop = (committed.records or 0) if tx.commit_lsn == committed.commit_lsn else 0
        if self._drop:
            log.info(
                "exactly_once_resume_inside", xid=tx.xid, commit_lsn=str(tx.commit_lsn), records_in_kafka=self._drop
            )
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
        log.info(
            "kafka_transaction_split", xid=tx.xid, commit_lsn=str(tx.commit_lsn), records_in_kafka=self._source_records
        )
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
            position = {
                "commit_lsn": int(inside.commit_lsn),
                "end_lsn": int(inside.end_lsn),
                "xid": self._source_tx.xid,
                "records": inside.records,
                "last": inside.last,
            }
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
