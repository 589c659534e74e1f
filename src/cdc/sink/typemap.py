"""Type mapping: a PostgreSQL column type -> its Kafka Connect schema and encoders (``column_schema``),
written once for every format.

Values by type (defaults = Debezium's defaults)
    * int2/int4/int8/oid: numbers. bool: true/false.
    * float4/float8: numbers; NaN and the infinities become the strings ``"NaN"``,
      ``"Infinity"``, ``"-Infinity"`` (JSON has no NaN; Jackson, which Kafka Connect
      uses, writes them the same way).
    * numeric, ``decimal_handling="precise"``: numeric(p,s) is a Kafka Connect Decimal
      (base64 of the big-endian two's-complement unscaled value); unconstrained numeric
      is a VariableScaleDecimal ``{"scale":s,"value":base64}`` with trailing zeros
      stripped. NaN and the infinities cannot be written there: ``SerializationError``.
      ``"string"``: plain decimal text (``"NaN"``, ``"Infinity"`` too). ``"double"``: a
      number. money: the same, with scale 2 (lc_monetary C).
    * bytea: padded base64. uuid, json, jsonb, xml, text types, enums, inet, cidr,
      macaddr(8), ranges: strings. hstore: the JSON text of the map.
    * bit(1)/varbit(1): boolean. Other bit strings: Debezium Bits (little-endian bytes of
      the bit string read as a binary number, as many bytes as its highest set bit needs).
    * point: ``{"x","y","wkb","srid":null}``. Other geometric types: their text (Debezium
      sends WKB structs for those; this module does not), marked as unknown types.
    * arrays: JSON arrays of the element encodings (nested for several dimensions; the
      schema block describes one level). Explicit lower bounds are not kept.
    * Types this module does not know: their text, with schema parameter
      ``__debezium.source.column.type`` naming the type.
    * An unchanged TOASTed value: ``unavailable_value`` (bytea: its bytes; int arrays:
      its bytes as numbers; other arrays: a one-element list), as Debezium does.

Temporal values, ``time_precision="adaptive"`` (Debezium's default):
    * date: int32 days (io.debezium.time.Date); ``infinity``/``-infinity`` become
      2147483647 / -2147483648 (no real date reaches them: PostgreSQL's dates end at
      day 2145042906 and begin at -2440588).
    * time(0-3): int32 milliseconds (Time); time(4-6) or no precision: int64 µs (MicroTime).
    * timestamp(0-3): int64 ms (Timestamp); otherwise µs (MicroTimestamp). Infinity:
      9223372036825200000 / -9223372036832400000, Debezium's values.
    * timestamptz: ZonedTimestamp, UTC with ``Z``, as many fraction digits as the column's
      precision (6 when unspecified, none for precision 0); ``"infinity"``/``"-infinity"``.
    * timetz: ZonedTime, UTC with ``Z``, fraction without trailing zeros.
    * Years outside 0-9999 print as Java does: ``+10000-01-01``, ``-0043-03-15`` (44 BC).
    * ``time_precision="iso"``: date, time and timestamp as io.debezium.time.IsoDate /
      IsoTime / IsoTimestamp strings (``2024-05-01Z``, ``12:34:56.5Z``,
      ``2024-05-01T12:34:56.5Z``; infinities as ``"infinity"``/``"-infinity"``).
    * interval, ``interval_handling="numeric"``: MicroDuration, int64 µs with a month of
      365.25/12 days, computed exactly in integers (Debezium's double arithmetic can be
      one µs off). ``"string"``: io.debezium.time.Interval ``P1Y2M3DT4H5M6.78S``.
      PostgreSQL 17's infinite intervals: int64 max/min, or ``"infinity"``/``"-infinity"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from cdc.event import PgType, TypeKind
from cdc.sink.connect import BOOLEAN, BYTES_NODE, DOUBLE_NODE, INT16, INT32, INT64, STRING, ConnectSchema, Encoder
from cdc.sink.encode import (
    INT32_MAX,
    b64,
    bit_bool,
    bits,
    bits_bytes,
    bytea,
    date_days,
    date_iso,
    double_decimal,
    fixed_decimal,
    fixed_decimal_bytes,
    hstore,
    interval_iso,
    interval_micros,
    json_float,
    offset_time,
    plain_decimal,
    point,
    point_avro,
    time_iso,
    time_ms,
    timestamp_iso,
    timestamp_ms,
    timestamp_us,
    variable_decimal,
    variable_decimal_avro,
    zoned_time,
    zoned_timestamp,
)
from cdc.sink.errors import SerializationError

_PLAIN_STRING_TYPES: Final = frozenset(
    {
        "text",
        "varchar",
        "bpchar",
        "name",
        "char",
        "inet",
        "cidr",
        "macaddr",
        "macaddr8",
        "int4range",
        "numrange",
        "tsrange",
        "tstzrange",
        "daterange",
        "int8range",
    }
)
_INT_ARRAY_ELEMENTS: Final = frozenset({"int2", "int4", "int8"})
_MAX_DOMAIN_DEPTH: Final = 32


@dataclass(frozen=True, slots=True)
class TypeOptions:
    decimal_handling: str
    time_precision: str
    interval_handling: str


def _unknown(type_name: str) -> ConnectSchema:
    return ConnectSchema("string", None, parameters=(("__debezium.source.column.type", type_name),))


def _base_type(pg_type: PgType) -> PgType | None:
    t: PgType | None = pg_type
    for _ in range(_MAX_DOMAIN_DEPTH):
        if t is None or t.kind is not TypeKind.DOMAIN:
            return t
        t = t.element
    return None


def numeric_typmod(modifier: int) -> tuple[int, int] | None:
    """numeric(p, s) from atttypmod; the scale is 11 bits, signed (PostgreSQL 15 allows s < 0)."""
    if modifier < 4:
        return None
    mod = modifier - 4
    return (mod >> 16) & 0xFFFF, ((mod & 0x7FF) ^ 0x400) - 0x400


def time_precision(modifier: int) -> int:
    return modifier if 0 <= modifier <= 6 else 6


def column_schema(pg_type: PgType, modifier: int, opts: TypeOptions, key: bool, where: str) -> ConnectSchema:
    """The schema and encoder of a column of ``pg_type`` (``key``: an injective encoding)."""
    base = _base_type(pg_type)
    if base is None:
        return _unknown(pg_type.name)
    kind = base.kind
    if kind is TypeKind.ARRAY:
        if base.element is None:
            return _unknown(base.name)
        element = column_schema(base.element, modifier, opts, key, where)
        avro = _avro_array(element.avro, where)
        encode_element = element.encode
        if encode_element is None:
            return ConnectSchema("array", None, items=element, avro=avro)

        def encode_array(values: list[Any]) -> list[Any]:
            return [None if v is None else (encode_array(v) if type(v) is list else encode_element(v)) for v in values]

        return ConnectSchema("array", encode_array, items=element, avro=avro)
    if kind is TypeKind.ENUM:
        return ConnectSchema(
            "string", None, name="io.debezium.data.Enum", version=1, parameters=(("allowed", ",".join(base.labels)),)
        )
    if kind is TypeKind.BASE and base.schema == "pg_catalog":
        spec = _builtin_spec(base.name, modifier, opts, key, where)
        if spec is not None:
            return spec
    if kind is TypeKind.BASE:
        if base.name == "hstore":
            return ConnectSchema("string", hstore, name="io.debezium.data.Json", version=1, avro=hstore)
        if base.name == "citext":
            return STRING
        if base.name == "ltree":
            return ConnectSchema("string", None, name="io.debezium.data.Ltree", version=1)
    if kind is TypeKind.RANGE and base.schema == "pg_catalog" and base.name in _PLAIN_STRING_TYPES:
        return STRING
    return _unknown(base.name)


def _avro_array(encode_element: Encoder | None, where: str) -> Encoder:
    """Avro arrays have one level (the schema's): a nested list is an error, not a guess."""

    def nested() -> SerializationError:
        return SerializationError(
            f"{where}: a multi-dimensional array cannot be written as Avro (its schema is an array of "
            "elements, one level); use format json for this table, or store the column one-dimensional"
        )

    if encode_element is None:

        def encode_plain(values: list[Any]) -> list[Any]:
            for v in values:
                if type(v) is list:
                    raise nested()
            return values

        return encode_plain

    def encode(values: list[Any]) -> list[Any]:
        out: list[Any] = []
        for v in values:
            if v is None:
                out.append(None)
            elif type(v) is list:
                raise nested()
            else:
                out.append(encode_element(v))
        return out

    return encode


def _builtin_spec(name: str, modifier: int, opts: TypeOptions, key: bool, where: str) -> ConnectSchema | None:
    adaptive = opts.time_precision == "adaptive"
    match name:
        case "bool":
            return BOOLEAN
        case "int2":
            return INT16
        case "int4":
            return INT32
        case "int8" | "oid":
            return INT64
        case "float4":
            return ConnectSchema("float", json_float)
        case "float8":
            return ConnectSchema("double", json_float)
        case "numeric" | "money":
            handling = opts.decimal_handling
            if handling == "double" and key:
                handling = "string"  # a double is not injective
            if handling == "string":
                return ConnectSchema("string", plain_decimal, avro=plain_decimal)
            if handling == "double":
                return ConnectSchema("double", double_decimal, avro=float)
            if name == "money":
                return ConnectSchema(
                    "bytes",
                    fixed_decimal(2, where),
                    name="org.apache.kafka.connect.data.Decimal",
                    version=1,
                    parameters=(("scale", "2"),),
                    avro=fixed_decimal_bytes(2, where, "Avro"),
                )
            typmod = numeric_typmod(modifier)
            if typmod is None:
                return ConnectSchema(
                    "struct",
                    variable_decimal(where),
                    name="io.debezium.data.VariableScaleDecimal",
                    version=1,
                    doc="Variable scaled decimal",
                    fields=(("scale", INT32, False), ("value", BYTES_NODE, False)),
                    avro=variable_decimal_avro(where),
                )
            precision, scale = typmod
            return ConnectSchema(
                "bytes",
                fixed_decimal(scale, where),
                name="org.apache.kafka.connect.data.Decimal",
                version=1,
                parameters=(("scale", str(scale)), ("connect.decimal.precision", str(precision))),
                avro=fixed_decimal_bytes(scale, where, "Avro"),
            )
        case "bytea":
            return ConnectSchema("bytes", bytea)
        case "uuid":
            return ConnectSchema(
                "string", None, name="io.debezium.data.Uuid", version=1, avro=str
            )  # orjson writes UUIDs
        case "json" | "jsonb":
            return ConnectSchema("string", None, name="io.debezium.data.Json", version=1)
        case "xml":
            return ConnectSchema("string", None, name="io.debezium.data.Xml", version=1)
        case "date":
            if adaptive:
                return ConnectSchema("int32", date_days, name="io.debezium.time.Date", version=1, avro=date_days)
            return ConnectSchema("string", date_iso, name="io.debezium.time.IsoDate", version=1, avro=date_iso)
        case "time":
            if not adaptive:
                return ConnectSchema("string", time_iso, name="io.debezium.time.IsoTime", version=1, avro=time_iso)
            if time_precision(modifier) <= 3:
                return ConnectSchema("int32", time_ms, name="io.debezium.time.Time", version=1, avro=time_ms)
            return ConnectSchema("int64", None, name="io.debezium.time.MicroTime", version=1)
        case "timestamp":
            if not adaptive:
                return ConnectSchema(
                    "string", timestamp_iso, name="io.debezium.time.IsoTimestamp", version=1, avro=timestamp_iso
                )
            if time_precision(modifier) <= 3:
                return ConnectSchema(
                    "int64", timestamp_ms, name="io.debezium.time.Timestamp", version=1, avro=timestamp_ms
                )
            return ConnectSchema(
                "int64", timestamp_us, name="io.debezium.time.MicroTimestamp", version=1, avro=timestamp_us
            )
        case "timestamptz":
            encoder = zoned_timestamp(time_precision(modifier))
            return ConnectSchema("string", encoder, name="io.debezium.time.ZonedTimestamp", version=1, avro=encoder)
        case "timetz":
            zoned = offset_time if key else zoned_time
            return ConnectSchema("string", zoned, name="io.debezium.time.ZonedTime", version=1, avro=zoned)
        case "interval":
            if opts.interval_handling == "string" or key:
                return ConnectSchema(
                    "string", interval_iso, name="io.debezium.time.Interval", version=1, avro=interval_iso
                )
            return ConnectSchema(
                "int64", interval_micros, name="io.debezium.time.MicroDuration", version=1, avro=interval_micros
            )
        case "bit" | "varbit":
            if modifier == 1:
                return ConnectSchema("boolean", bit_bool, avro=bit_bool)
            length = str(modifier) if modifier > 0 else str(INT32_MAX)
            return ConnectSchema(
                "bytes",
                bits,
                name="io.debezium.data.Bits",
                version=1,
                parameters=(("length", length),),
                avro=bits_bytes,
            )
        case "point":
            return ConnectSchema(
                "struct",
                point,
                name="io.debezium.data.geometry.Point",
                version=1,
                doc="Geometry (POINT)",
                fields=(
                    ("x", DOUBLE_NODE, False),
                    ("y", DOUBLE_NODE, False),
                    ("wkb", BYTES_NODE, True),
                    ("srid", INT32, True),
                ),
                avro=point_avro,
            )
    if name in _PLAIN_STRING_TYPES:
        return STRING
    return None


def toast_placeholder(pg_type: PgType, spec: ConnectSchema, text: str) -> Any:
    """What an unchanged TOASTed value becomes in this column (Debezium's placeholders)."""
    if spec.type == "bytes":
        return b64(text.encode())
    if spec.type == "array":
        base = _base_type(pg_type)
        element = _base_type(base.element) if base is not None and base.element is not None else None
        if element is not None and element.schema == "pg_catalog" and element.name in _INT_ARRAY_ELEMENTS:
            return list(text.encode())
        return [text]
    return text
