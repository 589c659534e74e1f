"""The jobs read a topic as log compaction leaves it (``cdc_views.reader.compacted``), and a rebuild gives the
same table before and after Kafka's cleaner has run.

Records are produced by hand (JSON envelopes without position headers, as the connector writes them by
default) to a compacted topic, so that the test can put a malformed record where a later version of its key
supersedes it; the cleaner is then made to run for real (segments rolled by further records, the topic's
cleaner settings lowered) and the topic is read again.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc import dev
from cdc_views import jobs
from cdc_views.reader import KafkaSource, compacted, read_batch
from cdc_views.tables import ColumnShape, Kind, TableShape
from tests.support.toast import set_fast_compaction

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

ITEMS = TableShape(
    "public", "items", (ColumnShape("id", Kind.INT64, "int8"), ColumnShape("name", Kind.TEXT, "text")), ("id",)
)


def _key(i: int) -> bytes:
    return b'{"id":%d}' % i


def _envelope(op: str, i: int, name: str | None, lsn: int) -> bytes:
    row = None if name is None else {"id": i, "name": name}
    before = {"id": i, "name": None} if op == "d" else None
    return json.dumps({"before": before, "after": row, "source": {"lsn": lsn}, "op": op}).encode()


def _table(spark: Any, warehouse: Path) -> dict[int, str]:
    rows = spark.read.format("delta").load(str(warehouse / "tables" / ITEMS.qualified)).collect()
    return {int(r["id"]): str(r["name"]) for r in rows}


def test_a_rebuild_reads_what_compaction_keeps_and_gives_the_same_table_after_the_cleaner_ran(
    spark: Any, services: dev.Endpoints, tmp_path: Path
) -> None:
    prefix = f"compaction_{secrets.token_hex(3)}"
    topic = ITEMS.topic(prefix)
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    for created in admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})]).values():
        created.result(timeout=30)
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    written = [
        (_key(1), _envelope("c", 1, "a", 100)),  # offset 0
        (_key(1), b"{not json"),  # 1: malformed, superseded by offset 3
        (_key(2), _envelope("c", 2, "b", 200)),  # 2
        (_key(1), _envelope("u", 1, "a2", 300)),  # 3: key 1's last record
        (_key(2), _envelope("d", 2, None, 400)),  # 4: key 2's delete event, superseded by its tombstone
        (_key(2), None),  # 5: key 2's tombstone (no position of its own, as after compaction)
        (_key(3), _envelope("c", 3, "c", 500)),  # 6
    ]
    source = KafkaSource(services.kafka_bootstrap)
    try:
        for key, value in written:
            producer.produce(topic, key=key, value=value)
        producer.flush(30)

        kept = compacted(read_batch(spark, source, [topic])).select("offset", "key", "value").collect()
        assert sorted((r["offset"], r["key"]) for r in kept) == [(3, _key(1)), (5, _key(2)), (6, _key(3))]
        assert {r["offset"]: r["value"] for r in kept}[5] is None

        # the malformed record at offset 1 is superseded: it is neither parsed nor reported
        before = tmp_path / "before"
        summary = jobs.rebuild(spark, jobs.JobConfig(source, prefix, {ITEMS.qualified: ITEMS}, before), ["warehouse"])
        assert summary["bad_records_skipped"] == {}
        assert _table(spark, before) == {1: "a2", 3: "c"}

        # the cleaner, for real: lower its settings, then keep writing other keys so that segments roll
        set_fast_compaction(services.kafka_bootstrap, topic)
        expected = {1: "a2", 3: "c"}
        deadline = time.monotonic() + 180
        while True:
            tick = 1000 + len(expected)
            producer.produce(topic, key=_key(tick), value=_envelope("c", tick, f"t{tick}", 1000 + tick))
            producer.flush(30)
            expected[tick] = f"t{tick}"
            time.sleep(0.5)
            left = read_batch(spark, source, [topic]).select("offset").collect()
            offsets = {r["offset"] for r in left}
            if not offsets & {0, 1, 2, 4}:  # key 1's superseded versions and key 2's insert and delete are gone
                break
            assert time.monotonic() < deadline, f"the cleaner did not compact {topic} (offsets left: {sorted(offsets)})"

        after = tmp_path / "after"
        jobs.rebuild(spark, jobs.JobConfig(source, prefix, {ITEMS.qualified: ITEMS}, after), ["warehouse"])
        assert _table(spark, after) == _table(spark, before) | {k: v for k, v in expected.items() if k >= 1000}
        assert _table(spark, after) == expected
    finally:
        for deleted in admin.delete_topics([topic], operation_timeout=30).values():
            deleted.result(timeout=60)
