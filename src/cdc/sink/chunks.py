"""Exactly once for the initial snapshot's worker processes: one Kafka transaction per chunk."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from confluent_kafka import KafkaException, Producer

from cdc.event import TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.sink.delivery import DeadLetters, Producing, RetryableSinkError, classify, ignore
from cdc.sink.exactly_once import commit_transaction, transactional_config
from cdc.sink.kafka import DeliveryFailed, SinkError, librdkafka_logger
from cdc.sink.record import Record

log = structlog.get_logger(__name__)

__all__ = ["ChunkTransactions", "fence_transactions"]


class ChunkTransactions(Producing):
    """Exactly once for the initial snapshot's workers: each chunk is one Kafka transaction holding its
    rows and, produced last, the record that says the chunk is copied (``cdc.snapshot.state``). After a
    crash at any moment a read_committed consumer sees a chunk's rows once or not at all, and the chunk
    counts as copied exactly when they are there.

    One producer per worker, ``transactional.id`` = ``cdc-<slot>-snapshot-<worker>``: the daemon's next
    start (or the coordinator, when a worker dies) fences that id (``fence_transactions``), which ends
    what the dead worker left open. It is also the worker's bulk producer (``produce``, ``wait``,
    ``check``, ``drain``, as ``BulkProducer``): rows whose JSON the server built go into the same
    transaction."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        transactional_id: str,
        max_record_bytes: int,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        conf = transactional_config(config, transactional_id)
        producer = Producer(conf, logger=librdkafka_logger())
        super().__init__(producer, max_record_bytes, dead_letters)
        try:
            producer.init_transactions(60)
        except KafkaException as e:
            raise classify(e, "cannot initialise the snapshot's transactional producer") from None
        self.produce = producer.produce  # the bulk path: produce(topic, value, key, headers=...)
        self._open = False

    def begin(self, tx: TxBegin) -> bool:
        if self._open:  # a chunk that did not finish (skipped mid-way): none of it may be committed
            self._abort()
        try:
            self._producer.begin_transaction()
        except KafkaException as e:
            raise classify(e, "cannot begin a Kafka transaction for a snapshot chunk") from None
        self._open = True
        return True

    def send(self, record: Record, describe: str) -> None:
        self._produce(record, describe, ignore)

    def send_outside(self, record: Record) -> None:
        raise SinkError("a snapshot chunk's records are all inside its transaction")

    def commit(self, tx: TxCommit) -> None:
        if not self._open:
            raise SinkError("a snapshot chunk's commit arrived without its begin")
        try:
            commit_transaction(self._producer)
        except KafkaException as e:
            problem = classify(e, "cannot commit a snapshot chunk's Kafka transaction")
            if isinstance(problem, RetryableSinkError):
                self._abort()
            raise problem from None
        self._open = False
        if self.failure is not None:
            raise DeliveryFailed(self.failure)

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(60)
        except KafkaException as e:
            raise classify(e, "cannot abort a snapshot chunk's Kafka transaction") from None
        self._open = False
        self.failure = None

    def position(self, lsn: Lsn) -> None:
        return None

    def tick(self) -> None:
        self._producer.poll(0)

    def acknowledged(self) -> Lsn:
        return Lsn(0)

    def wait(self) -> None:
        self._producer.poll(0.05)

    def check(self) -> None:
        return None  # a failed record fails the chunk's commit

    def drain(self, timeout: float) -> int:
        if self._open:  # a chunk that did not finish (its worker stops): abort it, or it would hold
            self._abort()  # read_committed consumers up until transaction.timeout.ms
        remaining: int = self._producer.flush(timeout)
        return remaining

    def reset(self) -> None:
        return None

    def keep_together(self, on: bool) -> None:
        return None  # a chunk is always one transaction


def fence_transactions(config: Mapping[str, Any], transactional_id: str) -> None:
    """End what a dead producer with this ``transactional.id`` left open: Kafka aborts its open transaction,
    or completes it if it was already committing. Afterwards a read_committed read shows which."""
    producer = Producer(transactional_config(config, transactional_id), logger=librdkafka_logger())
    try:
        producer.init_transactions(60)
    except KafkaException as e:
        raise classify(e, f"cannot fence the transactional id {transactional_id}") from None
    finally:
        producer.flush(0)
    log.info("transactions_fenced", transactional_id=transactional_id)
