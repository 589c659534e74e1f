"""cdc.sink.avro: events in, Confluent wire-format Avro out; decoded back with fastavro and the registered schemas."""

from __future__ import annotations

import base64
import io
import math
import struct
from decimal import Decimal
from typing import Any
from uuid import UUID

import fastavro
import orjson
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.event import ChangeEvent, Column, MessageEvent, Op, PgType, TableSchema, TruncateEvent, TypeKind
from cdc.lsn import Lsn
from cdc.sink.avro import AvroSettings, decode_wire
from cdc.sink.avro_schema import avro_field_name, avro_name
from cdc.sink.errors import SerializationError
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.record import Record
from cdc.values import UNCHANGED_TOAST, Infinity, Interval, Point, TimeTz
from tests.support.avro import CLOCK_NS, FakeRegistry, avro, decode, settings

COMMIT_US = 1714566896789012


def T(oid: int, name: str) -> PgType:
    return PgType(oid, name)


INT4, INT8, TEXT, BYTEA = T(23, "int4"), T(20, "int8"), T(25, "text"), T(17, "bytea")
NUMERIC, TSTZ = T(1700, "numeric"), T(1184, "timestamptz")


def numeric_mod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def json_twin(partitions: int = 3, **options: Any) -> JsonSerializer:
    return JsonSerializer(JsonSettings(**settings(**options)), lambda topic: partitions, clock_ns=lambda: CLOCK_NS)


def event(
    table: TableSchema, op: Op, before: dict[str, Any] | None, after: dict[str, Any] | None, **kw: Any
) -> ChangeEvent:
    return ChangeEvent(op, table, before, after, Lsn(24023040), Lsn(24023128), kw.pop("xid", 771), 1, COMMIT_US, **kw)


def resolve(body: bytes, writer: Any, reader: Any) -> Any:
    """Decode ``body`` written with schema ``writer`` as schema ``reader`` (Avro schema resolution)."""
    return fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(writer), fastavro.parse_schema(reader))


def as_json(value: Any) -> Any:
    """An Avro-decoded value in the JSON serializer's encoding (bytes -> base64, decimals -> base64 unscaled)."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Decimal):
        sign, digits, _ = value.as_tuple()  # fastavro gives the value at the schema's scale
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        length = (unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()) // 8 + 1
        return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return value


CUSTOMERS = TableSchema(
    "public",
    "customers",
    (
        Column("id", INT4, key=True, nullable=False),
        Column("name", TEXT),
        Column("balance", NUMERIC, modifier=numeric_mod(10, 2)),
        Column("updated_at", TSTZ),
    ),
    replica_identity="f",
)
ALICE_BEFORE = {"id": 1, "name": "Alice", "balance": Decimal("1000.00"), "updated_at": 1714467600_000000}
ALICE_AFTER = {"id": 1, "name": "Alice", "balance": Decimal("1234.56"), "updated_at": COMMIT_US}


# --- wire format ---------------------------------------------------------------------


def test_records_are_in_the_confluent_wire_format_with_the_registered_ids() -> None:
    s, registry = avro()
    [record] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    assert record.value is not None
    key_id = registry.subjects["dbserver1.public.customers-key"][0]
    value_id = registry.subjects["dbserver1.public.customers-value"][0]
    assert record.key[:5] == b"\x00" + key_id.to_bytes(4, "big")
    assert record.value[:5] == b"\x00" + value_id.to_bytes(4, "big")
    assert record.key[5:] == b"\x02"  # the Avro body: int 1, zig-zag
    assert decode_wire(record.value) == (value_id, record.value[5:])


def test_large_schema_ids_use_all_four_bytes_big_endian() -> None:
    s, _ = avro(registry=FakeRegistry(first_id=0x01020304))
    [record] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    assert record.key[:5] == b"\x00\x01\x02\x03\x04"


def test_a_schema_id_beyond_four_bytes_is_a_clear_error() -> None:
    s, _ = avro(registry=FakeRegistry(first_id=2**32))
    with pytest.raises(SerializationError, match="4 bytes of the Confluent wire format"):
        s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))


def test_decode_wire_refuses_other_bytes() -> None:
    with pytest.raises(ValueError, match="magic byte"):
        decode_wire(b'{"id":1}')
    with pytest.raises(ValueError):
        decode_wire(b"\x00\x00\x01")


# --- the note's example, in Avro ---------------------------------------------------------


def test_the_notes_update_decodes_to_the_same_values_as_the_json_record() -> None:
    s, registry = avro()
    [record] = s.records(event(CUSTOMERS, Op.UPDATE, ALICE_BEFORE, ALICE_AFTER))
    [twin] = json_twin().records(event(CUSTOMERS, Op.UPDATE, ALICE_BEFORE, ALICE_AFTER))
    assert record.topic == twin.topic == "dbserver1.public.customers"
    assert decode(registry, record.key) == orjson.loads(twin.key) == {"id": 1}
    value = decode(registry, record.value)
    assert list(value) == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
    assert value["after"]["balance"] == Decimal("1234.56")
    assert value["before"]["balance"] == Decimal("1000.00")
    assert value["after"]["updated_at"] == "2024-05-01T12:34:56.789012Z"
    assert as_json(value) == orjson.loads(twin.value or b"")
    assert record.headers == twin.headers


def test_source_and_envelope_fields() -> None:
    s, registry = avro()
    [record] = s.records(event(CUSTOMERS, Op.READ, None, ALICE_AFTER, snapshot=True, xid=None))
    value = decode(registry, record.value)
    assert value["op"] == "r" and value["before"] is None and value["transaction"] is None
    assert (value["ts_ms"], value["ts_us"], value["ts_ns"]) == (CLOCK_NS // 10**6, CLOCK_NS // 10**3, CLOCK_NS)
    assert value["source"] == {
        "version": "3.6.1.Final",
        "connector": "postgresql",
        "name": "dbserver1",
        "ts_ms": COMMIT_US // 1000,
        "snapshot": "true",
        "db": "inventory",
        "sequence": '["24023040","24023128"]',
        "ts_us": COMMIT_US,
        "ts_ns": COMMIT_US * 1000,
        "schema": "public",
        "table": "customers",
        "txId": None,
        "lsn": 24023128,
        "xmin": None,
        "origin": None,
        "origin_lsn": None,
    }


# --- schemas -------------------------------------------------------------------------


def schemas(table: TableSchema, **options: Any) -> tuple[Any, Any]:
    s, _ = avro(**options)
    return s.schemas(table)


def test_key_schema_is_the_topics_key_record() -> None:
    key, _ = schemas(CUSTOMERS)
    assert key == {
        "type": "record",
        "name": "Key",
        "namespace": "dbserver1.public.customers",
        "fields": [{"name": "id", "type": "int"}],
        "connect.name": "dbserver1.public.customers.Key",
    }


def test_value_schema_is_debeziums_envelope_as_avrodata_writes_it() -> None:
    _, value = schemas(CUSTOMERS)
    assert (value["type"], value["name"], value["namespace"]) == ("record", "Envelope", "dbserver1.public.customers")
    assert (value["connect.version"], value["connect.name"]) == (2, "dbserver1.public.customers.Envelope")
    fields = {f["name"]: f for f in value["fields"]}
    assert list(fields) == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
    null, row = fields["before"]["type"]
    assert null == "null" and fields["before"]["default"] is None
    assert fields["after"] == {"name": "after", "type": ["null", "dbserver1.public.customers.Value"], "default": None}
    assert (row["name"], row["namespace"], row["connect.name"]) == (
        "Value",
        "dbserver1.public.customers",
        "dbserver1.public.customers.Value",
    )
    assert "connect.version" not in row
    assert row["fields"] == [
        {"name": "id", "type": "int"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {
            "name": "balance",
            "type": [
                "null",
                {
                    "type": "bytes",
                    "scale": 2,
                    "precision": 10,
                    "connect.version": 1,
                    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                    "connect.name": "org.apache.kafka.connect.data.Decimal",
                    "logicalType": "decimal",
                },
            ],
            "default": None,
        },
        {
            "name": "updated_at",
            "type": [
                "null",
                {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"},
            ],
            "default": None,
        },
    ]
    assert fields["op"] == {"name": "op", "type": "string"}
    assert fields["ts_ms"] == {"name": "ts_ms", "type": ["null", "long"], "default": None}
    block = fields["transaction"]["type"][1]
    assert (block["name"], block["namespace"], block["connect.version"], block["connect.name"]) == (
        "block",
        "event",
        1,
        "event.block",
    )
    assert [f["name"] for f in block["fields"]] == ["id", "total_order", "data_collection_order"]


def test_source_record_keeps_the_snapshot_default_first_in_its_union() -> None:
    _, value = schemas(CUSTOMERS)
    source = value["fields"][2]["type"]
    assert (source["name"], source["namespace"], source["connect.version"]) == (
        "Source",
        "io.debezium.connector.postgresql",
        1,
    )
    fields = {f["name"]: f for f in source["fields"]}
    assert fields["snapshot"] == {
        "name": "snapshot",
        "type": [
            {
                "type": "string",
                "connect.version": 1,
                "connect.parameters": {
                    "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
                },
                "connect.default": "false",
                "connect.name": "io.debezium.data.Enum",
            },
            "null",
        ],
        "default": "false",
    }
    assert fields["ts_ms"] == {"name": "ts_ms", "type": "long"}
    assert fields["txId"] == {"name": "txId", "type": ["null", "long"], "default": None}
    assert list(fields) == [
        "version",
        "connector",
        "name",
        "ts_ms",
        "snapshot",
        "db",
        "sequence",
        "ts_us",
        "ts_ns",
        "schema",
        "table",
        "txId",
        "lsn",
        "xmin",
        "origin",
        "origin_lsn",
    ]


def test_every_non_key_column_is_optional_and_key_columns_are_required() -> None:
    table = TableSchema(
        "public",
        "t",
        (
            Column("a", INT4, key=True, nullable=False),
            Column("b", TEXT, nullable=False),  # NOT NULL, still optional: see the module docstring
            Column("c", TEXT, nullable=True),
        ),
    )
    key, value = schemas(table)
    row = value["fields"][0]["type"][1]
    assert [(f["name"], f["type"], f.get("default", "none")) for f in row["fields"]] == [
        ("a", "int", "none"),
        ("b", ["null", "string"], None),
        ("c", ["null", "string"], None),
    ]
    assert key["fields"] == [{"name": "a", "type": "int"}]


def test_every_registered_schema_parses_with_fastavro() -> None:
    s, registry = avro()
    s.records(event(TYPES, Op.CREATE, None, TYPES_ROW))
    s.records(TruncateEvent((TYPES,), False, False, Lsn(1), Lsn(1), 5, 1, COMMIT_US))
    s.records(MessageEvent("p", b"x", True, Lsn(1), Lsn(1), 1, 1, COMMIT_US))
    assert len(registry.schemas) == 5
    for schema in registry.schemas.values():
        fastavro.parse_schema(schema)


# --- values by type: the JSON serializer's values, in Avro ------------------------------------

MOOD = PgType(70001, "mood", TypeKind.ENUM, "public", labels=("sad", "ok", "happy"))
TYPE_COLUMNS: list[tuple[str, PgType, int, Any]] = [
    ("i2", T(21, "int2"), -1, -5),
    ("i4", INT4, -1, 2**31 - 1),
    ("i8", INT8, -1, -(2**63)),
    ("oid", T(26, "oid"), -1, 4294967295),
    ("f4", T(700, "float4"), -1, 1.5),
    ("f8", T(701, "float8"), -1, -2.25),
    ("f8_nan", T(701, "float8"), -1, math.nan),
    ("f8_inf", T(701, "float8"), -1, -math.inf),
    ("num", NUMERIC, numeric_mod(10, 2), Decimal("-1234.56")),
    ("num_big", NUMERIC, numeric_mod(1000, 0), Decimal("9" * 100)),
    ("num_var", NUMERIC, -1, Decimal("123456789012345678901234567890.123456789")),
    ("num_neg_scale", NUMERIC, ((3 << 16) | (-2 & 0x7FF)) + 4, Decimal("12300")),
    ("money", T(790, "money"), -1, Decimal("-1234.56")),
    ("b", T(16, "bool"), -1, True),
    ("txt", TEXT, -1, 'héllo "✓"'),
    ("bin", BYTEA, -1, b"\x00\xffab"),
    ("uid", T(2950, "uuid"), -1, UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    ("js", T(3802, "jsonb"), -1, '{"a": [1, 2]}'),
    ("d", T(1082, "date"), -1, 19844),
    ("d_inf", T(1082, "date"), -1, Infinity.POSITIVE),
    ("t3", T(1083, "time"), 3, 45_296_789_000),
    ("t6", T(1083, "time"), 6, 45_296_789_012),
    ("ts3", T(1114, "timestamp"), 3, 1714566896_789000),
    ("ts6", T(1114, "timestamp"), -1, 1714566896_789012),
    ("tstz", TSTZ, -1, 1714566896_789012),
    ("tstz_inf", TSTZ, -1, Infinity.NEGATIVE),
    ("ttz", T(1266, "timetz"), -1, TimeTz(43_200_000_000, 19800)),
    ("iv", T(1186, "interval"), -1, Interval(14, 3, 14_706_780_000)),
    ("inet", T(869, "inet"), -1, "10.0.0.1/8"),
    ("bit1", T(1560, "bit"), 1, "1"),
    ("bits", T(1560, "bit"), 16, "0000000100000010"),
    ("pt", T(600, "point"), -1, Point(1.5, -2.0)),
    ("mood", MOOD, -1, "ok"),
    ("hs", PgType(80001, "hstore", TypeKind.BASE, "public"), -1, {"a": "1", "b": None}),
    ("ints", PgType(1007, "_int4", TypeKind.ARRAY, element=INT4), -1, [1, None, 3]),
    ("nums", PgType(1231, "_numeric", TypeKind.ARRAY, element=NUMERIC), numeric_mod(5, 2), [Decimal("1.50"), None]),
    ("stamps", PgType(1185, "_timestamptz", TypeKind.ARRAY, element=TSTZ), -1, [0, Infinity.POSITIVE]),
    ("points", PgType(1017, "_point", TypeKind.ARRAY, element=T(600, "point")), -1, [Point(1, 2), None]),
    ("mystery", PgType(90001, "mystery", TypeKind.UNKNOWN, "public"), -1, "some text"),
    ("nothing", TEXT, -1, None),
]
TYPES = TableSchema(
    "public",
    "types",
    (Column("k", INT4, key=True, nullable=False), *(Column(n, t, m) for n, t, m, _ in TYPE_COLUMNS)),
)
TYPES_ROW: dict[str, Any] = {"k": 1, **{n: v for n, _, _, v in TYPE_COLUMNS}}


def test_every_type_decodes_to_the_json_serializers_value() -> None:
    s, registry = avro()
    [record] = s.records(event(TYPES, Op.CREATE, None, TYPES_ROW))
    [twin] = json_twin().records(event(TYPES, Op.CREATE, None, TYPES_ROW))
    after = decode(registry, record.value)["after"]
    expected = orjson.loads(twin.value or b"")["after"]
    assert set(after) == set(expected)
    for name in expected:
        assert as_json(after[name]) == expected[name], name


@pytest.mark.parametrize(
    "option",
    [
        {"decimal_handling": "string"},
        {"decimal_handling": "double"},
        {"time_precision": "iso"},
        {"interval_handling": "string"},
    ],
)
def test_value_options_match_the_json_serializer(option: dict[str, Any]) -> None:
    s, registry = avro(**option)
    [record] = s.records(event(TYPES, Op.CREATE, None, TYPES_ROW))
    [twin] = json_twin(**option).records(event(TYPES, Op.CREATE, None, TYPES_ROW))
    assert as_json(decode(registry, record.value)["after"]) == orjson.loads(twin.value or b"")["after"]


def field_type(table: TableSchema, column: str, **options: Any) -> Any:
    _, value = schemas(table, **options)
    row = value["fields"][0]["type"][1]
    [field] = [f for f in row["fields"] if f["name"] == column]
    return field["type"][1] if isinstance(field["type"], list) else field["type"]


def test_type_schemas_carry_connect_metadata() -> None:
    assert field_type(TYPES, "i2") == {"type": "int", "connect.type": "int16"}
    assert field_type(TYPES, "i8") == "long"
    assert field_type(TYPES, "f4") == "float"
    assert field_type(TYPES, "bin") == "bytes"
    assert field_type(TYPES, "d") == {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}
    assert field_type(TYPES, "ts6") == {
        "type": "long",
        "connect.version": 1,
        "connect.name": "io.debezium.time.MicroTimestamp",
    }
    assert field_type(TYPES, "uid") == {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Uuid"}
    assert field_type(TYPES, "mood") == {
        "type": "string",
        "connect.version": 1,
        "connect.parameters": {"allowed": "sad,ok,happy"},
        "connect.name": "io.debezium.data.Enum",
    }
    assert field_type(TYPES, "bits") == {
        "type": "bytes",
        "connect.version": 1,
        "connect.parameters": {"length": "16"},
        "connect.name": "io.debezium.data.Bits",
    }
    assert field_type(TYPES, "mystery") == {
        "type": "string",
        "connect.parameters": {"__debezium.source.column.type": "mystery"},
    }
    assert field_type(TYPES, "ints") == {"type": "array", "items": ["null", "int"]}


def test_decimal_schemas() -> None:
    assert field_type(TYPES, "money") == {
        "type": "bytes",
        "scale": 2,
        "precision": 64,  # AvroData's default: money has no connect.decimal.precision
        "connect.version": 1,
        "connect.parameters": {"scale": "2"},
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "logicalType": "decimal",
    }
    # numeric(3,-2): not a valid Avro decimal, so no logicalType (the bytes and metadata are the same)
    assert field_type(TYPES, "num_neg_scale") == {
        "type": "bytes",
        "scale": -2,
        "precision": 3,
        "connect.version": 1,
        "connect.parameters": {"scale": "-2", "connect.decimal.precision": "3"},
        "connect.name": "org.apache.kafka.connect.data.Decimal",
    }
    variable = field_type(TYPES, "num_var")
    assert variable == {
        "type": "record",
        "name": "VariableScaleDecimal",
        "namespace": "io.debezium.data",
        "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
        "connect.doc": "Variable scaled decimal",
        "connect.version": 1,
        "connect.name": "io.debezium.data.VariableScaleDecimal",
    }


def test_a_named_type_used_twice_is_defined_once() -> None:
    table = TableSchema(
        "public",
        "geo",
        (
            Column("k", INT4, key=True, nullable=False),
            Column("a", T(600, "point")),
            Column("b", T(600, "point")),
            Column("c", PgType(1017, "_point", TypeKind.ARRAY, element=T(600, "point"))),
        ),
    )
    assert field_type(table, "a")["name"] == "Point"
    assert field_type(table, "b") == "io.debezium.data.geometry.Point"
    assert field_type(table, "c") == {"type": "array", "items": ["null", "io.debezium.data.geometry.Point"]}
    s, registry = avro()
    row = {"k": 1, "a": Point(1, 2), "b": None, "c": [Point(3, 4)]}
    [record] = s.records(event(table, Op.CREATE, None, row))
    after = decode(registry, record.value)["after"]
    assert after["a"] == {"x": 1.0, "y": 2.0, "wkb": b"\x01\x01\x00\x00\x00" + struct.pack("<dd", 1, 2), "srid": None}
    assert after["c"][0]["x"] == 3.0


def test_special_floats_are_avro_floats() -> None:
    s, registry = avro()
    [record] = s.records(event(TYPES, Op.CREATE, None, TYPES_ROW))
    after = decode(registry, record.value)["after"]
    assert math.isnan(after["f8_nan"]) and after["f8_inf"] == -math.inf


def test_double_mode_keeps_nan_a_double() -> None:
    s, registry = avro(decimal_handling="double")
    [record] = s.records(event(TYPES, Op.CREATE, None, dict(TYPES_ROW, num=Decimal("NaN"))))
    assert math.isnan(decode(registry, record.value)["after"]["num"])


# --- names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "adjusted"),
    [
        ("dbserver1.public.customers.Value", "dbserver1.public.customers.Value"),
        ("my-prefix.public.orders.Key", "my_prefix.public.orders.Key"),
        ("p.Sales_Dept.orders_2024_.Value", "p.Sales_Dept.orders_2024_.Value"),
        ("p.public.2024.Value", "p.public._024.Value"),
        ("p..x", "p._.x"),
    ],
)
def test_schema_names_are_adjusted_for_avro(name: str, adjusted: str) -> None:
    assert avro_name(name) == adjusted


@pytest.mark.parametrize(
    ("name", "adjusted"), [("id", "id"), ("a-b", "a_b"), ("2nd", "_nd"), ("é", "_"), ("a.b", "a_b"), ("", "_")]
)
def test_field_names_are_adjusted_for_avro(name: str, adjusted: str) -> None:
    assert avro_field_name(name) == adjusted


def test_odd_topic_and_column_names_make_valid_avro() -> None:
    table = TableSchema(
        "Sales Dept", "orders-2024", (Column("order id", INT4, key=True, nullable=False), Column("ünit", TEXT))
    )
    s, registry = avro(topic_prefix="my-app")
    [record] = s.records(event(table, Op.CREATE, None, {"order id": 7, "ünit": "kg"}))
    assert record.topic == "my-app.Sales_Dept.orders-2024"
    key, value = s.schemas(table)
    assert (key["namespace"], key["connect.name"]) == (
        "my_app.Sales_Dept.orders_2024",
        "my_app.Sales_Dept.orders_2024.Key",
    )
    assert "my-app.Sales_Dept.orders-2024-value" in registry.subjects  # subjects follow the topic, unadjusted
    assert decode(registry, record.key) == {"order_id": 7}
    assert decode(registry, record.value)["after"] == {"order_id": 7, "_nit": "kg"}


def test_two_columns_that_become_one_field_are_an_error() -> None:
    table = TableSchema("public", "t", (Column("id", INT4, key=True), Column("a-b", TEXT), Column("a_b", TEXT)))
    s, _ = avro()
    with pytest.raises(SerializationError, match=r"'a-b' and 'a_b' both become Avro field 'a_b'"):
        s.records(event(table, Op.CREATE, None, {"id": 1, "a-b": "x", "a_b": "y"}))


# --- record set: the JSON serializer's, in Avro ------------------------------------------------


def same_shape(avro_records: list[Record], json_records: list[Record]) -> None:
    """Same topics, partitions, headers and tombstones; keys equal exactly when the JSON keys are equal."""
    assert [(r.topic, r.partition, r.headers, r.value is None) for r in avro_records] == [
        (r.topic, r.partition, r.headers, r.value is None) for r in json_records
    ]
    for a, j in zip(avro_records, json_records, strict=True):
        for b, k in zip(avro_records, json_records, strict=True):
            assert (a.key == b.key) == (j.key == k.key)


def test_delete_then_tombstone() -> None:
    s, registry = avro()
    ev = event(CUSTOMERS, Op.DELETE, {"id": 1}, None)
    delete, tombstone = s.records(ev)
    same_shape([delete, tombstone], json_twin().records(ev))
    assert tombstone.value is None and tombstone.key == delete.key
    value = decode(registry, delete.value)
    assert value["op"] == "d" and value["after"] is None
    assert value["before"] == {"id": 1, "name": None, "balance": None, "updated_at": None}


def test_primary_key_change_is_delete_tombstone_create_with_the_json_key_headers() -> None:
    s, registry = avro()
    ev = event(CUSTOMERS, Op.UPDATE, dict(ALICE_BEFORE, id=1), dict(ALICE_AFTER, id=2))
    records = s.records(ev)
    same_shape(records, json_twin().records(ev))
    delete, tombstone, create = records
    assert decode(registry, delete.key) == {"id": 1} and decode(registry, create.key) == {"id": 2}
    assert ("__debezium.newkey", b'{"id":2}') in delete.headers
    assert ("__debezium.oldkey", b'{"id":1}') in create.headers
    assert decode(registry, delete.value)["op"] == "d" and decode(registry, create.value)["op"] == "c"


def test_update_without_a_key_change_is_one_record() -> None:
    s, registry = avro()
    [record] = s.records(event(CUSTOMERS, Op.UPDATE, None, ALICE_AFTER))
    value = decode(registry, record.value)
    assert value["op"] == "u" and value["before"] is None


def test_truncate_markers_go_to_every_partition_with_their_own_key_record() -> None:
    s, registry = avro(partitions=3)
    truncate = TruncateEvent((CUSTOMERS,), False, False, Lsn(500), Lsn(400), 9, 2, COMMIT_US)
    markers = s.records(truncate)
    same_shape(markers, json_twin(partitions=3).records(truncate))
    subject = "dbserver1.public.customers-dbserver1.public.customers.TruncateKey"
    marker_id = registry.subjects[subject][0]
    schema = registry.schemas[marker_id]
    assert schema["name"] == "TruncateKey" and schema["namespace"] == "dbserver1.public.customers"
    # the Key's fields (what a consumer maps to columns), each optional
    assert [(f["name"], f["type"][0], f.get("default", "no default")) for f in schema["fields"]] == [
        ("id", "null", None)
    ]
    for partition, marker in enumerate(markers):
        assert marker.partition == partition
        assert decode_wire(marker.key)[0] == marker_id
        assert decode(registry, marker.key) == {"id": None}
        value = decode(registry, marker.value)
        assert value["op"] == "t" and value["before"] is None and value["after"] is None
        assert ("cdc.truncate", b"1") in marker.headers
    # the key subject keeps one record type, and no marker key can be a row key
    assert registry.subjects["dbserver1.public.customers-key"] != [marker_id]
    rows = [s.records(event(CUSTOMERS, Op.CREATE, None, dict(ALICE_AFTER, id=i)))[0].key for i in range(3)]
    assert not {m.key for m in markers} & set(rows)


def test_truncate_key_is_registered_once_per_topic() -> None:
    s, registry = avro(partitions=2)
    truncate = TruncateEvent((CUSTOMERS,), False, False, Lsn(1), Lsn(1), 5, 1, COMMIT_US)
    s.records(truncate)
    s.records(truncate)
    assert [c for c, _ in registry.calls].count(
        "dbserver1.public.customers-dbserver1.public.customers.TruncateKey"
    ) == 1


def test_truncate_needs_a_partition() -> None:
    s, _ = avro(partitions=0)
    with pytest.raises(SerializationError, match="partitions"):
        s.records(TruncateEvent((CUSTOMERS,), False, False, Lsn(1), Lsn(1), 5, 1, COMMIT_US))


def test_logical_message() -> None:
    s, registry = avro()
    message = MessageEvent("outbox", b"\x00hello\xff", True, Lsn(700), Lsn(650), 42, 3, COMMIT_US)
    [record] = s.records(message)
    [twin] = json_twin().records(message)
    assert (record.topic, record.headers) == (twin.topic, twin.headers) == ("dbserver1.message", twin.headers)
    assert decode(registry, record.key) == {"prefix": "outbox"}
    value = decode(registry, record.value)
    assert value["message"] == {"prefix": "outbox", "content": b"\x00hello\xff"}
    assert as_json(value) == orjson.loads(twin.value or b"")
    assert registry.latest("dbserver1.message-value")["name"] == "MessageValue"


def test_headers_match_the_json_serializer_without_a_transaction_id() -> None:
    s, _ = avro()
    ev = event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER, xid=None)
    assert s.records(ev)[0].headers == json_twin().records(ev)[0].headers


# --- keys ----------------------------------------------------------------------------------

COMPOSITE = TableSchema(
    "public",
    "pairs",
    (
        Column("name", TEXT, key=True, nullable=False),
        Column("payload", TEXT),
        Column("n", INT8, key=True, nullable=False),
    ),
)


def test_keys_are_the_same_bytes_for_every_event_of_a_row() -> None:
    s, registry = avro()
    row = {"name": "x", "payload": "p", "n": 5}
    keys = {
        s.records(event(COMPOSITE, Op.CREATE, None, row))[0].key,
        s.records(event(COMPOSITE, Op.UPDATE, None, dict(row, payload="q")))[0].key,
        s.records(event(COMPOSITE, Op.DELETE, {"name": "x", "n": 5}, None))[0].key,
        s.records(event(COMPOSITE, Op.READ, None, row, snapshot=True))[0].key,
    }
    [key] = keys
    assert decode(registry, key) == {"name": "x", "n": 5}


TRICKY = st.text(alphabet=st.sampled_from(list('a"\\,:{}[] \n\u00e9\u2713\U0001f600\x00')), max_size=6) | st.text(
    max_size=6
)


@given(st.tuples(TRICKY, st.integers(-(2**63), 2**63 - 1)), st.tuples(TRICKY, st.integers(-(2**63), 2**63 - 1)))
def test_keys_are_injective(a: tuple[str, int], b: tuple[str, int]) -> None:
    s, registry = avro()
    key_a = s.records(event(COMPOSITE, Op.CREATE, None, {"name": a[0], "payload": None, "n": a[1]}))[0].key
    key_b = s.records(event(COMPOSITE, Op.CREATE, None, {"name": b[0], "payload": None, "n": b[1]}))[0].key
    assert (key_a == key_b) == (a == b)
    assert decode(registry, key_a) == {"name": a[0], "n": a[1]}


def test_key_columns_use_the_injective_encodings() -> None:
    table = TableSchema("public", "t", (Column("iv", T(1186, "interval"), key=True, nullable=False),))
    s, registry = avro()
    month = s.records(event(table, Op.CREATE, None, {"iv": Interval(1, 0, 0)}))[0].key
    days = s.records(event(table, Op.CREATE, None, {"iv": Interval(0, 30, 37_800_000_000)}))[0].key
    assert month != days
    assert decode(registry, month) == {"iv": "P0Y1M0DT0H0M0S"}


def test_a_table_without_key_columns_is_an_error() -> None:
    table = TableSchema("public", "heap", (Column("a", INT4), Column("b", TEXT)))
    s, registry = avro()
    with pytest.raises(SerializationError, match="no key columns"):
        s.records(event(table, Op.CREATE, None, {"a": 1, "b": "x"}))
    assert "dbserver1.public.heap-key" not in registry.subjects


def test_a_null_key_value_is_a_clear_error() -> None:
    table = TableSchema("public", "t", (Column("email", TEXT, key=True, nullable=True), Column("v", TEXT)))
    s, _ = avro()
    with pytest.raises(
        SerializationError, match=r"key column 'email' of table 'public.t' is NULL.*NOT NULL key columns"
    ):
        s.records(event(table, Op.CREATE, None, {"email": None, "v": "x"}))


def test_an_unchanged_toast_key_is_an_error() -> None:
    table = TableSchema("public", "docs", (Column("id", TEXT, key=True, nullable=False),))
    s, _ = avro()
    with pytest.raises(SerializationError, match="TOAST"):
        s.records(event(table, Op.UPDATE, None, {"id": UNCHANGED_TOAST}))


# --- schema evolution ------------------------------------------------------------------------


def test_a_relation_that_adds_a_column_registers_a_new_value_version_and_keeps_the_key() -> None:
    s, registry = avro()
    [v1] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    widened = TableSchema("public", "customers", (*CUSTOMERS.columns, Column("email", TEXT, nullable=False)))
    [v2] = s.records(event(widened, Op.CREATE, None, dict(ALICE_AFTER, email="a@x")))
    assert len(registry.subjects["dbserver1.public.customers-value"]) == 2
    assert len(registry.subjects["dbserver1.public.customers-key"]) == 1
    assert v1.key == v2.key
    assert decode(registry, v2.value)["after"]["email"] == "a@x"
    # BACKWARD: the new schema reads what the old one wrote (the added column reads as null) ...
    old_id, body = decode_wire(v1.value or b"")
    new_id, new_body = decode_wire(v2.value or b"")
    old_schema, new_schema = registry.schemas[old_id], registry.schemas[new_id]
    assert resolve(body, old_schema, new_schema)["after"]["email"] is None
    # ... and FORWARD: the old schema reads what the new one wrote (the column is ignored)
    assert "email" not in resolve(new_body, new_schema, old_schema)["after"]


def test_a_dropped_column_is_readable_both_ways() -> None:
    s, registry = avro()
    [v1] = s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    narrowed = TableSchema("public", "customers", CUSTOMERS.columns[:2])
    [v2] = s.records(event(narrowed, Op.CREATE, None, {"id": 1, "name": "A"}))
    old_id, old_body = decode_wire(v1.value or b"")
    new_id, new_body = decode_wire(v2.value or b"")
    old_schema, new_schema = registry.schemas[old_id], registry.schemas[new_id]
    assert resolve(old_body, old_schema, new_schema)["after"] == {"id": 1, "name": "Alice"}
    assert resolve(new_body, new_schema, old_schema)["after"]["balance"] is None


def test_schemas_are_registered_once_per_table_schema() -> None:
    s, registry = avro()
    s.records(event(CUSTOMERS, Op.CREATE, None, ALICE_AFTER))
    same_but_new = TableSchema(CUSTOMERS.schema, CUSTOMERS.name, CUSTOMERS.columns, replica_identity="f")
    s.records(event(same_but_new, Op.CREATE, None, ALICE_AFTER))
    s.records(event(CUSTOMERS, Op.DELETE, {"id": 1}, None))
    assert registry.calls == [
        ("dbserver1.public.customers-key", "table public.customers"),
        ("dbserver1.public.customers-value", "table public.customers"),
    ]


# --- errors -----------------------------------------------------------------------------------


def test_multi_dimensional_arrays_are_a_clear_error() -> None:
    table = TableSchema(
        "public",
        "m",
        (Column("k", INT4, key=True), Column("grid", PgType(1007, "_int4", TypeKind.ARRAY, element=INT4))),
    )
    s, _ = avro()
    with pytest.raises(SerializationError, match=r"'grid' of table 'public.m': a multi-dimensional array"):
        s.records(event(table, Op.CREATE, None, {"k": 1, "grid": [[1, 2], [3, 4]]}))


@pytest.mark.parametrize("special", ["NaN", "Infinity"])
def test_special_numerics_in_precise_mode_name_the_avro_settings(special: str) -> None:
    s, _ = avro()
    with pytest.raises(SerializationError) as info:
        s.records(event(CUSTOMERS, Op.CREATE, None, dict(ALICE_AFTER, balance=Decimal(special))))
    message = str(info.value)
    assert "'balance'" in message and "decimal_handling='string'" in message and "Avro settings" in message


def test_a_value_of_the_wrong_type_names_its_column() -> None:
    s, _ = avro()
    with pytest.raises(SerializationError, match="'balance'"):
        s.records(event(CUSTOMERS, Op.CREATE, None, dict(ALICE_AFTER, balance="12.5")))
    with pytest.raises(SerializationError, match=r"does not fit its Avro schema .*customers\.Value\.name is <12>"):
        s.records(event(CUSTOMERS, Op.CREATE, None, dict(ALICE_AFTER, name=12)))


def test_unchanged_toast_placeholders_where_avro_can_hold_them() -> None:
    table = TableSchema(
        "public",
        "docs",
        (
            Column("id", INT4, key=True, nullable=False),
            Column("body", TEXT),
            Column("blob", BYTEA),
            Column("tags", PgType(1009, "_text", TypeKind.ARRAY, element=TEXT)),
            Column("nums", PgType(1007, "_int4", TypeKind.ARRAY, element=INT4)),
            Column("doc", T(3802, "jsonb")),
        ),
    )
    s, registry = avro(unavailable_value="__gone")
    after = {
        "id": 1,
        "body": UNCHANGED_TOAST,
        "blob": UNCHANGED_TOAST,
        "tags": UNCHANGED_TOAST,
        "nums": UNCHANGED_TOAST,
        "doc": UNCHANGED_TOAST,
    }
    ev = event(table, Op.UPDATE, None, after, unchanged=frozenset(after) - {"id"})
    [record] = s.records(ev)
    decoded = decode(registry, record.value)["after"]
    assert decoded == {
        "id": 1,
        "body": "__gone",
        "blob": b"__gone",
        "tags": ["__gone"],
        "nums": list(b"__gone"),
        "doc": "__gone",
    }
    [twin] = json_twin(unavailable_value="__gone").records(ev)
    assert as_json(decoded) == orjson.loads(twin.value or b"")["after"]


def test_an_unchanged_toast_value_without_an_avro_placeholder_asks_for_replica_identity_full() -> None:
    table = TableSchema(
        "public",
        "v",
        (
            Column("id", INT4, key=True),
            Column("vec", PgType(1022, "_float8", TypeKind.ARRAY, element=T(701, "float8"))),
        ),
    )
    s, _ = avro()
    with pytest.raises(SerializationError, match=r"'vec' of table 'public.v'.*REPLICA IDENTITY FULL"):
        s.records(event(table, Op.UPDATE, None, {"id": 1, "vec": UNCHANGED_TOAST}, unchanged=frozenset({"vec"})))


def test_settings_reject_unknown_fields_and_values() -> None:
    with pytest.raises(pydantic.ValidationError):
        AvroSettings(topic_prefix="p", database="d", schemas_enable=True)  # type: ignore[call-arg]  # refusal under test
    with pytest.raises(pydantic.ValidationError):
        AvroSettings(topic_prefix="p", database="d", decimal_handling="float")  # type: ignore[arg-type]  # refusal under test
    with pytest.raises(pydantic.ValidationError):
        AvroSettings(topic_prefix="", database="d")


def test_topics_are_the_json_serializers() -> None:
    s, _ = avro()
    table = TableSchema("Sales Dept", "orders/2024ü", (Column("id", INT4, key=True),))
    assert s.topic_for(table) == json_twin().topic_for(table) == "dbserver1.Sales_Dept.orders_2024_"
    assert s.topic_name("public", "a b") == "dbserver1.public.a_b"
    with pytest.raises(SerializationError, match="a_b"):
        s.topic_name("public", "a_b")


def test_other_event_types_are_refused() -> None:
    s, _ = avro()
    with pytest.raises(TypeError):
        s.records(object())  # type: ignore[arg-type]  # the refusal under test
