"""The metrics an operator looks at first (#40): librdkafka's statistics as counters, transaction sizes,
start-up phases, the slot's wal_status and safe_wal_size, as /metrics serves them."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import generate_latest

from cdc.observe import EventHistogram, HttpEndpoint, ProducerStats, SlotReading, Stats
from tests.support.http import metric


def _report(name: str, tx: int, retries: int, batches: int, *, rtt_cnt: int = 3) -> str:
    """A librdkafka statistics document with the fields ProducerStats reads (shape of STATISTICS.md)."""
    broker: dict[str, Any] = {
        "name": "localhost:9092/1",
        "nodeid": 1,
        "state": "UP",
        "tx": tx,
        "txretries": retries,
        "txerrs": 0,
        "req_timeouts": 0,
        "rtt": {"cnt": rtt_cnt, "p50": 1500, "p99": 9000, "avg": 2000},
    }
    bootstrap = {"name": "localhost:9092/bootstrap", "nodeid": -1, "tx": 5, "txretries": 0, "txerrs": 0}
    return json.dumps(
        {
            "name": name,
            "type": "producer",
            "msg_cnt": 7,
            "msg_size": 700,
            "brokers": {broker["name"]: broker, bootstrap["name"]: bootstrap},
            "topics": {"t": {"batchcnt": {"cnt": batches}, "batchsize": {"cnt": batches, "sum": batches * 1000}}},
        }
    )


def _scrape(stats: Stats) -> str:
    endpoint = HttpEndpoint(stats, "127.0.0.1", 0)
    endpoint.start()
    try:
        return generate_latest(endpoint.registry).decode()
    finally:
        endpoint.stop()


def test_producer_statistics_become_counters_that_survive_a_new_producer() -> None:
    p = ProducerStats()
    p.on_stats(_report("rdkafka#producer-1", tx=10, retries=1, batches=4))
    p.on_stats(_report("rdkafka#producer-1", tx=25, retries=2, batches=6))
    p.on_stats(_report("rdkafka#producer-2", tx=3, retries=0, batches=1))  # a reconnect made a new one
    stats = Stats(producer=p)
    text = _scrape(stats)
    assert metric(text, "cdc_kafka_requests_total", broker="1") == 28  # bootstrap entries are no brokers
    assert metric(text, "cdc_kafka_request_retries_total", broker="1") == 2
    assert metric(text, "cdc_kafka_batches_total") == 11
    assert metric(text, "cdc_kafka_batch_bytes_total") == 11_000
    assert metric(text, "cdc_kafka_broker_rtt_seconds", broker="1", quantile="0.99") == 0.009
    assert metric(text, "cdc_kafka_producer_queue_messages") == 14  # both producers' queues
    assert metric(text, "cdc_kafka_broker_up", broker="1") == 1


def test_a_broker_missing_from_a_report_is_down() -> None:
    """librdkafka leaves a broker it lost out of its statistics (seen with a stopped broker): it is down."""
    p = ProducerStats()
    p.on_stats(_report("rdkafka#producer-1", tx=10, retries=0, batches=1))
    assert p.up == {"1": True}
    p.on_stats(
        json.dumps({"name": "rdkafka#producer-1", "brokers": {"b": {"nodeid": -1, "state": "INIT"}}, "topics": {}})
    )
    assert p.up == {"1": False} and p.rtt == {}


def test_a_producer_that_restarts_its_counts_does_not_make_a_counter_go_down() -> None:
    p = ProducerStats()
    p.on_stats(_report("rdkafka#producer-1", tx=10, retries=0, batches=0))
    p.on_stats(_report("rdkafka#producer-1", tx=4, retries=0, batches=0))
    assert p.totals[("tx", "1")] == 14


def test_the_statistics_callback_is_added_unless_the_configuration_turns_statistics_off() -> None:
    p = ProducerStats()
    on = p.hooks({"bootstrap.servers": "x"})
    assert on["statistics.interval.ms"] == 10_000 and on["stats_cb"] == p.on_stats
    off = p.hooks({"statistics.interval.ms": 0})
    assert "stats_cb" not in off


def test_transaction_sizes_are_a_histogram_with_cumulative_buckets() -> None:
    h = EventHistogram((1, 10, 100))
    for n in (1, 2, 10, 11, 5000):
        h.observe(n)
    assert h.buckets() == [("1", 1), ("10", 3), ("100", 4), ("+Inf", 5)]
    stats = Stats(transaction_events=h)
    text = _scrape(stats)
    assert metric(text, "cdc_transaction_events_bucket", le="10") == 3
    assert metric(text, "cdc_transaction_events_count") == 5 and metric(text, "cdc_transaction_events_sum") == 5024


def test_the_slot_reading_gives_safe_wal_size_and_one_wal_status_series_per_value() -> None:
    stats = Stats(slot=lambda: SlotReading(4096, "unreserved", 0))
    text = _scrape(stats)
    assert metric(text, "cdc_slot_lag_bytes") == 4096
    assert metric(text, "cdc_slot_safe_wal_size_bytes") == 0
    assert metric(text, "cdc_slot_wal_status", status="unreserved") == 1
    assert metric(text, "cdc_slot_wal_status", status="reserved") == 0
    unlimited = _scrape(Stats(slot=lambda: SlotReading(4096, "reserved", None)))
    assert metric(unlimited, "cdc_slot_safe_wal_size_bytes") is None  # max_slot_wal_keep_size = -1


def test_start_up_phases_each_take_the_time_since_the_last_one() -> None:
    stats = Stats()
    stats.started -= 5
    stats.phase_done("source_checks")
    stats.phase_done("kafka_topics")
    assert stats.startup_phases["source_checks"] >= 5
    assert 0 <= stats.startup_phases["kafka_topics"] < 1
    text = _scrape(stats)
    assert metric(text, "cdc_startup_phase_seconds", phase="kafka_topics") is not None


def test_process_memory_and_cpu_come_from_prometheus_clients_process_collector() -> None:
    text = _scrape(Stats())
    assert (metric(text, "process_resident_memory_bytes") or 0) > 0
    assert metric(text, "process_cpu_seconds_total") is not None


def test_the_server_message_age_is_shown_only_while_streaming() -> None:
    import time

    stats = Stats(last_server_message=lambda: time.monotonic() - 3)
    assert metric(_scrape(stats), "cdc_server_message_age_seconds") is None
    stats.streaming = True
    age = metric(_scrape(stats), "cdc_server_message_age_seconds")
    assert age is not None and 3 <= age < 10
