"""Avro against the real schema registry (Apicurio Registry's Confluent-compatible API), and through the real daemon.

Apicurio's default compatibility is NONE (Confluent's is BACKWARD): every test that depends on
the rule sets it on its own subjects, never globally (the registry is shared by the session).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import psycopg
import pytest

from cdc import dev
from cdc.event import ChangeEvent, Column, MessageEvent, Op, PgType, TableSchema, TruncateEvent, TypeKind
from cdc.lsn import Lsn
from cdc.sink.avro import AvroSerializer, AvroSettings
from cdc.sink.record import Record
from cdc.sink.registry import IncompatibleSchemaError, RegistryClient
from cdc.values import Infinity, Interval, Point
from tests.support.connector import Connector, write_config
from tests.support.registry import Consumer

pytestmark = pytest.mark.integration

COMMIT_US = 1714566896789012


@pytest.fixture
def registry_url(services: dev.Endpoints, services_mode: str) -> str:
    if services.schema_registry_url is None:
        if services_mode == "docker":  # testcontainers brings no registry: an environment without one
            pytest.skip("no schema registry in docker mode (testcontainers starts Postgres and Kafka only)")
        # cdc.dev starts one with the local services: its absence is a failure, not a skip
        raise AssertionError("cdc.dev started no schema registry (CDC_TEST_REGISTRY=0?); the Avro tests need one")
    return services.schema_registry_url


@pytest.fixture
def registry(registry_url: str, topic_prefix: str) -> Iterator[RegistryClient]:
    """A client of the real registry; the test's subjects (``<topic_prefix>...``) are deleted afterwards."""
    client = RegistryClient(registry_url, retry_timeout_s=30)
    yield client
    for subject in client.subjects():
        if subject.startswith(topic_prefix):
            client.delete_subject(subject, permanent=True)


def T(oid: int, name: str) -> PgType:
    return PgType(oid, name)


INT4, INT8, TEXT, NUMERIC = T(23, "int4"), T(20, "int8"), T(25, "text"), T(1700, "numeric")
MOOD = PgType(70001, "mood", TypeKind.ENUM, "public", labels=("sad", "ok", "happy"))
RICH = TableSchema(
    "public",
    "rich",
    (
        Column("id", INT8, key=True, nullable=False),
        Column("small", T(21, "int2"), nullable=False),
        Column("name", TEXT),
        Column("amount", NUMERIC, modifier=((10 << 16) | 2) + 4),
        Column("exact", NUMERIC),
        Column("odd_scale", NUMERIC, modifier=((3 << 16) | (-2 & 0x7FF)) + 4),
        Column("money", T(790, "money")),
        Column("blob", T(17, "bytea")),
        Column("uid", T(2950, "uuid")),
        Column("born", T(1082, "date")),
        Column("seen", T(1184, "timestamptz")),
        Column("span", T(1186, "interval")),
        Column("where", T(600, "point")),
        Column("mood", MOOD),
        Column("tags", PgType(1009, "_text", TypeKind.ARRAY, element=TEXT)),
        Column("amounts", PgType(1231, "_numeric", TypeKind.ARRAY, element=NUMERIC), modifier=((5 << 16) | 2) + 4),
        Column("flags", T(1560, "bit"), modifier=8),
        Column("weird-name", TEXT),
    ),
)
RICH_ROW: dict[str, Any] = {
    "id": 1,
    "small": -3,
    "name": "Ada",
    "amount": Decimal("1234.56"),
    "exact": Decimal("3.14159265358979323846264338327950288"),
    "odd_scale": Decimal("12300"),
    "money": Decimal("-9.99"),
    "blob": b"\x00\xff",
    "uid": UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    "born": 19844,
    "seen": Infinity.POSITIVE,
    "span": Interval(1, 2, 3_000_000),
    "where": Point(1.5, -2.0),
    "mood": "happy",
    "tags": ["a", None],
    "amounts": [Decimal("1.50"), None],
    "flags": "10000001",
    "weird-name": "w",
}


def change(
    table: TableSchema, op: Op, before: dict[str, Any] | None, after: dict[str, Any] | None, lsn: int
) -> ChangeEvent:
    return ChangeEvent(op, table, before, after, Lsn(lsn), Lsn(lsn), 700 + lsn, 1, COMMIT_US)


def serializer(prefix: str, registry: RegistryClient, partitions: int = 2) -> AvroSerializer:
    return AvroSerializer(AvroSettings(topic_prefix=prefix, database="inventory"), lambda topic: partitions, registry)


def test_schemas_register_evolve_as_versions_and_every_record_decodes_through_the_registry(
    registry: RegistryClient, registry_url: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.public.rich"
    for subject in (f"{topic}-key", f"{topic}-value"):
        registry.set_compatibility("BACKWARD", subject)
    s = serializer(topic_prefix, registry)
    records: list[Record] = []
    records += s.records(change(RICH, Op.CREATE, None, RICH_ROW, 10))
    records += s.records(change(RICH, Op.UPDATE, None, dict(RICH_ROW, name="Ada L."), 11))
    records += s.records(change(RICH, Op.DELETE, {"id": 1}, None, 12))
    # ALTER TABLE rich ADD COLUMN note text, ADD COLUMN rank int NOT NULL DEFAULT 0: a new Relation
    v2 = TableSchema("public", "rich", (*RICH.columns, Column("note", TEXT), Column("rank", INT4, nullable=False)))
    records += s.records(change(v2, Op.CREATE, None, dict(RICH_ROW, id=2, note="hi", rank=7), 13))
    records += s.records(TruncateEvent((v2,), False, False, Lsn(14), Lsn(14), 714, 1, COMMIT_US))
    records += s.records(MessageEvent("audit", b"\x01\x02", True, Lsn(15), Lsn(15), 715, 2, COMMIT_US))

    assert registry.versions(f"{topic}-value") == [1, 2]  # the added columns made version 2
    assert registry.versions(f"{topic}-key") == [1]
    assert registry.compatibility(f"{topic}-value") == "BACKWARD"

    consumer = Consumer(registry_url)
    decoded = [(r.topic, consumer.decode(r.key), consumer.decode(r.value)) for r in records]
    ops = [(topic_, value["op"] if value else None) for topic_, _, value in decoded]
    assert ops == [
        (topic, "c"),
        (topic, "u"),
        (topic, "d"),
        (topic, None),
        (topic, "c"),
        (topic, "t"),
        (topic, "t"),
        (f"{topic_prefix}.message", "m"),
    ]
    _, key, created = decoded[0]
    assert key == {"id": 1}
    after = created["after"]
    assert after["small"] == -3 and after["amount"] == Decimal("1234.56") and after["money"] == Decimal("-9.99")
    assert after["exact"]["scale"] == 35
    assert after["odd_scale"] == b"\x7b"  # numeric(3,-2): bytes of the unscaled 123, no logical type
    assert after["uid"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" and after["seen"] == "infinity"
    assert after["where"]["x"] == 1.5 and after["tags"] == ["a", None] and after["amounts"] == [Decimal("1.50"), None]
    assert after["weird_name"] == "w"
    assert decoded[2][2]["before"]["id"] == 1 and decoded[2][2]["before"]["name"] is None
    assert decoded[4][2]["after"]["note"] == "hi" and decoded[4][2]["after"]["rank"] == 7
    assert [k for _, k, _ in decoded[5:7]] == [{"id": None}, {"id": None}]
    assert decoded[7][1] == {"prefix": "audit"} and decoded[7][2]["message"]["content"] == b"\x01\x02"

    # one key schema for every row event, whatever the value schema version
    assert len({consumer.schema_id(r.key) for r in records[:5]}) == 1
    # BACKWARD in practice: the latest value schema reads the records written before the change
    latest = registry.latest(f"{topic}-value")
    assert latest is not None
    latest_schema = orjson.loads(latest.schema)
    old = consumer.decode(records[0].value, reader=latest_schema)
    assert old["after"]["note"] is None and old["after"]["rank"] is None and old["after"]["name"] == "Ada"
    # the marker keys live under their own subject, so the key subject holds one record type
    assert f"{topic}-{topic}.TruncateKey" in registry.subjects()


def test_an_incompatible_change_is_refused_with_the_subject_the_table_and_what_changed(
    registry: RegistryClient, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.public.people"
    registry.set_compatibility("BACKWARD", f"{topic}-value")
    people = TableSchema("public", "people", (Column("id", INT4, key=True, nullable=False), Column("age", TEXT)))
    s = serializer(topic_prefix, registry)
    s.records(change(people, Op.CREATE, None, {"id": 1, "age": "41"}, 20))
    # ALTER TABLE people ALTER COLUMN age TYPE int USING age::int: Avro cannot read a string as an int
    retyped = TableSchema("public", "people", (Column("id", INT4, key=True, nullable=False), Column("age", INT4)))
    with pytest.raises(IncompatibleSchemaError) as info:
        s.records(change(retyped, Op.CREATE, None, {"id": 2, "age": 42}, 21))
    error = info.value
    message = str(error)
    assert error.subject == f"{topic}-value" and error.compatibility == "BACKWARD"
    assert "Value.age changed type from null|string to null|int" in error.changes
    for part in (
        f"subject '{topic}-value'",
        "(table public.people)",
        "version 1",
        "compatibility BACKWARD",
        "Registry says:",
        "Fix:",
        f"/config/{topic}-value",
    ):
        assert part in message, part
    assert registry.versions(f"{topic}-value") == [1]  # nothing was registered

    # int -> bigint is a promotion Avro reads: compatible, a new version
    widened = TableSchema(
        "public", "people", (Column("id", INT4, key=True, nullable=False), Column("age", TEXT), Column("height", INT8))
    )
    s.records(change(widened, Op.CREATE, None, {"id": 3, "age": "40", "height": 180}, 22))
    assert registry.versions(f"{topic}-value") == [1, 2]


def test_a_key_change_is_refused_on_the_key_subject(registry: RegistryClient, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.public.pairs"
    registry.set_compatibility("BACKWARD", f"{topic}-key")
    pairs = TableSchema(
        "public", "pairs", (Column("a", INT4, key=True, nullable=False), Column("b", INT4, nullable=False))
    )
    s = serializer(topic_prefix, registry)
    s.records(change(pairs, Op.CREATE, None, {"a": 1, "b": 2}, 30))
    rekeyed = TableSchema(
        "public", "pairs", (Column("a", INT4, key=True, nullable=False), Column("b", INT4, key=True, nullable=False))
    )
    with pytest.raises(
        IncompatibleSchemaError,
        match=rf"subject '{topic}-key' \(table public.pairs\).*Key.b was added \(int, without a default\)",
    ):
        s.records(change(rekeyed, Op.CREATE, None, {"a": 1, "b": 2}, 31))


def test_a_restart_registers_nothing_new_and_gets_the_same_ids(
    registry: RegistryClient, registry_url: str, topic_prefix: str
) -> None:
    people = TableSchema("public", "people", (Column("id", INT4, key=True, nullable=False), Column("name", TEXT)))
    first = serializer(topic_prefix, registry).records(change(people, Op.CREATE, None, {"id": 1, "name": "a"}, 40))[0]
    again = serializer(topic_prefix, RegistryClient(registry_url)).records(
        change(people, Op.CREATE, None, {"id": 1, "name": "a"}, 40)
    )[0]
    assert (again.key, (again.value or b"")[:5]) == (first.key, (first.value or b"")[:5])
    assert registry.versions(f"{topic_prefix}.public.people-value") == [1]


# --- through the real daemon -----------------------------------------------------------------------


def test_the_daemon_writes_avro_that_every_consumer_decodes_through_the_registry(
    tmp_path: Path,
    services: dev.Endpoints,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
    registry: RegistryClient,
    registry_url: str,
) -> None:
    topic = f"{topic_prefix}.public.shop"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE shop (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), tags text[])")
    for subject in (f"{topic}-key", f"{topic}-value"):
        registry.set_compatibility("BACKWARD", subject)
    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.shop"],
        kafka={"bootstrap_servers": services.kafka_bootstrap, "partitions": 2},
        topic_prefix=topic_prefix,
        format="avro",
        schema_registry={"url": registry_url},
        status_interval_s=1.0,
    )
    daemon = Connector(config, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO shop VALUES (1, 'pen', 1.50, '{a,b}'), (2, 'ink', 7.25, NULL)")
            conn.execute("UPDATE shop SET price = 1.75 WHERE id = 1")
            conn.execute("DELETE FROM shop WHERE id = 2")
            conn.execute("ALTER TABLE shop ADD COLUMN stock int NOT NULL DEFAULT 0")
            conn.execute("INSERT INTO shop VALUES (3, 'pad', 3.00, NULL, 12)")
            conn.execute("UPDATE shop SET id = 4 WHERE id = 3")
            conn.execute("TRUNCATE shop")
        deadline = time.monotonic() + 60
        messages: list[Any] = []
        while time.monotonic() < deadline:
            messages = consume_all([topic], timeout=10.0)
            if sum(1 for m in messages if dict(m.headers() or []).get("cdc.truncate") == b"1") == 2:
                break
            time.sleep(0.3)
    finally:
        code = daemon.stop()
    assert code == 0, daemon.output()

    consumer = Consumer(registry_url)
    rows: list[tuple[Any, Any]] = []
    for m in messages:
        key = m.key()
        assert key is not None and key[:1] == b"\x00"  # every record: a key in the wire format
        rows.append((consumer.decode(key), consumer.decode(m.value())))
    # per partition order is commit order; compare the multiset of (op, key) and the contents
    by_op: dict[str | None, list[tuple[Any, Any]]] = {}
    for key, value in rows:
        by_op.setdefault(value["op"] if value else None, []).append((key, value))
    assert sorted(k["id"] for k, _ in by_op["c"]) == [1, 2, 3, 4]
    assert [k["id"] for k, _ in by_op["u"]] == [1]
    assert sorted(k["id"] for k, _ in by_op["d"]) == [2, 3]
    assert sorted(k["id"] for k, _ in by_op[None]) == [2, 3]  # tombstones
    assert [k for k, _ in by_op["t"]] == [{"id": None}, {"id": None}]  # one marker per partition
    created = {k["id"]: v["after"] for k, v in by_op["c"]}
    assert created[1] == {"id": 1, "name": "pen", "price": Decimal("1.50"), "tags": ["a", "b"]}
    assert created[4]["stock"] == 12 and created[4]["name"] == "pad"  # written with the second value schema
    assert by_op["u"][0][1]["after"]["price"] == Decimal("1.75")
    assert registry.versions(f"{topic}-value") == [1, 2]
    assert registry.versions(f"{topic}-key") == [1]
