"""A producer for writers that count a batch as delivered only after draining it: no Python work a record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from cdc.sink.kafka import DeliveryFailed, librdkafka_logger


class BulkProducer:
    """Records produced without a per-record callback, for writers that count a batch as delivered only
    after draining it (the snapshot's chunks): librdkafka reports failures only
    (``delivery.report.only.error``), to one producer-wide callback, so a record costs a ``produce`` call
    and no Python work on acknowledgment. ``drain`` returns once everything produced is acknowledged, and
    raises if anything failed. The size limit and dead letters stay with ``Delivery.send``: callers route
    oversized records there."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        conf = dict(config)
        conf["delivery.report.only.error"] = True
        conf["on_delivery"] = self._report
        self._producer = Producer(conf, logger=librdkafka_logger())
        self.produce = self._producer.produce  # produce(topic, value, key, headers=...); BufferError: call wait()
        self.failure: str | None = None

    def _report(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None and self.failure is None:
            self.failure = f"delivery to {msg.topic()} failed: {err.str()} ({err.name()})"

    def wait(self) -> None:
        """The local queue is full: serve reports until there is room (and fail early if something failed)."""
        self._producer.poll(0.05)
        self.check()

    def check(self) -> None:
        """Raise if a failure was reported (reports are served by ``wait`` and ``drain``; a poll here would
        cost more than the early warning is worth on the per-row path)."""
        if self.failure is not None:
            raise DeliveryFailed(self.failure)

    def drain(self, timeout: float) -> int:
        remaining: int = self._producer.flush(timeout)
        if self.failure is not None:
            raise DeliveryFailed(self.failure)
        return remaining
