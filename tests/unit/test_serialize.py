"""cdc.sink.json and cdc.sink.records: events in, Debezium-compatible JSON records out."""

from __future__ import annotations

import base64
import math
import re
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.event import ChangeEvent, Column, MessageEvent, Op, PgType, TableSchema, TruncateEvent, TypeKind
from cdc.lsn import Lsn
from cdc.sink.errors import SerializationError
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.record import Record
from cdc.values import UNCHANGED_TOAST, Infinity, Interval, Point, TimeTz
from tests.support.customers import (
    ALICE_AFTER,
    ALICE_BEFORE,
    COMMIT_US,
    CUSTOMERS,
    INT4,
    INT8,
    NUMERIC,
    TEXT,
    TSTZ,
    T,
    numeric_mod,
)

# The team's note, in shared/ beside the checkout (as CI lays it out), wherever the checkout is.
NOTE = Path(__file__).resolve().parents[3] / "shared" / "notes" / "debezium-envelope.md"
CLOCK_NS = 1714566897101234567


def serializer(
    partitions: int = 3, connector_version: str = "3.6.1.Final", **options: Any
) -> tuple[JsonSerializer, list[str]]:
    asked: list[str] = []

    def partitions_of(topic: str) -> int:
        asked.append(topic)
        return partitions

    settings = JsonSettings(
        topic_prefix="dbserver1", database="inventory", connector_version=connector_version, **options
    )
    return JsonSerializer(settings, partitions_of, clock_ns=lambda: CLOCK_NS), asked


def event(
    table: TableSchema,
    op: Op,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    *,
    snapshot: bool = False,
    xid: int | None = 771,
    unchanged: frozenset[str] = frozenset(),
) -> ChangeEvent:
    return ChangeEvent(op, table, before, after, Lsn(24023040), Lsn(24023128), xid, 1, COMMIT_US, snapshot, unchanged)


def payload(record: Record) -> Any:
    assert record.value is not None
    doc = orjson.loads(record.value)
    return doc["payload"] if set(doc) == {"schema", "payload"} else doc


def schema_of(record: Record) -> Any:
    assert record.value is not None
    return orjson.loads(record.value)["schema"]


# --- §8 of the note, byte for byte ---------------------------------------------


def note_example() -> tuple[bytes, bytes]:
    section = NOTE.read_text().split("## 8.")[1]
    key, value = re.findall(r"```json\n(.*?)```", section, re.DOTALL)[:2]
    return key.strip().encode(), "".join(value.split("\n")).encode()


def test_the_notes_update_example_is_reproduced_byte_for_byte() -> None:
    expected_key, expected_value = note_example()
    s, _ = serializer(schemas_enable=True)
    [record] = s.records(event(CUSTOMERS, Op.UPDATE, ALICE_BEFORE, ALICE_AFTER))
    assert record.topic == "dbserver1.public.customers"
    assert record.key == expected_key
    expected = orjson.loads(expected_value)
    got = orjson.loads(record.value or b"")
    # the key exactly, the schema exactly, the payload without the envelope clock exactly
    assert record.value is not None
    assert record.value.startswith(b'{"schema":' + orjson.dumps(expected["schema"]) + b',"payload":')
    clock = ("ts_ms", "ts_us", "ts_ns")
    assert {k: v for k, v in got["payload"].items() if k not in clock} == {
        k: v for k, v in expected["payload"].items() if k not in clock
    }
    assert list(got["payload"]) == list(expected["payload"])  # field order
    # with the note's clock, the whole record
    assert record.value == expected_value


def test_envelope_clock_fields_are_the_serializers_clock() -> None:
    s, _ = serializer()
    [record] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    p = payload(record)
    assert (p["ts_ms"], p["ts_us"], p["ts_ns"]) == (CLOCK_NS // 10**6, CLOCK_NS // 10**3, CLOCK_NS)
    assert (p["source"]["ts_ms"], p["source"]["ts_us"], p["source"]["ts_ns"]) == (
        COMMIT_US // 1000,
        COMMIT_US,
        COMMIT_US * 1000,
    )


def test_default_clock_is_wall_time() -> None:
    s = JsonSerializer(JsonSettings(topic_prefix="p", database="d"), lambda t: 1)
    [record] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    assert payload(record)["ts_ms"] > 1_700_000_000_000


# --- record shapes ---------------------------------------------------------------


def test_schemaless_insert() -> None:
    s, _ = serializer()
    [record] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    assert record.key == b'{"id":1}'
    assert record.partition is None
    p = payload(record)
    assert list(p) == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
    assert p["op"] == "c" and p["before"] is None and p["transaction"] is None
    assert p["after"] == {"id": 1, "name": "Alice", "balance": "AeJA", "updated_at": "2024-05-01T12:34:56.789012Z"}
    assert p["source"] == {
        "version": "3.6.1.Final",
        "connector": "postgresql",
        "name": "dbserver1",
        "ts_ms": 1714566896789,
        "snapshot": "false",
        "db": "inventory",
        "sequence": '["24023040","24023128"]',
        "ts_us": COMMIT_US,
        "ts_ns": COMMIT_US * 1000,
        "schema": "public",
        "table": "customers",
        "txId": 771,
        "lsn": 24023128,
        "xmin": None,
        "origin": None,
        "origin_lsn": None,
    }
    assert list(p["source"]) == list(p["source"].keys())


def test_every_record_carries_position_headers() -> None:
    s, _ = serializer()
    [record] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    assert record.headers == (
        ("cdc.lsn", b"24023128"),
        ("cdc.commit_lsn", b"24023040"),
        ("cdc.txid", b"771"),
        ("cdc.ordinal", b"1"),
    )
    [record] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER, xid=None))
    assert [name for name, _ in record.headers] == ["cdc.lsn", "cdc.commit_lsn", "cdc.ordinal"]
    assert payload(record)["source"]["txId"] is None


def test_connector_version_defaults_to_the_package_version() -> None:
    import cdc

    assert JsonSettings(topic_prefix="p", database="d").connector_version == cdc.__version__


def test_snapshot_read() -> None:
    s, _ = serializer()
    [record] = s.records(event(CUSTOMERS, Op.READ, None, ALICE_AFTER, snapshot=True))
    p = payload(record)
    assert p["op"] == "r" and p["before"] is None
    assert p["source"]["snapshot"] == "true"


@pytest.mark.parametrize("schemas_enable", [False, True])
@pytest.mark.parametrize("xid", [771, None])
def test_read_parts_reassemble_the_snapshot_read_records(schemas_enable: bool, xid: int | None) -> None:
    s, _ = serializer(schemas_enable=schemas_enable)
    read = ChangeEvent(
        Op.READ, CUSTOMERS, None, ALICE_AFTER, Lsn(24023128), Lsn(24023128), xid, 1, COMMIT_US, True, frozenset()
    )
    [record] = s.records(read)
    parts = s.read_parts(CUSTOMERS, COMMIT_US, Lsn(24023128), xid)
    assert parts.topic == record.topic
    assert parts.columns == tuple(c.name for c in CUSTOMERS.columns)
    assert parts.key_columns == ("id",)
    key_object = orjson.dumps({"id": ALICE_AFTER["id"]})
    after_object = orjson.dumps(payload(record)["after"])
    assert parts.key_head + key_object + parts.key_end == record.key
    value = parts.value_head + after_object + parts.value_middle + parts.times(CLOCK_NS) + parts.value_end
    assert value == record.value


def test_delete_then_tombstone() -> None:
    s, _ = serializer()
    key_only = {"id": 1}  # REPLICA IDENTITY DEFAULT: the old key only
    delete, tombstone = s.records(event(CUSTOMERS, Op.DELETE, key_only, None))
    assert delete.key == tombstone.key == b'{"id":1}'
    assert tombstone.value is None
    assert tombstone.topic == delete.topic == "dbserver1.public.customers"
    assert tombstone.headers == delete.headers
    p = payload(delete)
    assert p["op"] == "d" and p["after"] is None
    assert p["before"] == {"id": 1, "name": None, "balance": None, "updated_at": None}


def test_delete_with_schemas_keeps_the_tombstone_value_null() -> None:
    s, _ = serializer(schemas_enable=True)
    delete, tombstone = s.records(event(CUSTOMERS, Op.DELETE, ALICE_BEFORE, None))
    assert tombstone.value is None
    assert tombstone.key == delete.key
    assert orjson.loads(delete.key)["payload"] == {"id": 1}


def test_update_without_old_row() -> None:
    s, _ = serializer()
    [record] = s.records(event(CUSTOMERS, Op.UPDATE, None, ALICE_AFTER))
    p = payload(record)
    assert p["op"] == "u" and p["before"] is None and p["after"]["balance"] == "AeJA"


def test_update_with_the_same_key_is_one_record() -> None:
    s, _ = serializer()
    [record] = s.records(event(CUSTOMERS, Op.UPDATE, ALICE_BEFORE, ALICE_AFTER))
    assert payload(record)["before"]["balance"] == "AYag"


def test_primary_key_change_is_delete_tombstone_create() -> None:
    s, _ = serializer()
    before = dict(ALICE_BEFORE, id=1)
    after = dict(ALICE_AFTER, id=2)
    delete, tombstone, create = s.records(event(CUSTOMERS, Op.UPDATE, before, after))
    assert delete.key == tombstone.key == b'{"id":1}'
    assert create.key == b'{"id":2}'
    assert tombstone.value is None
    assert payload(delete)["op"] == "d" and payload(delete)["before"]["id"] == 1 and payload(delete)["after"] is None
    assert payload(create)["op"] == "c" and payload(create)["after"]["id"] == 2 and payload(create)["before"] is None
    assert ("__debezium.newkey", b'{"id":2}') in delete.headers
    assert ("__debezium.newkey", b'{"id":2}') in tombstone.headers
    assert ("__debezium.oldkey", b'{"id":1}') in create.headers
    assert ("cdc.lsn", b"24023128") in create.headers


def test_primary_key_change_headers_are_payloads_even_with_schemas() -> None:
    s, _ = serializer(schemas_enable=True)
    delete, _, create = s.records(event(CUSTOMERS, Op.UPDATE, dict(ALICE_BEFORE, id=1), dict(ALICE_AFTER, id=2)))
    assert dict(delete.headers)["__debezium.newkey"] == b'{"id":2}'
    assert dict(create.headers)["__debezium.oldkey"] == b'{"id":1}'
    assert orjson.loads(create.key)["payload"] == {"id": 2}


def test_a_key_whose_bytes_change_is_a_key_change() -> None:
    # 1.0 and 1.00 are equal in Python and in PostgreSQL, but the string encoding differs:
    # the old key's record must still be deleted, or compaction keeps it forever.
    table = TableSchema("public", "m", (Column("k", NUMERIC, key=True, nullable=False),))
    s, _ = serializer(decimal_handling="string")
    records = s.records(event(table, Op.UPDATE, {"k": Decimal("1.0")}, {"k": Decimal("1.00")}))
    assert [r.key for r in records] == [b'{"k":"1.0"}', b'{"k":"1.0"}', b'{"k":"1.00"}']


def test_truncate_markers_go_to_every_partition() -> None:
    s, asked = serializer(partitions=3)
    other = TableSchema("inv", "orders", (Column("id", INT8, key=True, nullable=False),))
    truncate = TruncateEvent((CUSTOMERS, other), False, False, Lsn(500), Lsn(400), 9, 2, COMMIT_US)
    records = s.records(truncate)
    assert asked == ["dbserver1.public.customers", "dbserver1.inv.orders"]
    assert [(r.topic, r.partition) for r in records] == [
        ("dbserver1.public.customers", 0),
        ("dbserver1.public.customers", 1),
        ("dbserver1.public.customers", 2),
        ("dbserver1.inv.orders", 0),
        ("dbserver1.inv.orders", 1),
        ("dbserver1.inv.orders", 2),
    ]
    for record in records:
        assert record.partition is not None
        # the table's key fields, all null: the same key on every partition (compaction is per partition)
        assert record.key == (b'{"id":null}')
        assert ("cdc.truncate", b"1") in record.headers
        assert ("cdc.lsn", b"400") in record.headers and ("cdc.txid", b"9") in record.headers
        p = payload(record)
        assert p["op"] == "t" and p["before"] is None and p["after"] is None
        assert p["source"]["table"] == record.topic.rsplit(".", 1)[1]
        assert p["source"]["lsn"] == 400
    assert all(r.key is not None for r in records)  # one marker per partition, never a null key


def test_truncate_marker_keys_never_collide_with_row_keys() -> None:
    s, _ = serializer(partitions=2)
    markers = s.records(TruncateEvent((CUSTOMERS,), False, False, Lsn(1), Lsn(1), None, 1, COMMIT_US))
    rows = [s.records(event(CUSTOMERS, Op.CREATE, None, dict(ALICE_AFTER, id=i)))[0] for i in range(3)]
    assert not {m.key for m in markers} & {r.key for r in rows}
    assert all(orjson.loads(m.key) == {"id": None} for m in markers)


def test_a_row_whose_key_columns_are_all_null_is_an_error() -> None:
    # its key would be the truncate markers' key (and could not tell two such rows apart)
    table = TableSchema("public", "t", (Column("k", INT4, key=True, nullable=True), Column("v", TEXT)))
    s, _ = serializer()
    with pytest.raises(SerializationError, match=r"every key column \(k\) is NULL"):
        s.records(event(table, Op.CREATE, None, {"k": None, "v": "x"}))
    assert s.row_rendering(table) is None  # a nullable key column: rows take the typed path, which checks


def test_truncate_with_schemas() -> None:
    s, _ = serializer(partitions=1, schemas_enable=True)
    [marker] = s.records(TruncateEvent((CUSTOMERS,), False, False, Lsn(1), Lsn(1), 5, 1, COMMIT_US))
    key = orjson.loads(marker.key)
    assert key == {
        "schema": {
            "type": "struct",
            "fields": [{"type": "int32", "optional": True, "field": "id"}],
            "optional": False,
            "name": "dbserver1.public.customers.TruncateKey",
        },
        "payload": {"id": None},
    }
    assert schema_of(marker)["name"] == "dbserver1.public.customers.Envelope"


def test_truncate_needs_a_partition() -> None:
    s, _ = serializer(partitions=0)
    with pytest.raises(SerializationError, match="partitions"):
        s.records(TruncateEvent((CUSTOMERS,), False, False, Lsn(1), Lsn(1), 5, 1, COMMIT_US))


def test_logical_message() -> None:
    s, _ = serializer()
    message = MessageEvent("outbox", b"\x00hello\xff", True, Lsn(700), Lsn(650), 42, 3, COMMIT_US)
    [record] = s.records(message)
    assert record.topic == "dbserver1.message"
    assert record.key == b'{"prefix":"outbox"}'
    p = payload(record)
    assert list(p) == ["op", "ts_ms", "source", "message"]
    assert p["op"] == "m" and p["ts_ms"] == CLOCK_NS // 10**6
    assert p["message"] == {"prefix": "outbox", "content": base64.b64encode(b"\x00hello\xff").decode()}
    assert p["source"]["txId"] == 42 and p["source"]["lsn"] == 650
    assert p["source"]["sequence"] == '["700","650"]'
    assert p["source"]["ts_ms"] == COMMIT_US // 1000
    assert record.headers == (
        ("cdc.lsn", b"650"),
        ("cdc.commit_lsn", b"700"),
        ("cdc.txid", b"42"),
        ("cdc.ordinal", b"3"),
    )


def test_non_transactional_message() -> None:
    s, _ = serializer()
    [record] = s.records(MessageEvent("p", b"x", False, None, Lsn(650), None, 0, None))
    p = payload(record)
    assert p["source"]["sequence"] == '[null,"650"]'
    assert p["source"]["ts_ms"] == CLOCK_NS // 10**6  # no commit time: the serializer's clock
    assert [name for name, _ in record.headers] == ["cdc.lsn", "cdc.ordinal"]


def test_message_with_schemas() -> None:
    s, _ = serializer(schemas_enable=True)
    [record] = s.records(MessageEvent("p", b"x", True, Lsn(1), Lsn(1), 1, 1, COMMIT_US))
    key = orjson.loads(record.key)
    assert key["schema"] == {
        "type": "struct",
        "fields": [{"type": "string", "optional": True, "field": "prefix"}],
        "optional": False,
        "name": "io.debezium.connector.postgresql.MessageKey",
        "version": 1,
    }
    schema = schema_of(record)
    assert schema["name"] == "io.debezium.connector.postgresql.MessageValue"
    assert [f["field"] for f in schema["fields"]] == ["op", "ts_ms", "source", "message"]
    assert schema["fields"][3] == {
        "type": "struct",
        "fields": [
            {"type": "string", "optional": True, "field": "prefix"},
            {"type": "bytes", "optional": True, "field": "content"},
        ],
        "optional": False,
        "name": "io.debezium.connector.postgresql.Message",
        "version": 1,
        "field": "message",
    }


# --- topics ------------------------------------------------------------------------


def test_topic_names_replace_odd_characters() -> None:
    s, _ = serializer()
    table = TableSchema("Sales Dept", "orders/2024ü", (Column("id", INT4, key=True),))
    assert s.topic_for(table) == "dbserver1.Sales_Dept.orders_2024_"
    assert s.topic_name("public", "a-b.c") == "dbserver1.public.a-b.c"


def test_two_tables_on_one_topic_is_an_error() -> None:
    s, _ = serializer()
    assert s.topic_name("public", "a b") == "dbserver1.public.a_b"
    with pytest.raises(SerializationError, match="a_b"):
        s.topic_name("public", "a_b")


# --- values by type ------------------------------------------------------------------


def one_value(pg_type: PgType, value: Any, modifier: int = -1, **options: Any) -> tuple[Any, dict[str, Any]]:
    """(JSON payload value, schema node) of one column holding ``value``."""
    table = TableSchema("public", "t", (Column("k", INT4, key=True, nullable=False), Column("v", pg_type, modifier)))
    s, _ = serializer(schemas_enable=True, **options)
    [record] = s.records(event(table, Op.CREATE, None, {"k": 1, "v": value}))
    node = schema_of(record)["fields"][1]["fields"][1]
    return payload(record)["after"]["v"], node


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_integers() -> None:
    assert one_value(T(21, "int2"), -5) == (-5, {"type": "int16", "optional": True, "field": "v"})
    assert one_value(INT4, 2**31 - 1) == (2**31 - 1, {"type": "int32", "optional": True, "field": "v"})
    assert one_value(INT8, -(2**63)) == (-(2**63), {"type": "int64", "optional": True, "field": "v"})
    assert one_value(T(26, "oid"), 4294967295) == (4294967295, {"type": "int64", "optional": True, "field": "v"})


@pytest.mark.parametrize(
    ("value", "expected"), [(1.5, 1.5), (math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")]
)
def test_floats(value: float, expected: Any) -> None:
    assert one_value(T(701, "float8"), value) == (expected, {"type": "double", "optional": True, "field": "v"})
    assert one_value(T(700, "float4"), value)[1]["type"] == "float"


@pytest.mark.parametrize(
    ("value", "unscaled"),
    [
        (Decimal("1000.00"), b"\x01\x86\xa0"),
        (Decimal("1234.56"), b"\x01\xe2\x40"),
        (Decimal("0.00"), b"\x00"),
        (Decimal("1.27"), b"\x7f"),
        (Decimal("1.28"), b"\x00\x80"),
        (Decimal("-1.28"), b"\x80"),
        (Decimal("-1.29"), b"\xff\x7f"),
        (Decimal("-0.01"), b"\xff"),
        (Decimal("12345678.90"), (1234567890).to_bytes(4, "big")),
    ],
)
def test_constrained_numeric_is_a_connect_decimal(value: Decimal, unscaled: bytes) -> None:
    encoded, node = one_value(NUMERIC, value, numeric_mod(10, 2))
    assert encoded == b64(unscaled)
    assert node == {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "v",
    }


def test_numeric_with_scale_zero_and_huge_precision() -> None:
    value = Decimal("9" * 100)
    encoded, node = one_value(NUMERIC, value, numeric_mod(1000, 0))
    assert int.from_bytes(base64.b64decode(encoded), "big", signed=True) == int("9" * 100)
    assert node["parameters"] == {"scale": "0", "connect.decimal.precision": "1000"}


def test_numeric_with_negative_scale() -> None:
    # numeric(3, -2) (PostgreSQL 15+): the scale is an 11-bit two's-complement field
    modifier = ((3 << 16) | (-2 & 0x7FF)) + 4
    encoded, node = one_value(NUMERIC, Decimal("12300"), modifier)
    assert node["parameters"] == {"scale": "-2", "connect.decimal.precision": "3"}
    assert base64.b64decode(encoded) == b"\x7b"  # 123


@pytest.mark.parametrize(
    ("value", "scale", "unscaled"),
    [
        (Decimal("1000.00"), 0, 1000),
        (Decimal("1234.5600"), 2, 123456),
        (Decimal("-0.001"), 3, -1),
        (Decimal("0"), 0, 0),
        (Decimal("0.000"), 0, 0),
        (Decimal("123456789012345678901234567890.123456789"), 9, 123456789012345678901234567890123456789),
    ],
)
def test_unconstrained_numeric_is_a_variable_scale_decimal(value: Decimal, scale: int, unscaled: int) -> None:
    encoded, node = one_value(NUMERIC, value)
    assert encoded["scale"] == scale
    assert int.from_bytes(base64.b64decode(encoded["value"]), "big", signed=True) == unscaled
    assert list(encoded) == ["scale", "value"]
    assert node == {
        "type": "struct",
        "fields": [
            {"type": "int32", "optional": False, "field": "scale"},
            {"type": "bytes", "optional": False, "field": "value"},
        ],
        "optional": True,
        "name": "io.debezium.data.VariableScaleDecimal",
        "version": 1,
        "doc": "Variable scaled decimal",
        "field": "v",
    }


@pytest.mark.parametrize("special", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("modifier", [-1, numeric_mod(10, 2)])
def test_special_numerics_in_precise_mode_are_a_clear_error(special: str, modifier: int) -> None:
    with pytest.raises(SerializationError) as info:
        one_value(NUMERIC, Decimal(special), modifier)
    message = str(info.value)
    assert "'v'" in message and "public.t" in message and "decimal_handling='string'" in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Decimal("1234.5600"), "1234.5600"),
        (Decimal("0.0000001"), "0.0000001"),
        (Decimal("NaN"), "NaN"),
        (Decimal("Infinity"), "Infinity"),
        (Decimal("-Infinity"), "-Infinity"),
    ],
)
def test_numeric_string_mode(value: Decimal, expected: str) -> None:
    assert one_value(NUMERIC, value, decimal_handling="string") == (
        expected,
        {"type": "string", "optional": True, "field": "v"},
    )


def test_numeric_double_mode() -> None:
    assert one_value(NUMERIC, Decimal("1234.56"), numeric_mod(10, 2), decimal_handling="double") == (
        1234.56,
        {"type": "double", "optional": True, "field": "v"},
    )
    assert one_value(NUMERIC, Decimal("NaN"), decimal_handling="double")[0] == "NaN"
    assert one_value(NUMERIC, Decimal("-Infinity"), decimal_handling="double")[0] == "-Infinity"


def test_money() -> None:
    encoded, node = one_value(T(790, "money"), Decimal("-1234.56"))
    assert base64.b64decode(encoded) == (-123456).to_bytes(3, "big", signed=True)
    assert node["name"] == "org.apache.kafka.connect.data.Decimal"
    assert node["parameters"] == {"scale": "2"}
    assert one_value(T(790, "money"), Decimal("-1234.56"), decimal_handling="string")[0] == "-1234.56"
    assert one_value(T(790, "money"), Decimal("1.50"), decimal_handling="double")[0] == 1.5


def test_bytea_is_padded_base64() -> None:
    assert one_value(T(17, "bytea"), b"\x00\xffab") == ("AP9hYg==", {"type": "bytes", "optional": True, "field": "v"})
    assert one_value(T(17, "bytea"), b"")[0] == ""


def test_bool_and_text() -> None:
    assert one_value(T(16, "bool"), True) == (True, {"type": "boolean", "optional": True, "field": "v"})
    for name, oid in (("text", 25), ("varchar", 1043), ("bpchar", 1042), ("name", 19), ("char", 18)):
        assert one_value(T(oid, name), 'héllo "✓"') == ('héllo "✓"', {"type": "string", "optional": True, "field": "v"})


@pytest.mark.parametrize(
    ("pg_type", "value", "name"),
    [
        (T(2950, "uuid"), UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), "io.debezium.data.Uuid"),
        (T(114, "json"), '{"a": 1}', "io.debezium.data.Json"),
        (T(3802, "jsonb"), '{"a": [1, 2]}', "io.debezium.data.Json"),
        (T(142, "xml"), "<a>x</a>", "io.debezium.data.Xml"),
    ],
)
def test_named_strings(pg_type: PgType, value: Any, name: str) -> None:
    assert one_value(pg_type, value) == (
        str(value),
        {"type": "string", "optional": True, "name": name, "version": 1, "field": "v"},
    )


@pytest.mark.parametrize(
    ("pg_type", "text"),
    [
        (T(869, "inet"), "10.0.0.1/8"),
        (T(650, "cidr"), "10.0.0.0/8"),
        (T(829, "macaddr"), "08:00:2b:01:02:03"),
        (T(774, "macaddr8"), "08:00:2b:01:02:03:04:05"),
        (PgType(3904, "int4range", TypeKind.RANGE, element=INT4), "[1,10)"),
        (PgType(3910, "tstzrange", TypeKind.RANGE, element=TSTZ), '["2024-01-01 00:00:00+00",)'),
    ],
)
def test_plain_strings(pg_type: PgType, text: str) -> None:
    assert one_value(pg_type, text) == (text, {"type": "string", "optional": True, "field": "v"})


def test_dates() -> None:
    node = {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "v"}
    date_type = T(1082, "date")
    assert one_value(date_type, 19844) == (19844, node)
    assert one_value(date_type, -735160)[0] == -735160
    assert one_value(date_type, Infinity.POSITIVE)[0] == 2**31 - 1
    assert one_value(date_type, Infinity.NEGATIVE)[0] == -(2**31)


def test_time_precision_picks_milliseconds_or_microseconds() -> None:
    time_type = T(1083, "time")
    value = 45_296_789_012  # 12:34:56.789012
    assert one_value(time_type, 45_296_789_000, 3) == (
        45_296_789,
        {"type": "int32", "optional": True, "name": "io.debezium.time.Time", "version": 1, "field": "v"},
    )
    assert one_value(time_type, value, 6) == (
        value,
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "version": 1, "field": "v"},
    )
    assert one_value(time_type, value)[1]["name"] == "io.debezium.time.MicroTime"  # no precision: 6
    assert one_value(time_type, 86_400_000_000)[0] == 86_400_000_000  # 24:00:00


def test_timestamp_precision_and_infinity() -> None:
    ts = T(1114, "timestamp")
    assert one_value(ts, 1714566896_789000, 3) == (
        1714566896_789,
        {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "version": 1, "field": "v"},
    )
    assert one_value(ts, -1, 3)[0] == -1  # floor, as java.time does
    assert one_value(ts, 1714566896_789012) == (
        1714566896_789012,
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "v"},
    )
    assert one_value(ts, Infinity.POSITIVE)[0] == 9223372036825200000
    assert one_value(ts, Infinity.NEGATIVE)[0] == -9223372036832400000
    assert one_value(ts, Infinity.POSITIVE, 3)[0] == 9223372036825200000


@pytest.mark.parametrize(
    ("value", "modifier", "expected"),
    [
        (1714566896_789012, -1, "2024-05-01T12:34:56.789012Z"),
        (1714566896_000000, -1, "2024-05-01T12:34:56.000000Z"),
        (1714566896_789000, 3, "2024-05-01T12:34:56.789Z"),
        (1714566896_000000, 0, "2024-05-01T12:34:56Z"),
        (0, 6, "1970-01-01T00:00:00.000000Z"),
        (-1, 6, "1969-12-31T23:59:59.999999Z"),
        (-63517780800_000000, 0, "-0043-03-15T12:00:00Z"),  # 44 BC
        (-62167219200_000000, 0, "0000-01-01T00:00:00Z"),  # 1 BC
        (253402300800_000000, 0, "+10000-01-01T00:00:00Z"),
        (Infinity.POSITIVE, -1, "infinity"),
        (Infinity.NEGATIVE, -1, "-infinity"),
    ],
)
def test_timestamptz_is_a_zoned_timestamp(value: int | Infinity, modifier: int, expected: str) -> None:
    assert one_value(TSTZ, value, modifier) == (
        expected,
        {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "v"},
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (TimeTz(43_200_000_000, 19800), "06:30:00Z"),
        (TimeTz(3_600_500_000, 7200), "23:00:00.5Z"),
        (TimeTz(82_800_000_000, -7200), "01:00:00Z"),
        (TimeTz(86_400_000_000, 0), "24:00:00Z"),
        (TimeTz(45_296_789_012, -19815), "18:05:11.789012Z"),
    ],
)
def test_timetz_is_a_zoned_time_in_utc(value: TimeTz, expected: str) -> None:
    assert one_value(T(1266, "timetz"), value) == (
        expected,
        {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTime", "version": 1, "field": "v"},
    )


@pytest.mark.parametrize(
    ("value", "micros", "iso"),
    [
        (Interval(0, 0, 0), 0, "P0Y0M0DT0H0M0S"),
        (Interval(14, 3, 14_706_780_000), 37_091_106_780_000, "P1Y2M3DT4H5M6.78S"),
        (Interval(1, 0, 0), 2_629_800_000_000, "P0Y1M0DT0H0M0S"),
        (Interval(-14, -3, -14_706_000_000), None, "P-1Y-2M-3DT-4H-5M-6S"),
        (Interval(0, 0, -500_000), -500_000, "P0Y0M0DT0H0M-0.5S"),
        (Interval(0, 0, 3_600_000_000), 3_600_000_000, "P0Y0M0DT1H0M0S"),
        (Interval(2**31 - 1, 2**31 - 1, 2**63 - 1), 2**63 - 1, "infinity"),
        (Interval(-(2**31), -(2**31), -(2**63)), -(2**63), "-infinity"),
    ],
)
def test_interval(value: Interval, micros: int | None, iso: str) -> None:
    encoded, node = one_value(T(1186, "interval"), value)
    expected_micros = (
        micros
        if micros is not None
        else value.months * 2_629_800_000_000 + value.days * 86_400_000_000 + value.microseconds
    )
    assert encoded == expected_micros
    assert node == {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroDuration",
        "version": 1,
        "field": "v",
    }
    assert one_value(T(1186, "interval"), value, interval_handling="string") == (
        iso,
        {"type": "string", "optional": True, "name": "io.debezium.time.Interval", "version": 1, "field": "v"},
    )


def test_iso_time_precision() -> None:
    assert one_value(T(1082, "date"), 19844, time_precision="iso") == (
        "2024-05-01Z",
        {"type": "string", "optional": True, "name": "io.debezium.time.IsoDate", "version": 1, "field": "v"},
    )
    assert one_value(T(1082, "date"), Infinity.NEGATIVE, time_precision="iso")[0] == "-infinity"
    assert one_value(T(1083, "time"), 45_296_500_000, 3, time_precision="iso") == (
        "12:34:56.5Z",
        {"type": "string", "optional": True, "name": "io.debezium.time.IsoTime", "version": 1, "field": "v"},
    )
    assert one_value(T(1114, "timestamp"), 1714566896_000000, time_precision="iso") == (
        "2024-05-01T12:34:56Z",
        {"type": "string", "optional": True, "name": "io.debezium.time.IsoTimestamp", "version": 1, "field": "v"},
    )
    assert one_value(T(1114, "timestamp"), Infinity.POSITIVE, time_precision="iso")[0] == "infinity"
    assert one_value(TSTZ, 1714566896_000000, time_precision="iso")[0] == "2024-05-01T12:34:56.000000Z"


def test_hstore_is_json_text() -> None:
    hstore = PgType(80001, "hstore", TypeKind.BASE, "public")
    encoded, node = one_value(hstore, {"a": "1", "b": None, 'q"': "é"})
    assert orjson.loads(encoded) == {"a": "1", "b": None, 'q"': "é"}
    assert encoded == '{"a":"1","b":null,"q\\"":"é"}'
    assert node == {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1, "field": "v"}


def test_point_is_a_debezium_point() -> None:
    encoded, node = one_value(T(600, "point"), Point(1.5, -2.0))
    assert encoded == {
        "x": 1.5,
        "y": -2.0,
        "wkb": b64(b"\x01\x01\x00\x00\x00" + struct.pack("<dd", 1.5, -2.0)),
        "srid": None,
    }
    assert node == {
        "type": "struct",
        "fields": [
            {"type": "double", "optional": False, "field": "x"},
            {"type": "double", "optional": False, "field": "y"},
            {"type": "bytes", "optional": True, "field": "wkb"},
            {"type": "int32", "optional": True, "field": "srid"},
        ],
        "optional": True,
        "name": "io.debezium.data.geometry.Point",
        "version": 1,
        "doc": "Geometry (POINT)",
        "field": "v",
    }


def test_bits() -> None:
    assert one_value(T(1560, "bit"), "1", 1) == (True, {"type": "boolean", "optional": True, "field": "v"})
    assert one_value(T(1560, "bit"), "0", 1)[0] is False
    encoded, node = one_value(T(1560, "bit"), "0000000100000010", 16)
    assert base64.b64decode(encoded) == b"\x02\x01"  # little-endian
    assert node == {
        "type": "bytes",
        "optional": True,
        "name": "io.debezium.data.Bits",
        "version": 1,
        "parameters": {"length": "16"},
        "field": "v",
    }
    assert one_value(T(1562, "varbit"), "101")[0] == b64(b"\x05")
    assert one_value(T(1562, "varbit"), "000")[0] == ""
    assert one_value(T(1562, "varbit"), "101")[1]["parameters"] == {"length": "2147483647"}


def test_enum() -> None:
    mood = PgType(70001, "mood", TypeKind.ENUM, "public", labels=("sad", "ok", "happy"))
    assert one_value(mood, "ok") == (
        "ok",
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": "sad,ok,happy"},
            "field": "v",
        },
    )


def test_domain_is_its_base_type() -> None:
    price = PgType(70004, "price", TypeKind.DOMAIN, "public", element=NUMERIC)
    encoded, node = one_value(price, Decimal("9.99"), numeric_mod(5, 2))
    assert encoded == b64((999).to_bytes(2, "big"))
    assert node["name"] == "org.apache.kafka.connect.data.Decimal"


def test_arrays() -> None:
    ints = PgType(1007, "_int4", TypeKind.ARRAY, element=INT4)
    assert one_value(ints, [1, None, 3]) == (
        [1, None, 3],
        {"type": "array", "items": {"type": "int32", "optional": True}, "optional": True, "field": "v"},
    )
    assert one_value(ints, [[1, 2], [None, 4]])[0] == [[1, 2], [None, 4]]
    floats = PgType(1022, "_float8", TypeKind.ARRAY, element=T(701, "float8"))
    assert one_value(floats, [1.5, math.nan, -math.inf])[0] == [1.5, "NaN", "-Infinity"]
    numerics = PgType(1231, "_numeric", TypeKind.ARRAY, element=NUMERIC)
    encoded, node = one_value(numerics, [Decimal("1.50"), None], numeric_mod(5, 2))
    assert encoded == [b64((150).to_bytes(2, "big")), None]
    assert node["items"]["parameters"] == {"scale": "2", "connect.decimal.precision": "5"}
    assert node["items"]["optional"] is True
    stamps = PgType(1185, "_timestamptz", TypeKind.ARRAY, element=TSTZ)
    assert one_value(stamps, [[0], [Infinity.POSITIVE]])[0] == [["1970-01-01T00:00:00.000000Z"], ["infinity"]]
    mood = PgType(70001, "mood", TypeKind.ENUM, "public", labels=("a", "b"))
    moods = PgType(70002, "_mood", TypeKind.ARRAY, "public", element=mood)
    encoded, node = one_value(moods, ["a", "b"])
    assert encoded == ["a", "b"] and node["items"]["parameters"] == {"allowed": "a,b"}
    points = PgType(1017, "_point", TypeKind.ARRAY, element=T(600, "point"))
    assert one_value(points, [Point(1, 2)])[0][0]["x"] == 1


@pytest.mark.parametrize(
    "pg_type",
    [
        PgType(90001, "mystery", TypeKind.UNKNOWN, "public"),
        PgType(90002, "address", TypeKind.COMPOSITE, "public"),
        PgType(3614, "tsvector"),
        PgType(603, "box"),
        PgType(4451, "int4multirange", TypeKind.MULTIRANGE),
        PgType(4072, "jsonpath"),
    ],
)
def test_unknown_types_are_strings_marked_with_their_type(pg_type: PgType) -> None:
    assert one_value(pg_type, "some text") == (
        "some text",
        {
            "type": "string",
            "optional": True,
            "parameters": {"__debezium.source.column.type": pg_type.name},
            "field": "v",
        },
    )


def test_unchanged_toast_placeholders() -> None:
    table = TableSchema(
        "public",
        "docs",
        (
            Column("id", INT4, key=True, nullable=False),
            Column("body", TEXT),
            Column("blob", T(17, "bytea")),
            Column("tags", PgType(1009, "_text", TypeKind.ARRAY, element=TEXT)),
            Column("nums", PgType(1007, "_int4", TypeKind.ARRAY, element=INT4)),
            Column("doc", T(3802, "jsonb")),
        ),
    )
    s, _ = serializer(unavailable_value="__gone")
    after = {
        "id": 1,
        "body": UNCHANGED_TOAST,
        "blob": UNCHANGED_TOAST,
        "tags": UNCHANGED_TOAST,
        "nums": UNCHANGED_TOAST,
        "doc": UNCHANGED_TOAST,
    }
    [record] = s.records(event(table, Op.UPDATE, None, after, unchanged=frozenset(after) - {"id"}))
    assert payload(record)["after"] == {
        "id": 1,
        "body": "__gone",
        "blob": b64(b"__gone"),
        "tags": ["__gone"],
        "nums": list(b"__gone"),
        "doc": "__gone",
    }


def test_an_unchanged_toast_key_is_an_error() -> None:
    table = TableSchema("public", "docs", (Column("id", TEXT, key=True, nullable=False),))
    s, _ = serializer()
    with pytest.raises(SerializationError, match="TOAST"):
        s.records(event(table, Op.UPDATE, None, {"id": UNCHANGED_TOAST}))


def test_a_value_of_the_wrong_type_names_its_column() -> None:
    s, _ = serializer()
    with pytest.raises(SerializationError, match="'balance'"):
        s.records(event(CUSTOMERS, Op.CREATE, None, dict(ALICE_AFTER, balance="12.5")))
    with pytest.raises(SerializationError, match="customers"):
        s.records(event(CUSTOMERS, Op.CREATE, None, dict(ALICE_AFTER, name=object())))


# --- schema blocks -----------------------------------------------------------------


def test_value_schema_nullability_follows_columns_and_keys() -> None:
    table = TableSchema(
        "public",
        "t",
        (
            Column("a", INT4, key=True, nullable=False),
            Column("b", TEXT, nullable=False),
            Column("c", TEXT, nullable=True),
        ),
    )
    s, _ = serializer(schemas_enable=True)
    [record] = s.records(event(table, Op.CREATE, None, {"a": 1, "b": "x", "c": None}))
    schema = schema_of(record)
    assert schema["name"] == "dbserver1.public.t.Envelope" and schema["version"] == 2 and schema["optional"] is False
    row = schema["fields"][0]
    assert row["name"] == "dbserver1.public.t.Value" and "version" not in row
    assert [(f["field"], f["optional"]) for f in row["fields"]] == [("a", False), ("b", False), ("c", True)]
    assert schema["fields"][1] == dict(row, field="after")
    assert orjson.loads(record.key)["schema"] == {
        "type": "struct",
        "fields": [{"type": "int32", "optional": False, "field": "a"}],
        "optional": False,
        "name": "dbserver1.public.t.Key",
    }


def test_schema_key_order_is_jsonconverters() -> None:
    s, _ = serializer(schemas_enable=True)
    [record] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    order = ["type", "fields", "items", "optional", "name", "version", "doc", "parameters", "default", "field"]

    def check(node: Any) -> None:
        keys = list(node)
        assert keys == sorted(keys, key=order.index)
        for child in node.get("fields", []):
            check(child)
        if "items" in node:
            check(node["items"])

    check(schema_of(record))


def test_schema_blocks_are_cached_per_table_schema() -> None:
    s, _ = serializer(schemas_enable=True)
    first = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))[0]
    same_but_new = TableSchema(CUSTOMERS.schema, CUSTOMERS.name, CUSTOMERS.columns, replica_identity="f")
    second = s.records(event(same_but_new, Op.CREATE, None, ALICE_AFTER))[0]
    assert first.value == second.value
    widened = TableSchema("public", "customers", (*CUSTOMERS.columns, Column("email", TEXT)))
    third = s.records(event(widened, Op.CREATE, None, dict(ALICE_AFTER, email="a@x")))[0]
    assert [f["field"] for f in schema_of(third)["fields"][1]["fields"]][-1] == "email"


# --- keys ------------------------------------------------------------------------------


def test_a_table_without_key_columns_is_an_error() -> None:
    table = TableSchema("public", "heap", (Column("a", INT4), Column("b", TEXT)))
    s, _ = serializer()
    with pytest.raises(SerializationError, match="no key columns"):
        s.records(event(table, Op.CREATE, None, {"a": 1, "b": "x"}))


COMPOSITE = TableSchema(
    "public",
    "pairs",
    (
        Column("name", TEXT, key=True, nullable=False),
        Column("payload", TEXT),
        Column("n", INT8, key=True, nullable=False),
    ),
)


def test_composite_keys_are_in_column_order_and_deterministic() -> None:
    s, _ = serializer()
    row = {"name": "x", "payload": "p", "n": 5}
    keys = {
        s.records(event(COMPOSITE, Op.CREATE, None, row))[0].key,
        s.records(event(COMPOSITE, Op.UPDATE, None, dict(row, payload="q")))[0].key,
        s.records(event(COMPOSITE, Op.DELETE, {"name": "x", "n": 5}, None))[0].key,
        s.records(event(COMPOSITE, Op.READ, None, row, snapshot=True))[0].key,
    }
    assert keys == {b'{"name":"x","n":5}'}


TRICKY = st.text(alphabet=st.sampled_from(list('a"\\,:{}[] \n\u00e9\u2713\U0001f600\x00')), max_size=6) | st.text(
    max_size=6
)


@given(st.tuples(TRICKY, st.integers(-(2**63), 2**63 - 1)), st.tuples(TRICKY, st.integers(-(2**63), 2**63 - 1)))
def test_keys_are_injective(a: tuple[str, int], b: tuple[str, int]) -> None:
    s, _ = serializer()
    key_a = s.records(event(COMPOSITE, Op.CREATE, None, {"name": a[0], "payload": None, "n": a[1]}))[0].key
    key_b = s.records(event(COMPOSITE, Op.CREATE, None, {"name": b[0], "payload": None, "n": b[1]}))[0].key
    assert (key_a == key_b) == (a == b)
    assert orjson.loads(key_a) == {"name": a[0], "n": a[1]}


def key_of(pg_type: PgType, value: Any, modifier: int = -1, **options: Any) -> tuple[Any, dict[str, Any]]:
    """(JSON key value, key schema node) of a one-column key holding ``value``."""
    table = TableSchema("public", "t", (Column("v", pg_type, modifier, key=True, nullable=False),))
    s, _ = serializer(schemas_enable=True, **options)
    [record] = s.records(event(table, Op.CREATE, None, {"v": value}))
    key = orjson.loads(record.key)
    return key["payload"]["v"], key["schema"]["fields"][0]


def test_interval_keys_use_the_exact_iso_form() -> None:
    # '1 mon' and '30 days 10:30:00' are one MicroDuration but two rows
    interval = T(1186, "interval")
    month = key_of(interval, Interval(1, 0, 0))
    days = key_of(interval, Interval(0, 30, 37_800_000_000))
    assert month[0] != days[0]
    assert month[1]["name"] == "io.debezium.time.Interval"


def test_double_mode_numeric_keys_stay_exact() -> None:
    a = key_of(NUMERIC, Decimal("0.1000000000000000000001"), decimal_handling="double")
    b = key_of(NUMERIC, Decimal("0.1"), decimal_handling="double")
    assert a[0] != b[0] and a[1]["type"] == "string"


def test_timetz_keys_keep_their_offset() -> None:
    # 12:00+01 and 11:00+00 are the same instant but different timetz values
    timetz = T(1266, "timetz")
    assert key_of(timetz, TimeTz(43_200_000_000, 3600))[0] == "12:00:00+01:00"
    assert key_of(timetz, TimeTz(39_600_000_000, 0))[0] == "11:00:00+00:00"
    assert key_of(timetz, TimeTz(39_600_500_000, -19815))[0] == "11:00:00.5-05:30:15"


@given(
    st.lists(
        st.tuples(st.integers(-1000, 1000), st.integers(-1000, 1000), st.integers(-(10**12), 10**12)),
        min_size=2,
        max_size=2,
    )
)
def test_interval_keys_are_injective(pair: list[tuple[int, int, int]]) -> None:
    a, b = (key_of(T(1186, "interval"), Interval(*p))[0] for p in pair)
    assert (a == b) == (pair[0] == pair[1])


@given(st.decimals(allow_nan=False, allow_infinity=False), st.decimals(allow_nan=False, allow_infinity=False))
def test_unconstrained_numeric_keys_are_injective_on_values(a: Decimal, b: Decimal) -> None:
    key_a, key_b = key_of(NUMERIC, a)[0], key_of(NUMERIC, b)[0]
    assert (key_a == key_b) == (a == b)


# --- settings -------------------------------------------------------------------------


def test_settings_reject_unknown_fields_and_values() -> None:
    with pytest.raises(pydantic.ValidationError):
        JsonSettings(topic_prefix="p", database="d", bogus=1)  # type: ignore[call-arg]  # refusal under test
    with pytest.raises(pydantic.ValidationError):
        JsonSettings(topic_prefix="p", database="d", decimal_handling="float")  # type: ignore[arg-type]  # refusal under test
    with pytest.raises(pydantic.ValidationError):
        JsonSettings(topic_prefix="", database="d")
    settings = JsonSettings(topic_prefix="p", database="d")
    with pytest.raises(pydantic.ValidationError):
        setattr(settings, "database", "x")  # noqa: B010 (frozen)


def test_other_event_types_are_refused() -> None:
    s, _ = serializer()
    with pytest.raises(TypeError):
        s.records(object())  # type: ignore[arg-type]  # the refusal under test
