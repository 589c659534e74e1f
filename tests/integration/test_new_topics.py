"""Records produced the moment a topic has been created all arrive (the daemon creates topics mid-stream:
an outbox's new aggregate type, a table added to the capture)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from cdc.sink.kafka import TopicSpec, admin_client, ensure_topics, producer_config

pytestmark = pytest.mark.integration

TOPICS = 60  # before the leader wait, about 1 topic in 50 lost its first records: 60 catch it most runs
RECORDS = 40


def test_a_created_topic_is_led_before_ensure_topics_returns_and_every_record_produced_at_once_arrives(
    services, topic_prefix, consume_all
):
    admin = admin_client(services.kafka_bootstrap, {})
    producer = Producer(producer_config(services.kafka_bootstrap, {}, 1_000_000))
    failures: list[str] = []
    acked: dict[str, int] = {}

    def report(err, msg):
        if err is not None:
            failures.append(f"{msg.topic()}: {err}")
        else:
            acked[msg.topic()] = acked.get(msg.topic(), 0) + 1

    probe = Consumer({"bootstrap.servers": services.kafka_bootstrap, "group.id": f"{topic_prefix}.probe"})
    not_led: list[str] = []
    names = [f"{topic_prefix}.t{i}" for i in range(TOPICS)]
    for name in names:
        # One topic at a time, then straight to producing, as the daemon does for a new aggregate type.
        assert ensure_topics(admin, [TopicSpec(name, 3, 1, compacted=False)]) == {name: 3}
        for p in range(3):  # the leader answers at once: without the wait, NOT_LEADER for most topics here
            try:
                probe.get_watermark_offsets(TopicPartition(name, p), timeout=10)
            except KafkaException as e:
                not_led.append(f"{name} [{p}]: {e.args[0].str()}")
        for i in range(RECORDS):
            producer.produce(name, key=f"k{i % 6}".encode(), value=str(i).encode(), on_delivery=report)
            producer.poll(0)
            time.sleep(0.002)  # records trickle in, as changes do: several batches in flight per partition
    assert producer.flush(60) == 0
    probe.close()
    assert not_led == []
    assert failures == []
    assert acked == {name: RECORDS for name in names}  # every record reported delivered ...

    counts: dict[str, list[int]] = {}
    for m in consume_all(names, timeout=60.0):
        counts.setdefault(m.topic(), []).append(int(m.value()))
    short = {name: sorted(set(range(RECORDS)) - set(counts.get(name, []))) for name in names}
    assert {name: gone for name, gone in short.items() if gone} == {}  # ... and is in its topic
