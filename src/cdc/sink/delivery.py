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

Exactly once: ``cdc.sink.exactly_once``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson
import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from cdc.compiled import CHOSEN
from cdc.event import TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.sink.kafka import ANY_PARTITION, AckTracker, DeliveryFailed, RecordTooLarge, SinkError, librdkafka_logger
from cdc.sink.record import Record
from cdc.sink.wire import DEAD_LETTER_REASON_HEADER

if TYPE_CHECKING:
    from cdc.sink._delivery import Sender

log = structlog.get_logger(__name__)

COMPILED_SENDER: Final[type[Sender] | None] = CHOSEN.compiled("delivery", "Sender")
"""The compiled per-record path of ``AtLeastOnce`` that ``cdc.compiled`` chose, or None (the reference)."""


class RetryableSinkError(SinkError):
    """Kafka aborted the open transaction; resume from the last committed position."""


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """Where records that cannot be delivered go instead of stopping the pipeline."""

    topic: str


class Delivery(Protocol):
    @property
    def inflight_bytes(self) -> int: ...
    @property
    def inflight_records(self) -> int: ...

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
        # What the Python path has in flight and delivered; a compiled sender (AtLeastOnce) counts its own
        # records, and the properties below add the two.
        self._bytes = 0
        self._records = 0
        self._delivered = 0
        self._sender: Sender | None = None
        self.dead_lettered = 0
        self.failure: str | None = None

    @property
    def inflight_bytes(self) -> int:
        """Bytes produced and not yet acknowledged (the backpressure budget's measure)."""
        sender = self._sender
        return self._bytes if sender is None else self._bytes + int(sender.inflight_bytes)

    @property
    def inflight_records(self) -> int:
        sender = self._sender
        return self._records if sender is None else self._records + int(sender.inflight_records)

    @property
    def delivered(self) -> int:
        sender = self._sender
        return self._delivered if sender is None else self._delivered + int(sender.delivered)

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
            self._bytes -= size
            self._records -= 1
            if err is not None:
                if not critical:
                    log.warning("delivery_failed_noncritical", topic=msg.topic(), error=err.str())
                    return
                if self.failure is None:
                    self.failure = _delivery_failed(err, msg)
                on_done(False)
                return
            self._delivered += 1
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
                if partition is None and by_name is None:
                    # Positional alone: given any keyword, confluent-kafka's argument parsing looks up each of
                    # its optional keywords by name, on every call (bench/README.md). The fourth and fifth
                    # arguments are the partition (ANY_PARTITION: the partitioner's choice, as when left
                    # out) and the delivery callback.
                    produce(topic, value, key, ANY_PARTITION, delivered)
                elif partition is None:
                    produce(topic, value, key, on_delivery=delivered, headers=by_name)
                else:
                    produce(topic, value, key, on_delivery=delivered, headers=by_name, partition=partition)
                break
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as e:
                raise classify(e, f"cannot produce to {topic}") from None
        self._bytes += size
        self._records += 1


def _delivery_failed(err: KafkaError, msg: Message) -> str:
    return (
        f"delivery to {msg.topic()} failed: {err.str()} ({err.name()}); "
        "nothing after the last delivered transaction is confirmed"
    )


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

    send: Callable[[Record, str], None]
    """A record of the open source transaction to Kafka: ``send_reference``, or the compiled sender's ``send``
    (``cdc.sink._delivery``), which produces and acknowledges the records of the common shape without a
    Python frame and hands the others to ``send_reference``. An attribute, bound once by the pipeline."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        max_record_bytes: int,
        dead_letters: DeadLetters | None = None,
        sender: type[Sender] | None = COMPILED_SENDER,
    ) -> None:
        """``sender``: the compiled sender (``cdc.compiled`` chose it), or None for the reference alone."""
        super().__init__(Producer(dict(config), logger=librdkafka_logger()), max_record_bytes, dead_letters)
        self._tracker = AckTracker()
        self._entry: Any = None
        self._done: Any = ignore
        self.send = self.send_reference
        if sender is not None:
            self._sender = sender(
                self._producer.produce,
                self._producer.poll,
                max_record_bytes,
                self.send_reference,
                classify,
                KafkaException,
                SinkError,
                ANY_PARTITION,
            )
            self.send = self._sender.send

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
        sender = self._sender
        if sender is not None:

            def failed(err: KafkaError, msg: Message) -> None:  # what delivered() does for a failed record
                if self.failure is None:
                    self.failure = _delivery_failed(err, msg)
                done(False)

            sender.entry, sender.failed = entry, failed
        return True

    def send_reference(self, record: Record, describe: str) -> None:
        """In Python: every record where the compiled sender is not built (or CDC_PURE_PYTHON is set), and
        the records it does not take (headers, a partition, oversized)."""
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
        if self._sender is not None:
            self._sender.entry = None

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
        if self._sender is not None:
            self._sender.entry = None

    def keep_together(self, on: bool) -> None:
        return None


def ignore(ok: bool) -> None:
    """Exactly-once: a failed delivery surfaces at commit_transaction, not per record."""
