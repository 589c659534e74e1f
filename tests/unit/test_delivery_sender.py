"""The compiled at-least-once sender (cdc.sink._delivery) against its Python reference (AtLeastOnce.send and
its per-record callback): the same script of transactions, records, delivery reports, a full local queue
and failures, played on both, must make the same ``produce`` calls, the same counts, the same acknowledged
LSN and the same errors.

The producer is a stand-in that only records what it is given and hands the delivery reports back when the
script says (the real librdkafka and broker are in the integration tests, which run this sender on
PostgreSQL 15, 16 and 18 and the reference on 17)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc.event import TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.sink import delivery as delivery_module
from cdc.sink.delivery import COMPILED_SENDER, AtLeastOnce
from cdc.sink.kafka import ANY_PARTITION, DeliveryFailed, RecordTooLarge, SinkError
from cdc.sink.record import Record

try:
    from cdc.sink._delivery import Sender
except ImportError as exc:  # pragma: no cover - a build without the compiled modules
    if COMPILED_SENDER is not None or not os.environ.get("CDC_PURE_PYTHON"):
        raise ImportError(f"the compiled sender is not built ({exc}): pip install -e . builds it") from exc
    pytest.skip("cdc.sink._delivery is not built and CDC_PURE_PYTHON is set", allow_module_level=True)


class Message:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


class Producer:
    """Records produce calls; raises what the script queued; keeps each record's on_delivery for report()."""

    def __init__(self, config: dict[str, Any], logger: Any = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.reports: list[tuple[str, Callable[[Any, Any], None]]] = []
        self.raise_next: list[BaseException] = []
        self.polls = 0

    def produce(self, topic: str, value: bytes | None, key: bytes, *positional: Any, **kwargs: Any) -> None:
        if self.raise_next:
            raise self.raise_next.pop(0)
        if positional:  # (partition, callback), as confluent-kafka takes them by position
            partition, callback = positional
            assert not kwargs, "a call mixing the two forms"
            if partition != ANY_PARTITION:
                kwargs["partition"] = partition
        else:
            callback = kwargs.pop("on_delivery")
        if kwargs.get("headers", 0) is None:  # headers=None is no headers to confluent-kafka, as leaving it out
            del kwargs["headers"]
        self.calls.append((topic, value, key, tuple(sorted(kwargs.items()))))
        self.reports.append((topic, callback))

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def report(self, index: int, err: Any = None) -> None:
        topic, callback = self.reports[index]
        callback(err, Message(topic))


def play(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The script on one implementation: everything it observed, in order."""
    monkeypatch.setattr(delivery_module, "Producer", Producer)
    # each side handed here, whatever CDC_PURE_PYTHON says: the comparison runs in both of the suite's modes
    d = AtLeastOnce({}, max_record_bytes=100, sender=Sender if compiled else None)
    assert (d._sender is not None) == compiled
    producer: Producer = d._producer  # type: ignore[assignment]  # the fake patched in above
    seen: list[Any] = []

    def state(label: str) -> None:
        seen.append((label, d.inflight_bytes, d.inflight_records, d.delivered, int(d.acknowledged()), d.failure))

    def attempt(record: Record) -> None:
        try:
            d.send(record, "public.t")
        except Exception as exc:
            seen.append(("raised", type(exc).__name__, str(exc)))

    attempt(Record("p.public.t", b"k0", b"v0"))  # outside a transaction
    d.begin(TxBegin(7, Lsn(90), 1))
    attempt(Record("p.public.t", b'{"id":1}', b'{"after":1}'))
    attempt(Record("p.public.t", b'{"id":2}', None))  # a tombstone
    attempt(
        Record("p.public.t", b'{"id":3}', b"v3", (("cdc.lsn", b"95"), ("cdc.txid", b"7")))
    )  # headers: reference path
    attempt(Record("p.public.t", b'{"id":4}', b"x" * 101))  # oversized, no dead-letter topic
    attempt(Record("p.public.t", b'{"id":5}', b"v5", (), 1))  # a partition: reference path
    producer.raise_next.append(BufferError("queue full"))
    attempt(Record("p.public.t", b'{"id":6}', b"v6"))  # retried after a poll
    d.commit(TxCommit(7, Lsn(90), Lsn(100), 1, 6))
    state("tx 1 sent")
    for i in range(len(producer.reports)):
        producer.report(i)
        state(f"report {i}")
    d.begin(TxBegin(8, Lsn(190), 2))
    producer.raise_next.append(KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out", retriable=True)))
    attempt(Record("p.public.u", b'{"id":7}', b"v7"))  # not produced: uncounted, classified
    producer.raise_next.append(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")))
    attempt(Record("p.public.u", b'{"id":8}', b"v8"))
    attempt(Record("p.public.u", b'{"id":9}', b"v9"))
    attempt(Record("p.public.u", b'{"id":10}', b"v10"))
    d.commit(TxCommit(8, Lsn(190), Lsn(200), 2, 4))
    state("tx 2 sent")
    first = len(producer.reports) - 2
    producer.report(first)
    state("tx 2 first report")
    producer.report(first + 1, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
    state("tx 2 failed")
    try:
        d.tick()
    except DeliveryFailed as exc:
        seen.append(("tick", str(exc)))
    seen.append(("calls", producer.calls, producer.polls))
    return seen


def test_the_compiled_sender_produces_counts_and_fails_as_the_reference_does(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        reference = play(False, m)
    compiled = play(True, monkeypatch)
    assert compiled == reference
    # and the script did what it says: the errors, the acknowledgments, the failure
    raised = [s[1] for s in reference if s[0] == "raised"]
    assert raised == ["SinkError", "RecordTooLarge", "RetryableSinkError", "SinkError"]
    assert issubclass(RecordTooLarge, SinkError)
    acked = {s[0]: s[4] for s in reference if s[0] not in ("raised", "tick", "calls")}
    assert acked["tx 1 sent"] == 0 and acked["report 4"] == 100 and acked["tx 2 failed"] == 100
    assert reference[-2][0] == "tick" and "MSG_SIZE_TOO_LARGE" in reference[-2][1]
    calls, polls = reference[-1][1], reference[-1][2]
    assert len(calls) == 7 and polls == 2  # five of tx 1, two of tx 2; a poll for the full queue, one in tick()
    assert calls[2][3] == (("headers", {"cdc.lsn": b"95", "cdc.txid": b"7"}),) and calls[3][3] == (("partition", 1),)
    final = next(s for s in reference if s[0] == "tx 2 failed")
    assert final[1:4] == (0, 0, 6)  # nothing in flight; six delivered, the failed one not
