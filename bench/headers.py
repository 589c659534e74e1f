"""What Kafka record headers cost a Python producer: produce N records with 0, 1, 2 and 4 headers.

One command: ``.venv/bin/python bench/headers.py`` (600,000 records per case, 3 runs, median).

Each case produces the same 440-byte JSON value (a snapshot read of the bench table's shape) with
the connector's producer settings (``cdc.sink.kafka.producer_config``: lz4, ``acks=all``,
idempotent) and no per-record callback (``delivery.report.only.error``, as the snapshot's
``BulkProducer``), into a fresh 3-partition topic, and prints records/s from the first ``produce``
to the last acknowledgment and the process's CPU per record (librdkafka's threads included). The
headers are the connector's position headers (``cdc.lsn``, ``cdc.commit_lsn``, ``cdc.txid``,
``cdc.ordinal``), the last one different on every record, as a dict (confluent-kafka converts a dict
faster than a list of pairs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from confluent_kafka import Producer

from cdc import dev
from cdc.sink.kafka import TopicSpec, admin_client, ensure_topics, producer_config

VALUE = (
    b'{"before":null,"after":{"id":%d,"name":"customer 12345","amount":"AQID","code":"C123",'
    b'"created":"2024-01-01T03:25:45Z","ref":"0b8f1c2e-4a5b-4c6d-8e7f-9a0b1c2d3e4f"},"source":{"version":'
    b'"2.7.0.Final","connector":"postgresql","name":"bench","ts_ms":1763783432000,"snapshot":"true","db":'
    b'"bench","sequence":null,"schema":"public","table":"bench_rows","txId":1234,"lsn":23456789,"xmin":null},'
    b'"op":"r","ts_ms":1763783432000,"transaction":null}'
)
POSITION = {"cdc.lsn": b"123456789", "cdc.commit_lsn": b"123456789", "cdc.txid": b"1234", "cdc.ordinal": b"0"}


def run(bootstrap: str, topic: str, records: int, headers: int) -> tuple[float, float]:
    ensure_topics(admin_client(bootstrap, {}), [TopicSpec(topic, 3, 1)])
    conf = producer_config(bootstrap, {}, 1_000_000)
    conf["delivery.report.only.error"] = True
    producer = Producer(conf)
    producer.produce(topic, b"{}", b"warm-up")  # connected, producer id acquired, before the clock starts
    producer.flush(30)
    names = list(POSITION)[:headers]
    last = names[-1] if names else ""
    produce, poll = producer.produce, producer.poll
    t0, c0 = time.perf_counter(), os.times()
    for i in range(records):
        value, key = VALUE % i, b'{"id":%d}' % i
        while True:
            try:
                if headers:
                    h: dict[str, str | bytes | None] = {name: POSITION[name] for name in names}
                    h[last] = b"%d" % i
                    produce(topic, value, key, headers=h)
                else:
                    produce(topic, value, key)
                break
            except BufferError:
                poll(0.01)
    while producer.flush(60):
        pass
    elapsed, c1 = time.perf_counter() - t0, os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return records / elapsed, cpu / records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    endpoints = dev.up(dev.default_state_dir(), registry=False)
    stamp = time.strftime("%Y%m%d%H%M%S")
    admin = admin_client(endpoints.kafka_bootstrap, {})
    topics = []
    try:
        for headers in (0, 1, 2, 4):
            rates, cpus = [], []
            for i in range(args.runs):
                topic = f"bench_headers_{stamp}_{headers}_{i}"
                topics.append(topic)
                rate, cpu = run(endpoints.kafka_bootstrap, topic, args.records, headers)
                rates.append(rate)
                cpus.append(cpu)
            print(
                f"{headers} header(s): median {statistics.median(rates):,.0f} records/s "
                f"({', '.join(f'{r:,.0f}' for r in rates)}); process CPU {statistics.median(cpus) * 1e6:.2f} µs "
                "per record"
            )
    finally:
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result()
    return 0


if __name__ == "__main__":
    sys.exit(main())
