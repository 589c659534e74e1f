"""What a required field holds when the row lacks its column: Debezium's fallback values.

A delete under ``REPLICA IDENTITY DEFAULT`` (or a key change) carries an old tuple with only the
key columns, yet the ``Value`` schema beside it declares NOT NULL columns required. A null there
makes the record invalid against its own schema, and Kafka Connect's JsonConverter rejects it
(``DataException: Invalid null value for required STRING field``). Debezium does not send null:
``JdbcValueConverters.convertValue`` gives a required field with no value the schema's default,
else the converter's *fallback*. Read from Debezium's source (``debezium-core``
``io/debezium/jdbc/JdbcValueConverters.java``, ``debezium-connector-postgres``
``PostgresValueConverter.java``, ``io/debezium/util/NumberConversions.java``), per type:

==========================================  ===============================================
type                                        fallback
==========================================  ===============================================
text, varchar, char, uuid, json(b), xml,    ``""`` (``convertString``, ``convertCitext``,
enum, citext, ltree, inet/cidr/macaddr,     ``convertLtree``; enums and the plain-string
ranges, unknown types                       types go through ``convertString``)
bool, bit(1)                                ``false``
int2, int4, int8, oid                       ``0``
float4, float8                              ``0.0``
numeric(p,s), money                         zero at the column's scale (``BigDecimal.ZERO``
                                            with ``withScaleAdjustedIfNeeded``): Decimal
                                            bytes ``AA==``, ``"0.00"`` as a string, ``0.0``
unconstrained numeric                       VariableScaleDecimal ``{"scale":0,"value":"AA=="}``
date, time, timestamp (adaptive)            ``0`` (the epoch; ``convertDateToEpochDays`` etc.)
timestamptz                                 ``"1970-01-01T00:00:00Z"`` (epoch through
                                            ``ISO_OFFSET_DATE_TIME``, no fraction)
timetz                                      ``"00:00:00Z"``
interval                                    ``0``; as a string ``"P0Y0M0DT0H0M0S"``
bytea, bit(n>1)/varbit                      empty bytes (``NumberConversions.BYTE_ZERO``,
                                            ``new byte[0]``)
arrays                                      ``[]`` (``Collections.emptyList()``)
point                                       ``Point.createValue(schema, 0, 0)``
hstore (as JSON)                            ``"{}"``
==========================================  ===============================================

Our own ``time_precision: iso`` strings (no Debezium counterpart in 3.3) take the epoch's text,
like the adaptive mode's zero. Column defaults never apply: pgoutput does not send them, and the
schemas here carry none.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Final, Protocol

from cdc.event import PgType, TypeKind
from cdc.values import Interval, Point

_ZONED_TIMESTAMP_EPOCH: Final = "1970-01-01T00:00:00Z"
_ZONED_TIME_MIDNIGHT: Final = "00:00:00Z"
_INTERVAL_ZERO_TEXT: Final = "P0Y0M0DT0H0M0S"


class _Spec(Protocol):
    """The parts of ``cdc.sink.connect.ConnectSchema`` a fallback needs."""

    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def parameters(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def encode(self) -> Any: ...
    @property
    def avro(self) -> Any: ...


def _base_name(pg_type: PgType) -> str:
    t: PgType | None = pg_type
    for _ in range(32):
        if t is None or t.kind is not TypeKind.DOMAIN:
            break
        t = t.element
    return t.name if t is not None else pg_type.name


def _scale(spec: _Spec, modifier: int) -> int:
    params = dict(spec.parameters)
    if "scale" in params:
        return int(params["scale"])
    if modifier >= 4:  # numeric(p,s) written as a string or double: the typmod's scale
        return (((modifier - 4) & 0x7FF) ^ 0x400) - 0x400
    return 0


def _typed_zero(pg_type: PgType, modifier: int, spec: _Spec) -> tuple[Any, bool]:
    """(value, whether it goes through the spec's encoder) for a required field the row lacks."""
    if spec.type == "array":
        return [], False
    if spec.name == "io.debezium.time.ZonedTimestamp":
        return _ZONED_TIMESTAMP_EPOCH, False
    if spec.name == "io.debezium.time.ZonedTime":
        return _ZONED_TIME_MIDNIGHT, False
    if spec.name == "io.debezium.time.Interval":
        return _INTERVAL_ZERO_TEXT, False
    name = _base_name(pg_type)
    match name:
        case "bool":
            return False, True
        case "int2" | "int4" | "int8" | "oid":
            return 0, True
        case "float4" | "float8":
            return 0.0, True
        case "numeric":
            scale = _scale(spec, modifier)
            return (Decimal(0).scaleb(-scale) if scale > 0 else Decimal(0)), True
        case "money":
            return Decimal("0.00"), True
        case "bytea":
            return b"", True
        case "bit" | "varbit":
            return ("0" if spec.type == "boolean" else ""), True
        case "date" | "time" | "timestamp":
            return 0, True
        case "interval":
            return Interval(0, 0, 0), True
        case "point":
            return Point(0.0, 0.0), True
        case "hstore":
            return {}, True
    if spec.type == "string":
        return "", False
    if spec.type == "boolean":
        return False, False
    if spec.type in ("int8", "int16", "int32", "int64"):
        return 0, False
    if spec.type in ("float", "double"):
        return 0.0, False
    if spec.type == "bytes":
        return b"", True
    raise ValueError(f"no fallback value for a required {spec.type} field of type {pg_type.name}")


def json_fallback(pg_type: PgType, modifier: int, spec: _Spec) -> Any:
    """The JSON value (what orjson writes) a required field gets when its column is missing."""
    value, encode = _typed_zero(pg_type, modifier, spec)
    if encode and spec.encode is not None:
        return spec.encode(value)
    return value


def avro_fallback(pg_type: PgType, modifier: int, spec: _Spec) -> Any:
    """The Avro datum a required field gets when its column is missing."""
    value, encode = _typed_zero(pg_type, modifier, spec)
    if encode and spec.avro is not None:
        return spec.avro(value)
    return value
