"""Every record the encoders write is valid against the schema it carries, for every type the decoder knows.

JSON with schemas is checked the way Kafka Connect's JsonConverter reads it (``connect_check`` below
follows ``JsonConverter.convertToConnect``: a null needs an optional field or a default, numbers must
fit their type, bytes must be base64, struct members are read by the schema's fields); Avro by
decoding each record with the schema its id names and validating the datum against it. Record kinds:
snapshot read, create, update (key-only and full ``before``), delete under REPLICA IDENTITY DEFAULT
(a key-only ``before``: required fields take Debezium's fallbacks) and FULL, tombstone, key change,
truncate marker, logical message, heartbeat, transaction BEGIN/END.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any, Literal

import fastavro
import fastavro.validation
import orjson
import pytest

from cdc.decoder.types import BUILTIN_TYPES, converter_for
from cdc.event import (
    ChangeEvent,
    Column,
    MessageEvent,
    Op,
    PgType,
    TableSchema,
    TruncateEvent,
    TxBegin,
    TxCommit,
    TypeKind,
)
from cdc.lsn import Lsn
from cdc.sink.avro import AvroSerializer, AvroSettings, decode_wire
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.metadata import Heartbeat, TransactionMetadata
from cdc.sink.record import Record
from cdc.sink.records import EventSerializer
from tests.support.avro import FakeRegistry

COMMIT_US = 1714566896789012
CLOCK_NS = 1714566897101234567

# A text value for each base type the decoder converts (what pgoutput sends).
SAMPLES: dict[str, bytes] = {
    "bool": b"t",
    "bytea": b"\\x00ff10",
    "char": b"c",
    "name": b"a_name",
    "int8": b"-9000000000",
    "int2": b"-7",
    "int4": b"42",
    "text": b"some text",
    "oid": b"4000000000",
    "json": b'{"a": [1, 2]}',
    "xml": b"<a>b</a>",
    "point": b"(1.5,-2)",
    "lseg": b"[(0,0),(1,1)]",
    "path": b"((0,0),(1,1))",
    "box": b"(1,1),(0,0)",
    "polygon": b"((0,0),(1,0),(0,1))",
    "line": b"{1,-1,0}",
    "cidr": b"10.0.0.0/8",
    "float4": b"1.5",
    "float8": b"-2.25",
    "circle": b"<(0,0),2>",
    "macaddr8": b"08:00:2b:01:02:03:04:05",
    "money": b"$1,234.50",
    "macaddr": b"08:00:2b:01:02:03",
    "inet": b"192.168.0.1",
    "bpchar": b"abc",
    "varchar": b"vc",
    "date": b"2024-05-01",
    "time": b"12:34:56.789",
    "timestamp": b"2024-05-01 12:34:56.789012",
    "timestamptz": b"2024-05-01 12:34:56.789012+02",
    "interval": b"1 year 2 mons 3 days 04:05:06.78",
    "timetz": b"12:34:56+02",
    "bit": b"101",
    "varbit": b"1",
    "numeric": b"-1234.5600",
    "uuid": b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "jsonb": b'{"b": null}',
    "jsonpath": b"$.a",
    "int4range": b"[1,5)",
    "numrange": b"[1.5,2)",
    "tsrange": b'["2024-01-01 00:00:00","2024-02-01 00:00:00")',
    "tstzrange": b'["2024-01-01 00:00:00+00",)',
    "daterange": b"[2024-01-01,2024-02-01)",
    "int8range": b"[1,2)",
    "int4multirange": b"{[1,3)}",
    "nummultirange": b"{[1,2)}",
    "tsmultirange": b'{["2024-01-01 00:00:00","2024-01-02 00:00:00")}',
    "tstzmultirange": b'{["2024-01-01 00:00:00+00","2024-01-02 00:00:00+00")}',
    "datemultirange": b"{[2024-01-01,2024-01-03)}",
    "int8multirange": b"{[1,5)}",
}
# numeric, time and timestamp with and without a modifier take different schemas
MODIFIERS: dict[str, list[int]] = {
    "numeric": [-1, ((12 << 16) | 4) + 4],
    "time": [-1, 3],
    "timestamp": [-1, 3],
    "timestamptz": [-1, 0],
    "bit": [3],
    "varbit": [1, 8],
}
MOOD = PgType(90001, "mood", TypeKind.ENUM, "public", labels=("sad", "ok"))
EXTRA: list[tuple[PgType, bytes]] = [
    (MOOD, b"ok"),
    (PgType(90002, "hstore", TypeKind.BASE, "public"), b'"a"=>"1", "b"=>NULL'),
    (PgType(90003, "citext", TypeKind.BASE, "public"), b"CiText"),
    (PgType(90004, "ltree", TypeKind.BASE, "public"), b"a.b.c"),
    (PgType(90005, "positive", TypeKind.DOMAIN, "public", element=PgType(23, "int4")), b"5"),
    (PgType(90006, "mystery", TypeKind.UNKNOWN, "public"), b"(1,x)"),
]


def _array_text(element: bytes, type_name: str) -> bytes:
    delimiter = b";" if type_name == "box" else b","  # box is the one built-in type whose arrays use ';'
    return b'{"' + element.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"' + delimiter + b"NULL}"


def _columns() -> list[tuple[Column, bytes]]:
    out: list[tuple[Column, bytes]] = []
    for t in sorted(BUILTIN_TYPES.values(), key=lambda t: t.oid):
        if t.kind is TypeKind.ARRAY:
            continue
        sample = SAMPLES[t.name]
        for modifier in MODIFIERS.get(t.name, [-1]):
            out.append((Column(f"c_{t.name}_{modifier}".replace("-", "m"), t, modifier), sample))
            array = next(a for a in BUILTIN_TYPES.values() if a.kind is TypeKind.ARRAY and a.element is t)
            out.append(
                (Column(f"a_{t.name}_{modifier}".replace("-", "m"), array, modifier), _array_text(sample, t.name))
            )
    for t, sample in EXTRA:
        out.append((Column(f"x_{t.name}", t), sample))
    return out


COLUMNS = _columns()
EVERY_TYPE = {c.type.name for c, _ in COLUMNS}


def _table(name: str, nullable: bool) -> TableSchema:
    key = Column("id", PgType(23, "int4"), key=True, nullable=False)
    cols = tuple(Column(c.name, c.type, c.modifier, nullable=nullable) for c, _ in COLUMNS)
    return TableSchema("public", name, (key, *cols))


def _row(i: int) -> dict[str, Any]:
    row: dict[str, Any] = {"id": i}
    for column, text in COLUMNS:
        row[column.name] = converter_for(column.type, column.modifier)(text)
    return row


def _change(table: TableSchema, op: Op, before: dict[str, Any] | None, after: dict[str, Any] | None) -> ChangeEvent:
    return ChangeEvent(op, table, before, after, Lsn(100), Lsn(120), 771, 1, COMMIT_US, op is Op.READ, frozenset())


def every_record(s: EventSerializer[Any], table: TableSchema) -> dict[str, list[Record]]:
    """Each record kind the encoders write, by name."""
    full, other = _row(1), _row(2)
    other["id"] = 2
    key_only = {"id": 1}
    tx = TransactionMetadata("dbserver1", s)
    heartbeat = Heartbeat("dbserver1", 0.0, s)
    tx.count("public.t")
    beat = heartbeat.due()
    assert beat is not None
    return {
        "read": s.records(_change(table, Op.READ, None, full)),
        "create": s.records(_change(table, Op.CREATE, None, full)),
        "update, key-only before": s.records(_change(table, Op.UPDATE, None, full)),
        "update, full before": s.records(_change(table, Op.UPDATE, other | {"id": 1}, full)),
        "delete, key-only before (DEFAULT)": s.records(_change(table, Op.DELETE, key_only, None)),
        "delete, full before (FULL)": s.records(_change(table, Op.DELETE, full, None)),
        "key change, key-only before": s.records(_change(table, Op.UPDATE, key_only, other)),
        "key change, full before": s.records(_change(table, Op.UPDATE, full, other)),
        "truncate": s.records(TruncateEvent((table,), False, False, Lsn(130), Lsn(125), 771, 3, COMMIT_US)),
        "message": s.records(MessageEvent("audit", b"\x00\x01", True, Lsn(140), Lsn(135), 771, 4, COMMIT_US)),
        "heartbeat": [beat],
        "transaction BEGIN": [tx.begin(TxBegin(771, Lsn(140), COMMIT_US))],
        "transaction END": [tx.end(TxCommit(771, Lsn(140), Lsn(150), COMMIT_US, 7))],
    }


# --------------------------------------------------------------------------- JSON, as JsonConverter reads it

_INT_RANGES = {"int8": 2**7, "int16": 2**15, "int32": 2**31, "int64": 2**63}
_FLOAT_WORDS = ("NaN", "Infinity", "-Infinity")  # how Jackson writes them; the serializer does too


def connect_check(node: dict[str, Any], value: Any, path: str) -> None:
    """Raise AssertionError where JsonConverter would refuse ``value`` for schema ``node``."""
    if "parameters" in node:
        assert all(isinstance(v, str) for v in node["parameters"].values()), f"{path}: parameters must be strings"
    if "version" in node:
        assert isinstance(node["version"], int), f"{path}: version must be an integer"
    if value is None:
        assert node.get("optional", False) or "default" in node, f"{path}: null for a required {node['type']} field"
        return
    kind = node["type"]
    if kind in _INT_RANGES:
        limit = _INT_RANGES[kind]
        assert isinstance(value, int) and not isinstance(value, bool), f"{path}: {value!r} is not an integer"
        assert -limit <= value < limit, f"{path}: {value} does not fit {kind}"
    elif kind in ("float", "double"):
        assert (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in _FLOAT_WORDS, (
            f"{path}: {value!r}"
        )
    elif kind == "boolean":
        assert isinstance(value, bool), f"{path}: {value!r} is not a boolean"
    elif kind == "string":
        assert isinstance(value, str), f"{path}: {value!r} is not a string"
    elif kind == "bytes":
        assert isinstance(value, str), f"{path}: bytes must be base64 text, not {value!r}"
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error as exc:
            raise AssertionError(f"{path}: {value!r} is not base64") from exc
    elif kind == "array":
        assert isinstance(value, list), f"{path}: {value!r} is not an array"
        for i, item in enumerate(value):
            if isinstance(item, list):  # a nested array: the schema describes one level (documented)
                continue
            connect_check(node["items"], item, f"{path}[{i}]")
    elif kind == "map":
        assert isinstance(value, dict), f"{path}: {value!r} is not an object"
    elif kind == "struct":
        assert isinstance(value, dict), f"{path}: {value!r} is not an object"
        for field in node["fields"]:
            connect_check(field, value.get(field["field"]), f"{path}.{field['field']}")
    else:
        raise AssertionError(f"{path}: unknown Connect type {kind!r}")


def check_json(data: bytes | None, what: str) -> None:
    assert data is not None
    doc = orjson.loads(data)
    assert set(doc) == {"schema", "payload"}, f"{what}: JsonConverter with schemas wants exactly schema and payload"
    connect_check(doc["schema"], doc["payload"], what)


def test_the_table_covers_every_type_the_decoder_converts() -> None:
    bases = {t.name for t in BUILTIN_TYPES.values() if t.kind is not TypeKind.ARRAY}
    assert bases <= EVERY_TYPE
    assert {"_" + b for b in bases} <= EVERY_TYPE  # and an array of each


@pytest.mark.parametrize("decimal_handling", ["precise", "string", "double"])
@pytest.mark.parametrize("nullable", [False, True], ids=["not-null-columns", "nullable-columns"])
def test_every_json_record_is_valid_against_the_schema_it_carries(
    decimal_handling: Literal["precise", "string", "double"], nullable: bool
) -> None:
    s = JsonSerializer(
        JsonSettings(topic_prefix="dbserver1", database="db", schemas_enable=True, decimal_handling=decimal_handling),
        lambda topic: 2,
        clock_ns=lambda: CLOCK_NS,
    )
    for kind, records in every_record(s, _table("t", nullable)).items():
        assert records, kind
        for record in records:
            check_json(record.key, f"{kind}: key")
            if record.value is not None:  # a tombstone is a null value, which every converter accepts
                check_json(record.value, f"{kind}: value")


def test_a_key_only_delete_fills_required_fields_with_debeziums_fallbacks() -> None:
    s = JsonSerializer(JsonSettings(topic_prefix="p", database="db", schemas_enable=True), lambda topic: 1)
    table = _table("t", nullable=False)
    [delete, _] = s.records(_change(table, Op.DELETE, {"id": 1}, None))
    before = orjson.loads(delete.value or b"")["payload"]["before"]
    assert before["id"] == 1
    assert before["c_text_m1"] == "" and before["c_uuid_m1"] == "" and before["c_jsonb_m1"] == ""
    assert before["c_bool_m1"] is False and before["c_int8_m1"] == 0 and before["c_float8_m1"] == 0.0
    assert before["c_numeric_786440"] == "AA=="  # Decimal zero at scale 4
    assert before["c_numeric_m1"] == {"scale": 0, "value": "AA=="}  # VariableScaleDecimal zero
    assert before["c_money_m1"] == "AA=="
    assert before["c_date_m1"] == 0 and before["c_time_m1"] == 0 and before["c_timestamp_m1"] == 0
    assert before["c_timestamptz_m1"] == "1970-01-01T00:00:00Z" and before["c_timetz_m1"] == "00:00:00Z"
    assert before["c_interval_m1"] == 0 and before["c_bytea_m1"] == "" and before["c_bit_3"] == ""
    assert before["c_varbit_1"] is False and before["a_int4_m1"] == [] and before["x_hstore"] == "{}"
    assert before["c_point_m1"]["x"] == 0.0 and before["c_point_m1"]["y"] == 0.0


def test_without_schemas_a_key_only_delete_keeps_nulls_as_before() -> None:
    s = JsonSerializer(JsonSettings(topic_prefix="p", database="db"), lambda topic: 1)
    [delete, _] = s.records(_change(_table("t", nullable=False), Op.DELETE, {"id": 1}, None))
    before = orjson.loads(delete.value or b"")["before"]
    # schemaless JSON carries no schema to be valid against, but the fallback is Debezium's there too
    assert before["c_text_m1"] == ""


# --------------------------------------------------------------------------- Avro, decoded by its schema id


def check_avro(registry: FakeRegistry, data: bytes | None, what: str) -> None:
    assert data is not None
    schema_id, body = decode_wire(data)
    parsed = fastavro.parse_schema(registry.schemas[schema_id])
    datum = fastavro.schemaless_reader(io.BytesIO(body), parsed)
    assert fastavro.validation.validate(datum, parsed, raise_errors=False), f"{what}: {datum!r:.300}"


def test_every_avro_record_is_valid_against_the_schema_its_id_names() -> None:
    registry = FakeRegistry()
    s = AvroSerializer(
        AvroSettings(topic_prefix="dbserver1", database="db"), lambda topic: 2, registry, clock_ns=lambda: CLOCK_NS
    )
    # Avro has one array level and no placeholder for every type: the decoder's one-dimensional values
    for kind, records in every_record(s, _table("t", nullable=False)).items():
        for record in records:
            check_avro(registry, record.key, f"{kind}: key")
            if record.value is not None:
                check_avro(registry, record.value, f"{kind}: value")
    assert "__debezium-heartbeat.dbserver1-value" in registry.subjects
    assert "dbserver1.transaction-value" in registry.subjects


def test_a_table_set_to_skip_truncates_gets_no_marker_and_the_others_do() -> None:
    from cdc.config import TableConfig
    from cdc.selection import entry_for

    entries = (TableConfig(name="public.flinked", truncate="skip"), TableConfig(pattern="public.*"))
    s = JsonSerializer(JsonSettings(topic_prefix="p", database="db"), lambda topic: 2)
    s.skip_truncate = lambda t: (e := entry_for(entries, t.schema, t.name)) is not None and e.truncate == "skip"
    flinked, other = _table("flinked", True), _table("other", True)
    records = s.records(TruncateEvent((flinked, other), False, False, Lsn(130), Lsn(125), 771, 3, COMMIT_US))
    assert [(r.topic, r.partition) for r in records] == [("p.public.other", 0), ("p.public.other", 1)]
