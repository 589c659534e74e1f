"""The Spark jobs never write the unchanged-TOAST placeholder into a table, a view or an index (issue #38).

A real connector captures tables with large (TOASTed, ``STORAGE EXTERNAL``) text, jsonb, bytea and
text[] values under ``REPLICA IDENTITY DEFAULT`` in its placeholder mode (``toast: {mode: placeholder}``
where the connector has that setting; before it, placeholders were all it wrote), so UPDATEs of other
columns put ``__debezium_unavailable_value`` in the topics. The jobs must replace each by the key's
previous value (from the topic, or else from the warehouse), and fail naming table, key, column, partition
and offset when neither holds it (``AdminClient.delete_records`` removes a key's earlier records, as
compaction does), unless told to skip (counted, the column null).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from structlog.testing import capture_logs

from cdc import dev
from cdc.config import Config
from cdc.declared import SparkSection
from cdc_views import declared, jobs
from cdc_views.reader import KafkaSource
from cdc_views.tables import Encoding, TableShape
from cdc_views.toast import UnresolvedPlaceholders
from cdc_views.verify import verify
from tests.support.spark import (
    CapturedDatabase,
    captured_database,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

PLACEHOLDER = "__debezium_unavailable_value"

# ~9 KB per value, stored out of line uncompressed (EXTERNAL), so an UPDATE of n leaves them unchanged TOAST
SETUP = [
    "CREATE TABLE docs (id int PRIMARY KEY, n int NOT NULL DEFAULT 0, body text, meta jsonb, blob bytea, tags text[], "
    "nums int[])",
    "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL, ALTER COLUMN meta SET STORAGE EXTERNAL, "
    "ALTER COLUMN blob SET STORAGE EXTERNAL, ALTER COLUMN tags SET STORAGE EXTERNAL, ALTER COLUMN nums SET STORAGE "
    "EXTERNAL",
    "CREATE TABLE notes (id int PRIMARY KEY, n int NOT NULL DEFAULT 0, body text)",
    "ALTER TABLE notes ALTER COLUMN body SET STORAGE EXTERNAL",
]
BIG_TEXT = "(SELECT string_agg(md5(g::text || '-' || {i}), '') FROM generate_series(1, 280) g)"  # 8,960 characters
WORKLOAD = [
    "INSERT INTO docs (id, body, meta, blob, tags, nums) SELECT i, "
    f"{BIG_TEXT.format(i='i')}, jsonb_build_object('id', i, 'doc', {BIG_TEXT.format(i='i + 1000')}), "
    f"decode({BIG_TEXT.format(i='i + 2000')}, 'hex') || decode({BIG_TEXT.format(i='i + 3000')}, 'hex'), "
    "(SELECT array_agg(md5(g::text || i)) FROM generate_series(1, 280) g), "
    "(SELECT array_agg(g * i) FROM generate_series(1, 2300) g) FROM generate_series(1, 12) i",
    "UPDATE docs SET n = n + 1",  # every large value unchanged: placeholders in all five columns
    "UPDATE docs SET body = body || ' (edited)' WHERE id <= 4",  # body sent, the others placeholders
    "UPDATE docs SET n = n + 1 WHERE id % 2 = 0",  # placeholders again, body's previous value is the edited one
    "DELETE FROM docs WHERE id = 12",
    "INSERT INTO notes (id, body) SELECT i, " + BIG_TEXT.format(i="i + 5000") + " FROM generate_series(1, 3) i",
    "UPDATE notes SET n = 1",
]
MORE = ["UPDATE docs SET n = n + 10 WHERE id > 6", "UPDATE docs SET meta = meta || '{\"x\": 1}' WHERE id = 9"]

DECLARED = SparkSection.model_validate(
    {
        "views": [
            {
                "name": "doc_sizes",
                "key": ["id"],
                "sql": "SELECT id, n, body, meta, blob, tags, nums, length(body) AS body_length FROM public_docs",
            }
        ],
        "indexes": [
            {"name": "doc_search", "sql": "SELECT id, body FROM public_docs", "id": "id", "text": {"body": 1.0}}
        ],
    }
)


def placeholder_mode() -> dict[str, Any]:
    """The connector's setting that makes it write placeholders (a connector without it writes nothing else)."""
    return {"toast": {"mode": "placeholder"}} if "toast" in Config.model_fields else {}


@pytest.fixture(scope="module")
def captured(services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CapturedDatabase]:
    name = f"toast_{secrets.token_hex(3)}"
    work = tmp_path_factory.mktemp("spark-toast")
    with captured_database(
        services, work, name, SETUP, ["public.docs", "public.notes"], kafka={"partitions": 1}, **placeholder_mode()
    ) as db:
        db.run(WORKLOAD)
        yield db


def records(bootstrap: str, topic: str) -> list[tuple[int, int, bytes, bytes | None]]:
    """(partition, offset, key, value) of every record now in the topic (an Avro key is not text: bytes)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{secrets.token_hex(4)}", "enable.auto.commit": False}
    )
    out: list[tuple[int, int, bytes, bytes | None]] = []
    try:
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            while True:
                message = consumer.poll(10)
                assert message is not None and message.error() is None
                offset = message.offset()
                assert offset is not None
                out.append((p, offset, message.key() or b"", message.value()))
                if offset >= high - 1:
                    break
    finally:
        consumer.close()
    return out


def _cleanup_policy(admin: AdminClient, topic: str, policy: str) -> None:
    entry = ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
    for future in admin.incremental_alter_configs(
        [ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])]
    ).values():
        future.result(timeout=60)


def delete_records_before(bootstrap: str, topic: str, offset: int) -> None:
    """Partition 0 of ``topic`` loses its records below ``offset``, as when the log cleaner removed a key's
    earlier records. Kafka refuses DeleteRecords on a topic that is only compacted: the policy is
    ``compact,delete`` meanwhile (the connector checks it at start-up only)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    _cleanup_policy(admin, topic, "compact,delete")
    try:
        for future in admin.delete_records([TopicPartition(topic, 0, offset)]).values():
            future.result(timeout=60)
    finally:
        _cleanup_policy(admin, topic, "compact")


def job(db: CapturedDatabase, table: str, warehouse: Path, **overrides: Any) -> jobs.JobConfig:
    shape: TableShape = db.shapes()[table]
    return jobs.JobConfig(KafkaSource(db.bootstrap), db.topic_prefix, {table: shape}, warehouse, **overrides)


def assert_no_placeholder(spark: Any, path: Path) -> None:
    df = spark.read.format("delta").load(str(path))
    text = [c for c in ("body", "meta") if c in df.columns]
    for column in text:
        assert df.where(df[column].contains(PLACEHOLDER)).count() == 0, column
    if "blob" in df.columns:
        assert df.where(df["blob"] == bytearray(PLACEHOLDER.encode())).count() == 0


def test_the_topic_holds_placeholders(captured: CapturedDatabase) -> None:
    """The other tests are about something: the connector wrote the placeholder in every large column."""
    values = [v for _, _, _, v in records(captured.bootstrap, f"{captured.topic_prefix}.public.docs") if v]
    holding = [v for v in values if PLACEHOLDER.encode() in v]
    assert len(holding) >= 12 + 6
    assert any(b'"tags":["' + PLACEHOLDER.encode() + b'"]' in v for v in holding)
    assert any(b'"nums":[' + ",".join(str(b) for b in PLACEHOLDER.encode()).encode() + b"]" in v for v in holding)


def test_batch_rebuild_writes_the_previous_values_into_tables_views_and_indexes(
    spark: Any, captured: CapturedDatabase, tmp_path: Path
) -> None:
    cfg = job(captured, "public.docs", tmp_path / "wh", declared=DECLARED)

    summary = jobs.rebuild(spark, cfg)

    # column values: ids 1 and 3 four (their last update set the body), the other nine all five
    assert summary["placeholders_filled"] == {"public.docs": 2 * 4 + 9 * 5}
    assert summary["placeholders_skipped"] == {}
    report = verify(captured.dsn, cfg.warehouse, cfg.tables, spark=spark, declared_section=DECLARED)
    assert report.ok, report.render()
    assert [c.name for c in report.checks] == ["table public.docs", "view doc_sizes", "index doc_search"]
    assert_no_placeholder(spark, cfg.warehouse / "tables" / "public.docs")
    assert_no_placeholder(spark, declared.view_path(cfg.warehouse, "doc_sizes"))
    assert declared.search(declared.index_path(cfg.warehouse, "doc_search"), "unavailable") == []
    again = jobs.rebuild(spark, cfg)  # the same result: nothing to write
    assert again["table public.docs"] == 0 and again["view doc_sizes"] == 0


def test_continuous_job_fills_from_the_batch_and_then_from_the_warehouse(
    spark: Any, captured: CapturedDatabase, tmp_path: Path
) -> None:
    cfg = job(captured, "public.docs", tmp_path / "wh", declared=DECLARED)
    query = jobs.start_continuous(spark, cfg, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    report = verify(captured.dsn, cfg.warehouse, cfg.tables, spark=spark, declared_section=DECLARED)
    assert report.ok, report.render()

    captured.run(MORE)  # records holding placeholders only: their previous values are in the warehouse alone
    with capture_logs() as logs:
        query = jobs.start_continuous(spark, cfg, available_now=True)
        query.awaitTermination(300)
    assert query.exception() is None
    filled = [e for e in logs if e["event"] == "toast.placeholders_filled"]
    # the latest records of ids 7-11: five large columns each, but id 9's last update carries its meta
    assert [(e["records"], e["from_topic"], e["from_warehouse"]) for e in filled] == [(5, 0, 5 * 5 - 1)]
    report = verify(captured.dsn, cfg.warehouse, cfg.tables, spark=spark, declared_section=DECLARED)
    assert report.ok, report.render()
    assert_no_placeholder(spark, cfg.warehouse / "tables" / "public.docs")
    assert_no_placeholder(spark, declared.view_path(cfg.warehouse, "doc_sizes"))


def test_a_placeholder_whose_previous_value_is_gone_fails_naming_it_unless_skipped(
    spark: Any, captured: CapturedDatabase, tmp_path: Path
) -> None:
    topic = f"{captured.topic_prefix}.public.notes"
    kept = job(captured, "public.notes", tmp_path / "kept")
    jobs.rebuild(spark, kept)  # a warehouse built while the topic still held the inserts
    assert verify(captured.dsn, kept.warehouse, kept.tables, spark=spark).ok

    # as compaction does once the cleaner runs: the key's earlier records (the inserts) are gone
    updates = [(p, o, k) for p, o, k, v in records(captured.bootstrap, topic) if v and PLACEHOLDER.encode() in v]
    assert len(updates) == 3
    first = min(o for _, o, _ in updates)
    delete_records_before(captured.bootstrap, topic, first)
    assert min(o for _, o, _, _ in records(captured.bootstrap, topic)) == first

    # a new warehouse: neither the topic nor the warehouse holds the values
    with pytest.raises(UnresolvedPlaceholders) as failure:
        jobs.rebuild(spark, job(captured, "public.notes", tmp_path / "new"))
    message = str(failure.value)
    p, o, key = updates[0]
    assert "table public.notes" in message and "3 column value(s)" in message
    assert f"key {key.decode()} column 'body' partition {p} offset {o}" in message
    assert "--on-bad-record skip" in message
    assert not (tmp_path / "new" / "tables" / "public.notes").exists()  # nothing was written

    # the continuous job fails the same way
    query = jobs.start_continuous(spark, job(captured, "public.notes", tmp_path / "stream"), available_now=True)
    with pytest.raises(Exception, match=r"UnresolvedPlaceholders|neither an earlier record"):
        query.awaitTermination(300)

    # the warehouse built before still holds them: the rebuild takes them from there
    summary = jobs.rebuild(spark, kept)
    assert summary["placeholders_filled"] == {"public.notes": 3} and summary["placeholders_skipped"] == {}
    assert verify(captured.dsn, kept.warehouse, kept.tables, spark=spark).ok

    # skip: counted and logged, the row written with the column null (the warehouse had no value either)
    skipping = job(captured, "public.notes", tmp_path / "skip", on_bad_record="skip")
    with capture_logs() as logs:
        summary = jobs.rebuild(spark, skipping)
    assert summary["placeholders_skipped"] == {"public.notes": 3} and summary["placeholders_filled"] == {}
    skipped = [e for e in logs if e["event"] == "toast.placeholders_unresolved_skipped"]
    assert len(skipped) == 1 and skipped[0]["count"] == 3 and skipped[0]["table"] == "public.notes"
    rows = spark.read.format("delta").load(str(skipping.warehouse / "tables" / "public.notes")).orderBy("id").collect()
    assert [(r["id"], r["n"], r["body"]) for r in rows] == [(1, 1, None), (2, 1, None), (3, 1, None)]


def test_the_placeholder_text_is_the_connectors(spark: Any, captured: CapturedDatabase, tmp_path: Path) -> None:
    """Another placeholder configured: Debezium's text is then a value like any other (and is kept)."""
    cfg = job(captured, "public.docs", tmp_path / "wh", encoding=Encoding(unavailable_value="__other__"))
    summary = jobs.rebuild(spark, cfg)
    assert summary["placeholders_filled"] == {}
    df = spark.read.format("delta").load(str(cfg.warehouse / "tables" / "public.docs"))
    # every key but 1 and 3, whose last update set the body (whichever of MORE ran before)
    assert sorted(r["id"] for r in df.where(df["body"] == PLACEHOLDER).collect()) == [2, 4, 5, 6, 7, 8, 9, 10, 11]


@pytest.fixture(scope="module", params=["json_schemas", "avro"])
def other_format(
    request: pytest.FixtureRequest, services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[CapturedDatabase, Encoding, Any]]:
    """The same tables and workload in JSON with the schema block, and in Avro against the registry."""
    fmt = request.param
    if fmt == "avro" and services.schema_registry_url is None:
        pytest.skip("no schema registry in this environment (cdc.dev could not fetch Apicurio, or docker mode)")
    extras: dict[str, dict[str, Any]] = {
        "avro": {"format": "avro", "schema_registry": {"url": services.schema_registry_url}},
        "json_schemas": {"json": {"schemas_enable": True}},
    }
    extra = extras[fmt]
    name = f"toast_{fmt}_{secrets.token_hex(3)}"
    with captured_database(
        services,
        tmp_path_factory.mktemp("toast-" + fmt),
        name,
        SETUP,
        ["public.docs", "public.notes"],
        kafka={"partitions": 1},
        **extra,
        **placeholder_mode(),
    ) as db:
        db.run(WORKLOAD)
        registry = None
        if fmt == "avro":
            from cdc.sink.registry import RegistrySettings

            assert services.schema_registry_url is not None  # skipped above otherwise
            registry = RegistrySettings(url=services.schema_registry_url)
        yield db, (Encoding(format="avro") if fmt == "avro" else Encoding(schemas_enable=True)), registry


def test_json_with_schemas_and_avro_fill_the_same_and_name_what_they_cannot(
    spark: Any, other_format: tuple[CapturedDatabase, Encoding, Any], tmp_path: Path
) -> None:
    db, encoding, registry = other_format
    values = [v for _, _, _, v in records(db.bootstrap, f"{db.topic_prefix}.public.docs") if v]
    assert sum(PLACEHOLDER.encode() in v for v in values) >= 12 + 6  # Avro: the text's bytes are in the body too

    cfg = job(db, "public.docs", tmp_path / "wh", encoding=encoding, registry=registry, declared=DECLARED)
    summary = jobs.rebuild(spark, cfg)
    assert summary["placeholders_filled"] == {"public.docs": 2 * 4 + 9 * 5}
    report = verify(db.dsn, cfg.warehouse, cfg.tables, spark=spark, encoding=encoding, declared_section=DECLARED)
    assert report.ok, report.render()
    assert_no_placeholder(spark, cfg.warehouse / "tables" / "public.docs")

    topic = f"{db.topic_prefix}.public.notes"
    updates = sorted((p, o, k) for p, o, k, v in records(db.bootstrap, topic) if v and PLACEHOLDER.encode() in v)
    assert len(updates) == 3
    delete_records_before(db.bootstrap, topic, updates[0][1])
    with pytest.raises(
        UnresolvedPlaceholders, match=rf"table public\.notes .*column 'body' partition 0 offset {updates[0][1]}"
    ):
        jobs.rebuild(spark, job(db, "public.notes", tmp_path / "new", encoding=encoding, registry=registry))
