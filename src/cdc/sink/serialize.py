"""Events to Kafka records in Debezium's JSON shape (JsonConverter, optionally with schemas).

``JsonSerializer.records(event)`` turns a ``ChangeEvent``, ``TruncateEvent`` or
``MessageEvent`` into the records to produce, in order. The wire shapes follow
the Debezium 3.x PostgreSQL connector with its default settings (see
``/work/shared/notes/debezium-envelope.md``); where this module differs, the
difference is written down below.

Records
    * ``c``/``r``/``u``: one record. ``d``: the delete event, then a tombstone (same key,
      value None). An update whose key changed: a ``d`` under the old key (header
      ``__debezium.newkey``), its tombstone, and a ``c`` under the new key (header
      ``__debezium.oldkey``); the header values are the key payloads, e.g. ``{"id":1}``.
    * Truncate: one marker per partition of each table's topic, on that partition, valued
      with the table's envelope, ``op`` ``"t"``, header ``cdc.truncate: 1``, and keyed with
      the table's key fields all null (``{"id":null}``; schema ``<topic>.TruncateKey``, the
      Key's fields made optional). Debezium sends a null key, which a compacted topic cannot
      hold; a key with fields of their own would become a column in Debezium's JDBC sink.
      No row has that key (key columns are never all NULL: a row whose configured key
      columns are all NULL is an error). Compaction keeps the latest marker of each
      partition; a consumer recognises a marker by ``op`` ``"t"`` (or the header).
    * Logical message: topic ``<prefix>.message``, Debezium's MessageKey/MessageValue.
    * Every record carries ``cdc.lsn``, ``cdc.commit_lsn``, ``cdc.txid`` (when known) and
      ``cdc.ordinal`` headers, decimal ASCII.

Keys
    A JSON object of the key columns in column order, serialized the same way for every
    event of a row. Keys are injective: where Debezium's value encoding can map two
    different values to one (interval as MicroDuration, numeric/money as double, timetz
    normalized to UTC), a key column uses an exact encoding instead (interval as an ISO
    string, numeric as a plain decimal string, timetz with its own offset). A change of
    the key's bytes, not of Python equality, makes the update a delete plus create.
    A table without key columns is an error: its rows cannot live on a compacted topic.

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

Envelope ``ts_ms``/``ts_us``/``ts_ns`` are the serializer's clock when the event is
serialized; ``source.ts_*`` are the commit time.

Shared with the Avro format (``cdc.sink.avro``): ``ConnectSchema``/``column_schema`` describe
each type's Kafka Connect schema once, with its JSON and its Avro encoder, and
``EventSerializer`` decides, for both formats, which records an event becomes and their headers.
"""

from __future__ import annotations

import abc
import binascii
import functools
import math
import re
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

import orjson
import structlog
from pydantic import BaseModel, ConfigDict, Field

import cdc
from cdc.event import (
    AnyRow,
    ChangeEvent,
    Column,
    MessageEvent,
    Op,
    PgType,
    RenderedRow,
    RowRendering,
    TableSchema,
    TruncateEvent,
    TypeKind,
)
from cdc.sink.fallback import json_fallback
from cdc.sink.record import Record
from cdc.values import UNCHANGED_TOAST, Infinity, Interval, Point, TimeTz

__all__ = ["JsonSerializer", "JsonSettings", "ReadParts", "SerializationError"]

_log = structlog.get_logger("cdc.sink.serialize")


class SerializationError(Exception):
    """An event cannot be written in the configured format; the message says what to change."""


class JsonSettings(BaseModel):
    """The JSON format's settings (the configuration tree embeds this section)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic_prefix: str = Field(min_length=1)
    database: str  # source.db
    schemas_enable: bool = False  # Kafka Connect {"schema":..., "payload":...} for key and value
    decimal_handling: Literal["precise", "string", "double"] = "precise"
    time_precision: Literal["adaptive", "iso"] = "adaptive"
    interval_handling: Literal["numeric", "string"] = "numeric"
    unavailable_value: str = "__debezium_unavailable_value"  # placeholder for unchanged TOAST
    connector_version: str = cdc.__version__


# ---------------------------------------------------------------------------
# Kafka Connect schema nodes
# ---------------------------------------------------------------------------

Encoder = Callable[[Any], Any]
"""A column value (as ``cdc.values`` defines it, never None) -> what the format writes."""


@dataclass(frozen=True, slots=True)
class ConnectSchema:
    """One Connect schema and how to encode a value for it, in JSON and in Avro.

    The type mapping is written once, here; ``cdc.sink.avro`` turns the same schema into
    an Avro schema (as Confluent's AvroData does) and writes values with ``avro``.
    """

    type: str  # Connect type: boolean int16 int32 int64 float double bytes string array struct
    encode: Encoder | None  # JSON: what orjson writes; None: the value is its own JSON
    name: str | None = None
    version: int | None = None
    doc: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()
    fields: tuple[tuple[str, ConnectSchema, bool], ...] = ()  # struct members: (field, spec, optional)
    items: ConnectSchema | None = None  # arrays
    default: str | None = None
    avro: Encoder | None = None  # Avro: what fastavro writes (bytes as bytes, NaN as NaN); None: the value itself

    def node(self, optional: bool, field: str | None = None) -> dict[str, Any]:
        """The JSON schema node, keys in JsonConverter's order."""
        node: dict[str, Any] = {"type": self.type}
        if self.type == "struct":
            node["fields"] = [spec.node(opt, name) for name, spec, opt in self.fields]
        elif self.items is not None:
            node["items"] = self.items.node(True)
        node["optional"] = optional
        if self.name is not None:
            node["name"] = self.name
        if self.version is not None:
            node["version"] = self.version
        if self.doc is not None:
            node["doc"] = self.doc
        if self.parameters:
            node["parameters"] = dict(self.parameters)
        if self.default is not None:
            node["default"] = self.default
        if field is not None:
            node["field"] = field
        return node


_BOOLEAN: Final = ConnectSchema("boolean", None)
_INT16: Final = ConnectSchema("int16", None)
_INT32: Final = ConnectSchema("int32", None)
_INT64: Final = ConnectSchema("int64", None)
_STRING: Final = ConnectSchema("string", None)
_BYTES_NODE: Final = ConnectSchema("bytes", None)
_DOUBLE_NODE: Final = ConnectSchema("double", None)

_SNAPSHOT_ALLOWED: Final = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"

SOURCE_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.postgresql.Source",
    version=1,
    fields=(
        ("version", _STRING, False),
        ("connector", _STRING, False),
        ("name", _STRING, False),
        ("ts_ms", _INT64, False),
        (
            "snapshot",
            ConnectSchema(
                "string",
                None,
                name="io.debezium.data.Enum",
                version=1,
                parameters=(("allowed", _SNAPSHOT_ALLOWED),),
                default="false",
            ),
            True,
        ),
        ("db", _STRING, False),
        ("sequence", _STRING, True),
        ("ts_us", _INT64, True),
        ("ts_ns", _INT64, True),
        ("schema", _STRING, False),
        ("table", _STRING, False),
        ("txId", _INT64, True),
        ("lsn", _INT64, True),
        ("xmin", _INT64, True),
        ("origin", _STRING, True),
        ("origin_lsn", _INT64, True),
    ),
)

TRANSACTION_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="event.block",
    version=1,
    fields=(("id", _STRING, False), ("total_order", _INT64, False), ("data_collection_order", _INT64, False)),
)


def _dumps_node(node: dict[str, Any]) -> bytes:
    return orjson.dumps(node)


# ---------------------------------------------------------------------------
# Value encoders
# ---------------------------------------------------------------------------

_INT32_MAX: Final = 2**31 - 1
_INT32_MIN: Final = -(2**31)
_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)
_TIMESTAMP_POSITIVE_INFINITY: Final = 9223372036825200000
_TIMESTAMP_NEGATIVE_INFINITY: Final = -9223372036832400000
_US_PER_DAY: Final = 86_400_000_000
_US_PER_MONTH: Final = 2_629_800_000_000  # 365.25 / 12 days, exactly
_INF: Final = math.inf
_WKB_POINT: Final = struct.Struct("<BIdd")


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _float(value: float) -> float | str:
    if value != value:
        return "NaN"
    if value == _INF:
        return "Infinity"
    if value == -_INF:
        return "-Infinity"
    return value


def _twos_complement(n: int) -> bytes:
    """Java's BigInteger.toByteArray(): minimal big-endian two's complement."""
    length = (n.bit_length() if n >= 0 else (~n).bit_length()) // 8 + 1
    return n.to_bytes(length, "big", signed=True)


def _special_decimal(where: str, value: Decimal, fmt: str) -> SerializationError:
    return SerializationError(
        f"{where}: numeric value {value} cannot be written with decimal_handling='precise' "
        "(a Kafka Connect Decimal has no NaN or Infinity); set decimal_handling='string' "
        f"(or 'double') in the {fmt} settings"
    )


def _fixed_decimal_bytes(scale: int, where: str, fmt: str) -> Callable[[Decimal], bytes]:
    """Decimal -> the big-endian two's-complement unscaled value at ``scale`` (may be negative)."""
    # value * 10**scale = numerator * multiplier / (denominator * divisor)
    multiplier = 10**scale if scale >= 0 else 1
    divisor = 10**-scale if scale < 0 else 1

    def encode(value: Decimal) -> bytes:
        if not value.is_finite():
            raise _special_decimal(where, value, fmt)
        numerator, denominator = value.as_integer_ratio()
        unscaled, remainder = divmod(numerator * multiplier, denominator * divisor)
        if remainder:
            raise SerializationError(f"{where}: {value} has more than {scale} fraction digits")
        return _twos_complement(unscaled)

    return encode


def _fixed_decimal(scale: int, where: str) -> Encoder:
    unscaled = _fixed_decimal_bytes(scale, where, "JSON")

    def encode(value: Decimal) -> str:
        return _b64(unscaled(value))

    return encode


def _variable_decimal_parts(where: str, fmt: str) -> Callable[[Decimal], tuple[int, bytes]]:
    """Decimal -> (the smallest scale that makes it whole, the unscaled value's two's complement)."""

    def encode(value: Decimal) -> tuple[int, bytes]:
        if not value.is_finite():
            raise _special_decimal(where, value, fmt)
        numerator, denominator = value.as_integer_ratio()
        # denominator is 2**a * 5**b; the smallest scale that makes the value whole is max(a, b)
        twos = (denominator & -denominator).bit_length() - 1
        fives = 0
        rest = denominator >> twos
        while rest > 1:
            rest //= 5
            fives += 1
        scale = max(twos, fives)
        unscaled = numerator * 10**scale // denominator
        return scale, _twos_complement(unscaled)

    return encode


def _variable_decimal(where: str) -> Encoder:
    parts = _variable_decimal_parts(where, "JSON")

    def encode(value: Decimal) -> dict[str, Any]:
        scale, unscaled = parts(value)
        return {"scale": scale, "value": _b64(unscaled)}

    return encode


def _variable_decimal_avro(where: str) -> Encoder:
    parts = _variable_decimal_parts(where, "Avro")

    def encode(value: Decimal) -> dict[str, Any]:
        scale, unscaled = parts(value)
        return {"scale": scale, "value": unscaled}

    return encode


def _plain_decimal(value: Decimal) -> str:
    return format(value, "f")


def _double_decimal(value: Decimal) -> float | str:
    return _float(float(value))


def _bytes(value: bytes) -> str:
    return _b64(value)


def _hstore(value: dict[str, str | None]) -> str:
    return orjson.dumps(value).decode()


def _point(value: Point) -> dict[str, Any]:
    return {
        "x": _float(value.x),
        "y": _float(value.y),
        "wkb": _b64(_WKB_POINT.pack(1, 1, value.x, value.y)),
        "srid": None,
    }


def _point_avro(value: Point) -> dict[str, Any]:
    return {"x": value.x, "y": value.y, "wkb": _WKB_POINT.pack(1, 1, value.x, value.y), "srid": None}


def _bit_bool(value: str) -> bool:
    return "1" in value


def _bits_bytes(value: str) -> bytes:
    n = int(value, 2) if value else 0
    return n.to_bytes((n.bit_length() + 7) // 8, "little")


def _bits(value: str) -> str:
    return _b64(_bits_bytes(value))


# --- dates and times ---------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _date_text(days: int) -> str:
    """``YYYY-MM-DD`` of a day number, years printed as java.time does (``+10000``, ``-0043``)."""
    # Howard Hinnant's civil_from_days.
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    if 0 <= year <= 9999:
        return f"{year:04d}-{month:02d}-{day:02d}"
    if year > 9999:
        return f"+{year}-{month:02d}-{day:02d}"
    return f"-{-year:04d}-{month:02d}-{day:02d}"


@functools.lru_cache(maxsize=8192)
def _hms_text(seconds: int) -> str:
    """``HH:MM:SS`` of a second of the day (cached: the times in a stream cluster)."""
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}"


def _clock_text(us_of_day: int, width: int | None) -> str:
    """``HH:MM:SS`` and a fraction: ``width`` digits, or (None) as few as the value needs."""
    seconds, fraction = divmod(us_of_day, 1_000_000)
    text = _hms_text(seconds)
    if width is None:
        if fraction:
            text += "." + f"{fraction:06d}".rstrip("0")
    elif width > 0:
        text += "." + f"{fraction:06d}"[:width]
    return text


_SECOND_TEXT: dict[int, str] = {}  # second since the epoch -> "YYYY-MM-DDTHH:MM:SS"
_SECOND_TEXT_MAX: Final = 65_536


def _timestamp_text(us: int, width: int | None) -> str:
    seconds, fraction = divmod(us, 1_000_000)
    text = _SECOND_TEXT.get(seconds)
    if text is None:
        days, second_of_day = divmod(seconds, 86_400)
        text = f"{_date_text(days)}T{_hms_text(second_of_day)}"
        if len(_SECOND_TEXT) >= _SECOND_TEXT_MAX:
            _SECOND_TEXT.clear()
        _SECOND_TEXT[seconds] = text
    if width is None:
        if fraction:
            return text + "." + f"{fraction:06d}".rstrip("0") + "Z"
        return text + "Z"
    if width > 0:
        return text + "." + f"{fraction:06d}"[:width] + "Z"
    return text + "Z"


def _date_days(value: int | Infinity) -> int:
    if type(value) is int:
        return value
    return _INT32_MAX if value is Infinity.POSITIVE else _INT32_MIN


def _date_iso(value: int | Infinity) -> str:
    if type(value) is int:
        return _date_text(value) + "Z"
    assert isinstance(value, Infinity)
    return value.value


def _time_ms(value: int) -> int:
    return value // 1000


def _time_iso(value: int) -> str:
    return _clock_text(value, None) + "Z"


def _timestamp_ms(value: int | Infinity) -> int:
    if type(value) is int:
        return value // 1000
    return _TIMESTAMP_POSITIVE_INFINITY if value is Infinity.POSITIVE else _TIMESTAMP_NEGATIVE_INFINITY


def _timestamp_us(value: int | Infinity) -> int:
    if type(value) is int:
        return value
    return _TIMESTAMP_POSITIVE_INFINITY if value is Infinity.POSITIVE else _TIMESTAMP_NEGATIVE_INFINITY


def _timestamp_iso(value: int | Infinity) -> str:
    if type(value) is int:
        return _timestamp_text(value, None)
    assert isinstance(value, Infinity)
    return value.value


def _zoned_timestamp(width: int) -> Encoder:
    def encode(value: int | Infinity) -> str:
        if type(value) is int:
            return _timestamp_text(value, width)
        assert isinstance(value, Infinity)
        return value.value

    return encode


def _zoned_time(value: TimeTz) -> str:
    utc = value.microseconds - value.utc_offset_seconds * 1_000_000
    if utc != _US_PER_DAY:  # 24:00:00+00 stays 24:00:00Z
        utc %= _US_PER_DAY
    return _clock_text(utc, None) + "Z"


def _offset_time(value: TimeTz) -> str:
    """An injective timetz text for keys: the local time and its own offset (``12:00:00+05:30``)."""
    offset = value.utc_offset_seconds
    sign = "-" if offset < 0 else "+"
    hours, rest = divmod(abs(offset), 3600)
    minutes, seconds = divmod(rest, 60)
    suffix = f"{sign}{hours:02d}:{minutes:02d}" + (f":{seconds:02d}" if seconds else "")
    return _clock_text(value.microseconds, None) + suffix


def _is_infinite_interval(value: Interval) -> int:
    """1 for PostgreSQL 17's +infinity interval, -1 for -infinity, else 0."""
    if value.months == _INT32_MAX and value.days == _INT32_MAX and value.microseconds == _INT64_MAX:
        return 1
    if value.months == _INT32_MIN and value.days == _INT32_MIN and value.microseconds == _INT64_MIN:
        return -1
    return 0


def _interval_micros(value: Interval) -> int:
    infinite = _is_infinite_interval(value)
    if infinite:
        return _INT64_MAX if infinite > 0 else _INT64_MIN
    return value.months * _US_PER_MONTH + value.days * _US_PER_DAY + value.microseconds


def _interval_iso(value: Interval) -> str:
    """Debezium's Interval text: ``P<y>Y<m>M<d>DT<h>H<m>M<s>S``, every part present."""
    infinite = _is_infinite_interval(value)
    if infinite:
        return "infinity" if infinite > 0 else "-infinity"
    years = abs(value.months) // 12 * (1 if value.months >= 0 else -1)
    months = value.months - years * 12
    negative = value.microseconds < 0
    magnitude = abs(value.microseconds)
    hours, rest = divmod(magnitude, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    whole, fraction = divmod(rest, 1_000_000)
    seconds = str(whole) + ("." + f"{fraction:06d}".rstrip("0") if fraction else "")
    if negative:
        hours, minutes = -hours, -minutes
        if rest:
            seconds = "-" + seconds
    return f"P{years}Y{months}M{value.days}DT{hours}H{minutes}M{seconds}S"


# ---------------------------------------------------------------------------
# Column types -> specs
# ---------------------------------------------------------------------------

_PLAIN_STRING_TYPES: Final = frozenset(
    {"text", "varchar", "bpchar", "name", "char", "inet", "cidr", "macaddr", "macaddr8",
     "int4range", "numrange", "tsrange", "tstzrange", "daterange", "int8range"}
)  # fmt: skip
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
            return [
                None if v is None else (encode_array(v) if type(v) is list else encode_element(v)) for v in values
            ]

        return ConnectSchema("array", encode_array, items=element, avro=avro)
    if kind is TypeKind.ENUM:
        return ConnectSchema("string", None, name="io.debezium.data.Enum", version=1, parameters=(("allowed", ",".join(base.labels)),))
    if kind is TypeKind.BASE and base.schema == "pg_catalog":
        spec = _builtin_spec(base.name, modifier, opts, key, where)
        if spec is not None:
            return spec
    if kind is TypeKind.BASE:
        if base.name == "hstore":
            return ConnectSchema("string", _hstore, name="io.debezium.data.Json", version=1, avro=_hstore)
        if base.name == "citext":
            return _STRING
        if base.name == "ltree":
            return ConnectSchema("string", None, name="io.debezium.data.Ltree", version=1)
    if kind is TypeKind.RANGE and base.schema == "pg_catalog" and base.name in _PLAIN_STRING_TYPES:
        return _STRING
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
            return _BOOLEAN
        case "int2":
            return _INT16
        case "int4":
            return _INT32
        case "int8" | "oid":
            return _INT64
        case "float4":
            return ConnectSchema("float", _float)
        case "float8":
            return ConnectSchema("double", _float)
        case "numeric" | "money":
            handling = opts.decimal_handling
            if handling == "double" and key:
                handling = "string"  # a double is not injective
            if handling == "string":
                return ConnectSchema("string", _plain_decimal, avro=_plain_decimal)
            if handling == "double":
                return ConnectSchema("double", _double_decimal, avro=float)
            if name == "money":
                return ConnectSchema(
                    "bytes",
                    _fixed_decimal(2, where),
                    name="org.apache.kafka.connect.data.Decimal",
                    version=1,
                    parameters=(("scale", "2"),),
                    avro=_fixed_decimal_bytes(2, where, "Avro"),
                )
            typmod = numeric_typmod(modifier)
            if typmod is None:
                return ConnectSchema(
                    "struct",
                    _variable_decimal(where),
                    name="io.debezium.data.VariableScaleDecimal",
                    version=1,
                    doc="Variable scaled decimal",
                    fields=(("scale", _INT32, False), ("value", _BYTES_NODE, False)),
                    avro=_variable_decimal_avro(where),
                )
            precision, scale = typmod
            return ConnectSchema(
                "bytes",
                _fixed_decimal(scale, where),
                name="org.apache.kafka.connect.data.Decimal",
                version=1,
                parameters=(("scale", str(scale)), ("connect.decimal.precision", str(precision))),
                avro=_fixed_decimal_bytes(scale, where, "Avro"),
            )
        case "bytea":
            return ConnectSchema("bytes", _bytes)
        case "uuid":
            return ConnectSchema("string", None, name="io.debezium.data.Uuid", version=1, avro=str)  # orjson writes UUIDs
        case "json" | "jsonb":
            return ConnectSchema("string", None, name="io.debezium.data.Json", version=1)
        case "xml":
            return ConnectSchema("string", None, name="io.debezium.data.Xml", version=1)
        case "date":
            if adaptive:
                return ConnectSchema("int32", _date_days, name="io.debezium.time.Date", version=1, avro=_date_days)
            return ConnectSchema("string", _date_iso, name="io.debezium.time.IsoDate", version=1, avro=_date_iso)
        case "time":
            if not adaptive:
                return ConnectSchema("string", _time_iso, name="io.debezium.time.IsoTime", version=1, avro=_time_iso)
            if time_precision(modifier) <= 3:
                return ConnectSchema("int32", _time_ms, name="io.debezium.time.Time", version=1, avro=_time_ms)
            return ConnectSchema("int64", None, name="io.debezium.time.MicroTime", version=1)
        case "timestamp":
            if not adaptive:
                return ConnectSchema("string", _timestamp_iso, name="io.debezium.time.IsoTimestamp", version=1, avro=_timestamp_iso)
            if time_precision(modifier) <= 3:
                return ConnectSchema("int64", _timestamp_ms, name="io.debezium.time.Timestamp", version=1, avro=_timestamp_ms)
            return ConnectSchema("int64", _timestamp_us, name="io.debezium.time.MicroTimestamp", version=1, avro=_timestamp_us)
        case "timestamptz":
            encoder = _zoned_timestamp(time_precision(modifier))
            return ConnectSchema("string", encoder, name="io.debezium.time.ZonedTimestamp", version=1, avro=encoder)
        case "timetz":
            zoned = _offset_time if key else _zoned_time
            return ConnectSchema("string", zoned, name="io.debezium.time.ZonedTime", version=1, avro=zoned)
        case "interval":
            if opts.interval_handling == "string" or key:
                return ConnectSchema("string", _interval_iso, name="io.debezium.time.Interval", version=1, avro=_interval_iso)
            return ConnectSchema("int64", _interval_micros, name="io.debezium.time.MicroDuration", version=1, avro=_interval_micros)
        case "bit" | "varbit":
            if modifier == 1:
                return ConnectSchema("boolean", _bit_bool, avro=_bit_bool)
            length = str(modifier) if modifier > 0 else str(_INT32_MAX)
            return ConnectSchema(
                "bytes", _bits, name="io.debezium.data.Bits", version=1, parameters=(("length", length),), avro=_bits_bytes
            )
        case "point":
            return ConnectSchema(
                "struct",
                _point,
                name="io.debezium.data.geometry.Point",
                version=1,
                doc="Geometry (POINT)",
                fields=(("x", _DOUBLE_NODE, False), ("y", _DOUBLE_NODE, False),
                        ("wkb", _BYTES_NODE, True), ("srid", _INT32, True)),
                avro=_point_avro,
            )  # fmt: skip
    if name in _PLAIN_STRING_TYPES:
        return _STRING
    return None


def _placeholder(pg_type: PgType, spec: ConnectSchema, text: str) -> Any:
    """What an unchanged TOASTed value becomes in this column (Debezium's placeholders)."""
    if spec.type == "bytes":
        return _b64(text.encode())
    if spec.type == "array":
        base = _base_type(pg_type)
        element = _base_type(base.element) if base is not None and base.element is not None else None
        if element is not None and element.schema == "pg_catalog" and element.name in _INT_ARRAY_ELEMENTS:
            return list(text.encode())
        return [text]
    return text


# ---------------------------------------------------------------------------
# Rendering: pgoutput's column text straight to the JSON value (the streaming fast path)
# ---------------------------------------------------------------------------
#
# Each renderer returns exactly the bytes orjson writes for the encoder's value of the same
# text (tests/unit/test_render.py compares them value by value) and raises ValueError for
# any text it does not cover, which sends the row down the typed path.


class RenderDeclined(ValueError):
    """A column's typed value could not be encoded: the typed path will raise the real error."""


_JSON_SPECIAL: Final = re.compile(rb'["\\\x00-\x1f]').search  # what orjson escapes in a string


def _render_text(raw: bytes) -> bytes:
    if raw.isascii() and _JSON_SPECIAL(raw) is None:
        return b'"' + raw + b'"'
    return orjson.dumps(raw.decode())  # UnicodeDecodeError is a ValueError: the typed path names it


def check_int_text(raw: bytes) -> bytes:
    """An integer's text as PostgreSQL prints it (also its JSON); ValueError otherwise."""
    if raw.isdigit() or (raw[:1] == b"-" and raw[1:].isdigit()):
        return raw
    raise ValueError(raw)


def _render_bool(raw: bytes) -> bytes:
    if raw == b"t":
        return b"true"
    if raw == b"f":
        return b"false"
    raise ValueError(raw)


def check_uuid_text(raw: bytes) -> bytes:
    """Canonical lower-case uuid text, as PostgreSQL prints it; ValueError otherwise (cheaper than a regex)."""
    if len(raw) != 36 or raw[8:24:5] != b"----" or raw.translate(None, b"0123456789abcdef") != b"----":
        raise ValueError(raw)
    return raw


def _render_uuid(raw: bytes) -> bytes:
    return b'"' + check_uuid_text(raw) + b'"'


@functools.lru_cache(maxsize=64)
def fixed_numeric_bytes(scale: int) -> Callable[[bytes], bytes]:
    """numeric(p, scale) text -> the unscaled value's minimal two's complement. PostgreSQL prints exactly
    ``scale`` fraction digits; NaN, Infinity or another scale raise ValueError (the typed path then
    raises the precise error)."""

    def unscaled(raw: bytes) -> bytes:
        if scale:
            if len(raw) <= scale or raw[-scale - 1] != 0x2E:  # '.'
                raise ValueError(raw)
            raw = raw[: -scale - 1] + raw[-scale:]
        return _twos_complement(int(check_int_text(raw)))

    return unscaled


@functools.lru_cache(maxsize=64)
def _render_fixed_numeric(scale: int) -> Callable[[bytes], bytes]:
    """numeric(p, scale) under ``precise``: base64 of the two's complement, as a JSON string."""
    b64 = binascii.b2a_base64
    unscaled = fixed_numeric_bytes(scale)

    def render(raw: bytes) -> bytes:
        return b'"' + b64(unscaled(raw), newline=False) + b'"'

    return render


_TIMESTAMPTZ_UTC: Final = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.(\d{1,6}))?\+00").fullmatch


@functools.lru_cache(maxsize=16)
def zoned_timestamp_text(width: int, quote: bytes = b"") -> Callable[[bytes], bytes]:
    """timestamptz as ZonedTimestamp's text between ``quote``s (JSON: ``"``; Avro: none), from the text a
    UTC session prints: years 1-9999 (AD) only."""
    zeros = b"0" * 6
    # The last text and its rendering, swapped as one tuple: now() is the same for every row of a
    # transaction, so consecutive rows often repeat a timestamp.
    last = [(b"", b"")]

    def render(raw: bytes) -> bytes:
        previous = last[0]
        if previous[0] == raw:
            return previous[1]
        match = _TIMESTAMPTZ_UTC(raw)
        if match is None:
            raise ValueError(raw)  # BC, years past 9999, infinity, another offset
        if width == 0:
            out = quote + raw[:10] + b"T" + raw[11:19] + b"Z" + quote
        else:
            fraction = (match.group(1) or b"") + zeros
            out = quote + raw[:10] + b"T" + raw[11:19] + b"." + fraction[:width] + b"Z" + quote
        last[0] = (raw, out)
        return out

    return render


def direct_type(pg_type: PgType, modifier: int, opts: TypeOptions) -> str | None:
    """Which direct renderer a column's type has (the same in every format), or None."""
    if pg_type.kind is not TypeKind.BASE or pg_type.schema != "pg_catalog":
        return None  # domains, enums, arrays, extension types: the typed path
    name = pg_type.name
    if name in ("int2", "int4", "int8", "oid"):
        return "int"
    if name in ("text", "varchar", "bpchar", "name", "json", "jsonb", "xml"):
        return "text"
    if name in ("bool", "uuid", "timestamptz"):
        return name
    if name == "numeric" and opts.decimal_handling == "precise":
        typmod = numeric_typmod(modifier)
        if typmod is not None and typmod[1] >= 0:
            return "numeric"
    return None


def _direct_renderer(pg_type: PgType, modifier: int, opts: TypeOptions) -> Callable[[bytes], bytes] | None:
    """The JSON renderer of a column's text, for the built-in types whose text maps to JSON cheaply.

    Only types whose key encoding is their value encoding (``column_schema(..., key=True)``
    differs for doubles, timetz and intervals, none of them here): keys are rendered by the same
    function."""
    kind = direct_type(pg_type, modifier, opts)
    if kind == "int":
        return check_int_text
    if kind == "text":
        return _render_text
    if kind == "bool":
        return _render_bool
    if kind == "uuid":
        return _render_uuid
    if kind == "timestamptz":
        return zoned_timestamp_text(time_precision(modifier), b'"')
    if kind == "numeric":
        typmod = numeric_typmod(modifier)
        assert typmod is not None
        return _render_fixed_numeric(typmod[1])
    return None


def _object_format(names: Sequence[str]) -> bytes:
    """``{"a":%b,"b":%b}``: a JSON object of these members, for bytes formatting (``%`` in names doubled)."""
    return b"{" + b",".join(orjson.dumps(name).replace(b"%", b"%%") + b":%b" for name in names) + b"}"


def typed_renderer(write: Callable[[Any], bytes], encode: Encoder | None) -> Callable[[Any], bytes]:
    """A column's typed value in a format's bytes: the format's ``encode``, then ``write`` (JSON: orjson,
    as it writes the value inside the row object; Avro: the field's compiled writer). A value either
    refuses declines the row to the typed path, which raises the real error."""

    def render(value: Any) -> bytes:
        try:
            return write(value if encode is None else encode(value))
        except (SerializationError, TypeError, ValueError, AttributeError, OverflowError, LookupError) as exc:
            raise RenderDeclined(str(exc)) from exc

    return render


# ---------------------------------------------------------------------------
# Per-table plans
# ---------------------------------------------------------------------------

_Field = tuple[str, Encoder | None, Any]  # (column name, encoder, unchanged-TOAST placeholder)


@dataclass(frozen=True, slots=True)
class _TablePlan:
    table: TableSchema
    topic: str
    fields: tuple[_Field, ...]
    key_fields: tuple[_Field, ...]
    key_prefix: bytes  # b'{"schema":<key schema>,"payload":' or b''
    value_prefix: bytes  # the same for the envelope
    truncate_key: bytes  # the truncate markers' key: the key fields, all null
    encode_row: Callable[[dict[str, Any]], dict[str, Any]]  # row_encoder(fields)
    null_texts: tuple[bytes, ...] = ()  # per column: what a missing value renders as (null, or the fallback)


class TablePlan(Protocol):
    """What the shared event logic needs from a format's plan of one table schema."""

    @property
    def table(self) -> TableSchema: ...

    @property
    def topic(self) -> str: ...

    @property
    def key_fields(self) -> tuple[_Field, ...]:
        """The key columns with their JSON key encoders (key header payloads are JSON in every format)."""
        ...


PlanT = TypeVar("PlanT", bound=TablePlan)


class FormatSettings(Protocol):
    """The settings every format has (``JsonSettings``; ``cdc.sink.avro.AvroSettings``)."""

    @property
    def topic_prefix(self) -> str: ...

    @property
    def database(self) -> str: ...

    @property
    def decimal_handling(self) -> str: ...

    @property
    def time_precision(self) -> str: ...

    @property
    def interval_handling(self) -> str: ...

    @property
    def unavailable_value(self) -> str: ...

    @property
    def connector_version(self) -> str: ...


_TOPIC_CHARS: Final = re.compile(r"[^a-zA-Z0-9._-]")
_OPS: Final[dict[Op, str]] = {op: op.value for op in Op}
# The JSON envelope with its parts as text (before, after, source, ts_ms, ts_us, ts_ns), by op: the key
# order and spacing orjson writes for JsonSerializer._envelope's dict.
_ENVELOPE_TEMPLATES: Final[dict[str, bytes]] = {
    op.value: b'{"before":%b,"after":%b,"source":%b,"transaction":null,"op":"'
    + op.value.encode()
    + b'","ts_ms":%d,"ts_us":%d,"ts_ns":%d}'
    for op in Op
}


def _fragment(part: Any) -> Any:
    """A part of a JSON envelope for orjson: JSON text (bytes) as a Fragment, anything else as it is."""
    return orjson.Fragment(part) if type(part) is bytes else part


def _json_text(part: Any) -> bytes:
    """A part of a JSON envelope as JSON text."""
    return part if type(part) is bytes else orjson.dumps(part)


_MAX_PLANS: Final = 4096


def _where(table: TableSchema, column: Column) -> str:
    return f"column {column.name!r} of table {table.qualified!r}"


class EventSerializer(abc.ABC, Generic[PlanT]):
    """What every format shares: topics, a plan per table schema, and the records each event becomes.

    The record set (delete + tombstone, key change as delete/tombstone/create with key
    headers, truncate markers on every partition) and the headers are decided here, once;
    a format supplies the plan of a table and the bytes (``_build_plan``, ``_row``,
    ``_key``, ``_envelope``, ``_truncate_key``, ``_message``). One per sink; not thread-safe.
    """

    def __init__(
        self,
        settings: FormatSettings,
        partitions_of: Callable[[str], int],
        *,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._partitions_of = partitions_of
        self._clock_ns = clock_ns
        # Tables whose truncates write no marker (tables[].truncate: skip); None: every table gets markers.
        self.skip_truncate: Callable[[TableSchema], bool] | None = None
        self._opts = TypeOptions(settings.decimal_handling, settings.time_precision, settings.interval_handling)
        self._prefix = settings.topic_prefix
        self._version = settings.connector_version
        self._database = settings.database
        self._placeholder = settings.unavailable_value
        self._plans_by_id: dict[int, tuple[TableSchema, PlanT]] = {}
        # The source block's pieces per transaction and table (a format's _source_pieces), made once.
        self._source_parts: dict[tuple[int, int | None, int | None, int, bool], tuple[Any, ...]] = {}
        self._plans: dict[TableSchema, PlanT] = {}
        self._topic_owner: dict[str, tuple[str, str]] = {}
        self._message_topic = _TOPIC_CHARS.sub("_", f"{self._prefix}.message")
        # The headers that stay the same through a transaction, made once per transaction.
        self._tx_headers: tuple[int | None, int | None, tuple[str, bytes], tuple[str, bytes]] = (
            None,
            None,
            ("cdc.commit_lsn", b""),
            ("cdc.txid", b""),
        )

    # --- topics and plans ---------------------------------------------------

    def topic_for(self, table: TableSchema) -> str:
        """``<prefix>.<schema>.<table>``; characters outside ``[a-zA-Z0-9._-]`` become ``_``."""
        return self._plan(table).topic

    def topic_name(self, schema: str, table: str) -> str:
        """The topic of table ``schema.table`` (for start-up, before a TableSchema exists).

        Raises ``SerializationError`` when two captured tables would share a topic.
        """
        topic = _TOPIC_CHARS.sub("_", f"{self._prefix}.{schema}.{table}")
        owner = self._topic_owner.setdefault(topic, (schema, table))
        if owner != (schema, table):
            raise SerializationError(
                f"tables {owner[0]}.{owner[1]} and {schema}.{table} both map to topic {topic!r} "
                "(characters outside [a-zA-Z0-9._-] become '_'), where their keys could collide: "
                "rename one or leave one out of the capture"
            )
        return topic

    def _plan(self, table: TableSchema) -> PlanT:
        # By identity first: hashing a TableSchema walks all its columns. The entry holds the schema
        # object itself (not the plan's, which may be an equal one from before a reconnect), so an id
        # is never taken for another object's.
        entry = self._plans_by_id.get(id(table))
        if entry is not None and entry[0] is table:
            return entry[1]
        plan = self._plans.get(table)
        if plan is None:
            plan = self._build_plan(table)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[table] = plan
        if len(self._plans_by_id) >= _MAX_PLANS:
            self._plans_by_id.clear()
        self._plans_by_id[id(table)] = (table, plan)
        return plan

    @abc.abstractmethod
    def _build_plan(self, table: TableSchema) -> PlanT:
        """Everything per table schema that does not change per row: topic, encoders, schemas."""

    def row_rendering(self, table: TableSchema) -> RowRendering | None:
        """How the decoder may write ``table``'s rows straight in this format (``RenderedRow``); None: as
        typed values only."""
        return None

    # --- events -------------------------------------------------------------

    def records(self, event: ChangeEvent | TruncateEvent | MessageEvent) -> list[Record]:
        """The records for one event, in the order they must be produced."""
        if type(event) is ChangeEvent:
            return self._change(event)
        if type(event) is TruncateEvent:
            return self._truncate(event)
        if type(event) is MessageEvent:
            return self._message(event)
        raise TypeError(f"cannot serialize {type(event).__name__}")

    def _change(self, event: ChangeEvent) -> list[Record]:
        plan = self._plan(event.table)
        if not plan.key_fields:
            raise SerializationError(
                f"table {event.table.qualified!r} has no key columns: its rows cannot be keyed on a "
                "compacted topic; give it a primary key (or replica identity index) or configure its key columns"
            )
        op = event.op
        commit_lsn, xid = event.commit_lsn, event.xid
        tx = self._tx_headers
        headers: tuple[tuple[str, bytes], ...]
        if tx[0] == commit_lsn and tx[1] == xid and xid is not None:
            headers = (("cdc.lsn", b"%d" % event.lsn), tx[2], tx[3], ("cdc.ordinal", b"%d" % event.ordinal))
        else:
            headers = position_headers(event.lsn, commit_lsn, xid, event.ordinal)
            if len(headers) == 4:
                self._tx_headers = (commit_lsn, xid, headers[1], headers[2])
        source = self._source(event.table, event.commit_ts_us, event.commit_lsn, event.lsn, event.xid, event.snapshot)
        now = self._clock_ns()
        topic = plan.topic
        if op is Op.CREATE or op is Op.READ:
            after = self._row(plan, event.after, "after")
            key = self._key(plan, event.after)
            return [Record(topic, key, self._envelope(plan, None, after, source, _OPS[op], now), headers)]
        if op is Op.DELETE:
            before = self._row(plan, event.before, "before")
            key = self._key(plan, event.before)
            value = self._envelope(plan, before, None, source, "d", now)
            return [Record(topic, key, value, headers), Record(topic, key, None, headers)]
        if op is Op.UPDATE:
            old_row = self._row(plan, event.before, "before") if event.before is not None else None
            new_row = self._row(plan, event.after, "after")
            key = self._key(plan, event.after)
            if event.before is not None:
                old_key = self._key(plan, event.before)
                if old_key != key:
                    new_payload = self._key_payload(plan, event.after)
                    old_payload = self._key_payload(plan, event.before)
                    delete_headers = (*headers, ("__debezium.newkey", new_payload))
                    create_headers = (*headers, ("__debezium.oldkey", old_payload))
                    return [
                        Record(topic, old_key, self._envelope(plan, old_row, None, source, "d", now), delete_headers),
                        Record(topic, old_key, None, delete_headers),
                        Record(topic, key, self._envelope(plan, None, new_row, source, "c", now), create_headers),
                    ]
            return [Record(topic, key, self._envelope(plan, old_row, new_row, source, "u", now), headers)]
        raise SerializationError(f"a ChangeEvent cannot have op {op.value!r} (truncates and messages have their own events)")

    def _truncate(self, event: TruncateEvent) -> list[Record]:
        headers = (*position_headers(event.lsn, event.commit_lsn, event.xid, event.ordinal), ("cdc.truncate", b"1"))
        now = self._clock_ns()
        records: list[Record] = []
        for table in event.tables:
            if self.skip_truncate is not None and self.skip_truncate(table):
                _log.info("truncate_skipped", table=table.qualified, lsn=int(event.lsn), setting="tables[].truncate: skip")
                continue
            plan = self._plan(table)
            source = self._source(table, event.commit_ts_us, event.commit_lsn, event.lsn, event.xid, False)
            value = self._envelope(plan, None, None, source, "t", now)
            partitions = self._partitions_of(plan.topic)
            if partitions < 1:
                raise SerializationError(f"topic {plan.topic!r} has {partitions} partitions: nowhere to put truncate markers")
            for partition in range(partitions):
                records.append(Record(plan.topic, self._truncate_key(plan, partition), value, headers, partition=partition))
        return records

    @abc.abstractmethod
    def _message(self, event: MessageEvent) -> list[Record]:
        """The record of a logical decoding message (topic ``<prefix>.message``)."""

    @abc.abstractmethod
    def side_record(
        self, topic: str, key_schema: ConnectSchema, key: dict[str, Any], value_schema: ConnectSchema, value: dict[str, Any]
    ) -> Record:
        """A record of a side topic (heartbeats, transaction metadata: ``cdc.sink.metadata``) in this format,
        key and value each valid against its Connect schema."""

    # --- pieces -------------------------------------------------------------

    def _source(
        self,
        table: TableSchema,
        commit_ts_us: int,
        commit_lsn: int | None,
        lsn: int,
        xid: int | None,
        snapshot: bool,
    ) -> Any:  # a dict; the JSON format gives its JSON text (bytes) when it can splice it
        return {
            "version": self._version,
            "connector": "postgresql",
            "name": self._prefix,
            "ts_ms": commit_ts_us // 1000,
            "snapshot": "true" if snapshot else "false",
            "db": self._database,
            "sequence": sequence_text(commit_lsn, lsn),
            "ts_us": commit_ts_us,
            "ts_ns": commit_ts_us * 1000,
            "schema": table.schema,
            "table": table.name,
            "txId": xid,
            "lsn": int(lsn),
            "xmin": None,
            "origin": None,
            "origin_lsn": None,
        }

    def _message_source(self, event: MessageEvent, now_ns: int) -> dict[str, Any]:
        """A message's ``source``: no table; no commit time (non-transactional): the serializer's clock."""
        commit_ts_us = event.commit_ts_us if event.commit_ts_us is not None else now_ns // 1000
        return {
            "version": self._version,
            "connector": "postgresql",
            "name": self._prefix,
            "ts_ms": commit_ts_us // 1000,
            "snapshot": "false",
            "db": self._database,
            "sequence": sequence_text(event.commit_lsn, event.lsn),
            "ts_us": commit_ts_us,
            "ts_ns": commit_ts_us * 1000,
            "schema": "",
            "table": "",
            "txId": event.xid,
            "lsn": int(event.lsn),
            "xmin": None,
            "origin": None,
            "origin_lsn": None,
        }

    def _source_cached(
        self, table: TableSchema, commit_ts_us: int, commit_lsn: int | None, xid: int | None, snapshot: bool
    ) -> tuple[Any, ...]:
        """``(table, *self._source_pieces(...))``, made once per transaction and table: within one, only the
        event's LSN changes in the source block."""
        key = (id(table), commit_lsn, xid, commit_ts_us, snapshot)
        parts = self._source_parts.get(key)
        if parts is None or parts[0] is not table:
            parts = (table, *self._source_pieces(table, commit_ts_us, commit_lsn, xid, snapshot))
            if len(self._source_parts) >= 256:
                self._source_parts.clear()
            self._source_parts[key] = parts
        return parts

    def _source_pieces(
        self, table: TableSchema, commit_ts_us: int, commit_lsn: int | None, xid: int | None, snapshot: bool
    ) -> tuple[Any, ...]:
        """A format's source block around its per-event parts (see ``_source_cached``)."""
        raise NotImplementedError

    def _key_payload(self, plan: PlanT, row: AnyRow | None) -> bytes:
        """The key as JSON text (``{"id":1}``): the JSON format's key payload, and every format's key headers."""
        if type(row) is RenderedRow:
            row = row.key  # the typed key values (an Avro row's key_data is Avro)
        if row is None:
            raise SerializationError(f"table {plan.table.qualified!r}: the event has no row to take the key from")
        assert isinstance(row, dict)
        try:
            return orjson.dumps(_encode_key(plan.table, plan.key_fields, row))
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise _value_error(plan.table, plan.key_fields, row, exc) from exc

    @abc.abstractmethod
    def _row(self, plan: PlanT, row: AnyRow | None, which: str) -> Any:
        """A row's columns encoded for the envelope's ``before``/``after``."""

    @abc.abstractmethod
    def _key(self, plan: PlanT, row: AnyRow | None) -> bytes:
        """The record key of a row: the same bytes for every event of the row."""

    @abc.abstractmethod
    def _envelope(
        self,
        plan: PlanT,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        source: dict[str, Any],
        op: str,
        now_ns: int,
    ) -> bytes:
        """The record value: Debezium's envelope."""

    @abc.abstractmethod
    def _truncate_key(self, plan: PlanT, partition: int) -> bytes:
        """The key of the truncate marker on ``partition``: never a row's key."""


@dataclass(frozen=True, slots=True)
class ReadParts:
    """A snapshot read's JSON records in pieces: key = key_head + <key object> + key_end; value = value_head +
    <after object> + value_middle + ``times(now_ns)`` + value_end, byte for byte what ``records`` makes of the
    same row (the unit tests check it)."""

    topic: str
    columns: tuple[str, ...]  # the after object's members, in order
    key_columns: tuple[str, ...]  # the key object's members, in order
    key_head: bytes
    key_end: bytes
    value_head: bytes
    value_middle: bytes
    value_end: bytes

    @staticmethod
    def times(now_ns: int) -> bytes:
        """The envelope's processing-time members."""
        return b'"ts_ms":%d,"ts_us":%d,"ts_ns":%d' % (now_ns // 1_000_000, now_ns // 1000, now_ns)


class JsonSerializer(EventSerializer[_TablePlan]):
    """Events -> records in Debezium's JSON shape. One per sink; not thread-safe."""

    def __init__(
        self,
        settings: JsonSettings,
        partitions_of: Callable[[str], int],
        *,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__(settings, partitions_of, clock_ns=clock_ns)
        self._settings = settings
        self._schemas = settings.schemas_enable
        self._message_key_prefix = b""
        self._message_value_prefix = b""
        self._side_prefixes: dict[ConnectSchema, bytes] = {}
        if self._schemas:
            self._message_key_prefix = _schema_prefix(MESSAGE_KEY_SCHEMA.node(False))
            self._message_value_prefix = _schema_prefix(MESSAGE_VALUE_SCHEMA.node(False))

    @property
    def settings(self) -> JsonSettings:
        return self._settings

    # ``source`` as JSON text made once per transaction and table: only the event's LSN changes
    # within one (it appears twice, in ``sequence`` and ``lsn``); the rest is spliced around it.
    _LSN_SENTINEL: Final = 7_777_777_777_777_777_777

    def _source(
        self,
        table: TableSchema,
        commit_ts_us: int,
        commit_lsn: int | None,
        lsn: int,
        xid: int | None,
        snapshot: bool,
    ) -> Any:
        parts = self._source_cached(table, commit_ts_us, commit_lsn, xid, snapshot)
        if parts[1] is None:  # the sentinel's digits occur elsewhere too (a database named so): no splicing
            return super()._source(table, commit_ts_us, commit_lsn, lsn, xid, snapshot)
        text = b"%d" % lsn
        # JSON text as bytes: _envelope splices it (orjson.Fragment when the envelope goes through orjson)
        return parts[1] + text + parts[2] + text + parts[3]

    def _source_pieces(
        self, table: TableSchema, commit_ts_us: int, commit_lsn: int | None, xid: int | None, snapshot: bool
    ) -> tuple[Any, ...]:
        template = orjson.dumps(super()._source(table, commit_ts_us, commit_lsn, self._LSN_SENTINEL, xid, snapshot))
        pieces = template.split(b"%d" % self._LSN_SENTINEL)
        return tuple(pieces) if len(pieces) == 3 else (None, None, None)

    def _build_plan(self, table: TableSchema) -> _TablePlan:
        topic = self.topic_name(table.schema, table.name)
        opts = self._opts
        fields: list[_Field] = []
        value_members: list[tuple[str, ConnectSchema, bool]] = []
        key_fields: list[_Field] = []
        key_members: list[tuple[str, ConnectSchema, bool]] = []
        fallbacks: list[Any] = []
        for column in table.columns:
            where = _where(table, column)
            spec = column_schema(column.type, column.modifier, opts, False, where)
            fields.append((column.name, spec.encode, _placeholder(column.type, spec, self._placeholder)))
            optional = column.nullable and not column.key
            value_members.append((column.name, spec, optional))
            fallbacks.append(NO_FALLBACK if optional else json_fallback(column.type, column.modifier, spec))
            if column.key:
                key_spec = column_schema(column.type, column.modifier, opts, True, where)
                key_fields.append((column.name, key_spec.encode, None))  # no placeholder: see _encode_key
                key_members.append((column.name, key_spec, False))
        key_prefix = value_prefix = b""
        truncate_key = orjson.dumps(dict.fromkeys(name for name, _, _ in key_fields))
        if self._schemas:
            row = ConnectSchema("struct", None, name=f"{topic}.Value", fields=tuple(value_members))
            envelope = envelope_schema(topic, row)
            value_prefix = _schema_prefix(envelope.node(False))
            key = ConnectSchema("struct", None, name=f"{topic}.Key", fields=tuple(key_members))
            key_prefix = _schema_prefix(key.node(False))
            truncate_key = _schema_prefix(truncate_key_schema(topic, key_members).node(False)) + truncate_key + b"}"
        return _TablePlan(
            table=table,
            topic=topic,
            fields=tuple(fields),
            key_fields=tuple(key_fields),
            key_prefix=key_prefix,
            value_prefix=value_prefix,
            truncate_key=truncate_key,
            encode_row=row_encoder(fields, fallbacks),
            null_texts=tuple(b"null" if f is NO_FALLBACK else orjson.dumps(f) for f in fallbacks),
        )

    def read_parts(self, table: TableSchema, commit_ts_us: int, lsn: int, xid: int | None) -> ReadParts:
        """The constant parts of the records of snapshot reads of ``table`` at ``lsn``, for a writer that has
        each row's ``after`` object and key object as JSON text already (the snapshot's server-built rows)."""
        plan = self._plan(table)
        source = _json_text(self._source(table, commit_ts_us, lsn, lsn, xid, True))
        return ReadParts(
            topic=plan.topic,
            columns=tuple(name for name, _, _ in plan.fields),
            key_columns=tuple(name for name, _, _ in plan.key_fields),
            key_head=plan.key_prefix,
            key_end=b"}" if self._schemas else b"",
            value_head=plan.value_prefix + b'{"before":null,"after":',
            value_middle=b',"source":' + source + b',"transaction":null,"op":"r",',
            value_end=b"}}" if self._schemas else b"}",
        )

    def row_rendering(self, table: TableSchema) -> RowRendering | None:
        """How the decoder may write ``table``'s rows as JSON text (``RenderedRow``), skipping typed
        values where a column's text maps straight to its JSON; None: the table cannot be keyed (the
        typed path raises that error at its first row)."""
        try:
            plan = self._plan(table)
        except SerializationError:
            return None
        if not plan.key_fields:
            return None
        if any(c.key and c.nullable for c in table.columns):
            return None  # a key column that may be NULL: the typed path checks every key (_encode_key)
        opts = self._opts
        render: list[Callable[[bytes], bytes] | None] = []
        typed: list[Callable[[Any], bytes]] = []
        for column, (_, encode, _) in zip(table.columns, plan.fields, strict=True):
            render.append(_direct_renderer(column.type, column.modifier, opts))
            typed.append(typed_renderer(orjson.dumps, encode))
        names = tuple(c.name for c in table.columns)
        key_index = tuple(names.index(name) for name, _, _ in plan.key_fields)
        return RowRendering(
            names=names,
            render=tuple(render),
            typed=tuple(typed),
            null=plan.null_texts,
            row_format=_object_format(names),
            key_index=key_index,
            key_typed=tuple(typed_renderer(orjson.dumps, encode) for _, encode, _ in plan.key_fields),
            key_null=(b"null",) * len(key_index),
            key_format=_object_format(tuple(names[i] for i in key_index)),
        )

    def _truncate_key(self, plan: _TablePlan, partition: int) -> bytes:
        return plan.truncate_key

    def side_record(
        self, topic: str, key_schema: ConnectSchema, key: dict[str, Any], value_schema: ConnectSchema, value: dict[str, Any]
    ) -> Record:
        key_bytes, value_bytes = orjson.dumps(key), orjson.dumps(value)
        if self._schemas:
            key_bytes = self._side_prefix(key_schema) + key_bytes + b"}"
            value_bytes = self._side_prefix(value_schema) + value_bytes + b"}"
        return Record(topic, key_bytes, value_bytes)

    def _side_prefix(self, schema: ConnectSchema) -> bytes:
        prefix = self._side_prefixes.get(schema)
        if prefix is None:
            prefix = self._side_prefixes[schema] = _schema_prefix(schema.node(False))
        return prefix

    def _message(self, event: MessageEvent) -> list[Record]:
        now = self._clock_ns()
        value = orjson.dumps(
            {
                "op": "m",
                "ts_ms": now // 1_000_000,
                "source": self._message_source(event, now),
                "message": {"prefix": event.prefix, "content": _b64(event.content)},
            }
        )
        key = orjson.dumps({"prefix": event.prefix})
        if self._schemas:
            key = self._message_key_prefix + key + b"}"
            value = self._message_value_prefix + value + b"}"
        return [Record(self._message_topic, key, value, position_headers(event.lsn, event.commit_lsn, event.xid, event.ordinal))]

    def _envelope(
        self,
        plan: _TablePlan,
        before: Any,  # None, a dict, or JSON text (bytes); so are after and source
        after: Any,
        source: Any,
        op: str,
        now_ns: int,
    ) -> bytes:
        # Rows the decoder rendered and the spliced source block are JSON text already (bytes): the
        # envelope is then one formatting of a template, the bytes orjson would write for the dict below.
        template = _ENVELOPE_TEMPLATES.get(op)
        if (
            template is not None
            and type(source) is bytes
            and (before is None or type(before) is bytes)
            and (after is None or type(after) is bytes)
        ):
            body = template % (
                b"null" if before is None else before,
                b"null" if after is None else after,
                source,
                now_ns // 1_000_000,
                now_ns // 1000,
                now_ns,
            )
            return plan.value_prefix + body + b"}" if self._schemas else body
        payload = {
            "before": _fragment(before),
            "after": _fragment(after),
            "source": _fragment(source),
            "transaction": None,
            "op": op,
            "ts_ms": now_ns // 1_000_000,
            "ts_us": now_ns // 1000,
            "ts_ns": now_ns,
        }
        try:
            body = orjson.dumps(payload)
        except orjson.JSONEncodeError as exc:
            raise SerializationError(f"table {plan.table.qualified!r}: a value cannot be written as JSON: {exc}") from exc
        if self._schemas:
            return plan.value_prefix + body + b"}"
        return body

    def _row(self, plan: _TablePlan, row: AnyRow | None, which: str) -> Any:
        if type(row) is RenderedRow:
            return row.data  # JSON text: see _envelope
        if row is None:
            raise SerializationError(f"table {plan.table.qualified!r}: the event has no {which} row")
        assert isinstance(row, dict)
        try:
            return plan.encode_row(row)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise _value_error(plan.table, plan.fields, row, exc) from exc

    def _key_payload(self, plan: _TablePlan, row: AnyRow | None) -> bytes:
        if type(row) is RenderedRow:
            return row.key_data
        return super()._key_payload(plan, row)

    def _key(self, plan: _TablePlan, row: AnyRow | None) -> bytes:
        payload = self._key_payload(plan, row)
        if self._schemas:
            return plan.key_prefix + payload + b"}"
        return payload


def envelope_schema(topic: str, row: ConnectSchema) -> ConnectSchema:
    """Debezium's ``<topic>.Envelope`` v2 around the table's ``<topic>.Value`` struct."""
    return ConnectSchema(
        "struct",
        None,
        name=f"{topic}.Envelope",
        version=2,
        fields=(
            ("before", row, True),
            ("after", row, True),
            ("source", SOURCE_SCHEMA, False),
            ("transaction", TRANSACTION_SCHEMA, True),
            ("op", _STRING, False),
            ("ts_ms", _INT64, True),
            ("ts_us", _INT64, True),
            ("ts_ns", _INT64, True),
        ),
    )


def truncate_key_schema(topic: str, key_members: Sequence[tuple[str, ConnectSchema, bool]]) -> ConnectSchema:
    """The key struct of truncate markers, ``<topic>.TruncateKey``: the table's key fields, each optional (the
    marker's are all null). The same field names as the Key, so a consumer that maps key fields to columns
    (Debezium's JDBC sink with ``primary.key.mode=record_key``) finds no new column in a marker."""
    return ConnectSchema("struct", None, name=f"{topic}.TruncateKey", fields=tuple((n, spec, True) for n, spec, _ in key_members))


NO_FALLBACK: Final = object()
"""``row_encoder``'s fallback of an optional field: a missing value stays null."""


def row_encoder(
    fields: Sequence[_Field], fallbacks: Sequence[Any] | None = None
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A function encoding one row of the plan's fields, generated with the column loop unrolled (it runs
    per row): NULL stays None, an unchanged TOASTed value becomes the field's placeholder, any other value
    goes through the field's encoder (or as it is when there is none). Encoders' errors propagate.

    ``fallbacks`` (aligned with ``fields``): for a required field, the encoded value a missing or NULL
    column becomes (``cdc.sink.fallback``: a delete's key-only old tuple), so the row stays valid against
    its schema; ``NO_FALLBACK`` for an optional one."""
    lines = ["def encode(row, toast=toast):"]
    names: dict[str, Any] = {"toast": UNCHANGED_TOAST}
    for i, (name, encode, placeholder) in enumerate(fields):
        names[f"e{i}"] = encode
        names[f"p{i}"] = placeholder
        fallback = NO_FALLBACK if fallbacks is None else fallbacks[i]
        names[f"f{i}"] = fallback
        lines.append(f"    v{i} = row.get({name!r})")
        if encode is None:
            lines.append(f"    if v{i} is toast: v{i} = p{i}")
            if fallback is not NO_FALLBACK:
                lines.append(f"    elif v{i} is None: v{i} = f{i}")
        else:
            lines.append(f"    if v{i} is not None: v{i} = p{i} if v{i} is toast else e{i}(v{i})")
            if fallback is not NO_FALLBACK:
                lines.append(f"    else: v{i} = f{i}")
    lines.append("    return {" + ", ".join(f"{name!r}: v{i}" for i, (name, _, _) in enumerate(fields)) + "}")
    lines[0] = "def encode(row, toast=toast" + "".join(f", e{i}=e{i}, p{i}=p{i}, f{i}=f{i}" for i in range(len(fields))) + "):"
    exec("\n".join(lines), names)  # noqa: S102 - column names enter the source only through repr()
    encoder: Callable[[dict[str, Any]], dict[str, Any]] = names["encode"]
    return encoder


def _encode_key(table: TableSchema, key_fields: Sequence[_Field], row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, encode, _ in key_fields:
        value = row.get(name)
        if value is UNCHANGED_TOAST:
            raise unchanged_toast_key(table, name)
        out[name] = value if value is None or encode is None else encode(value)
    if all(v is None for v in out.values()):
        raise SerializationError(
            f"table {table.qualified!r}: every key column ({', '.join(out)}) is NULL in this row; such a key "
            "cannot tell rows apart (and is the truncate markers' key); choose key columns that are never all NULL"
        )
    return out


def unchanged_toast_key(table: TableSchema, column: str) -> SerializationError:
    return SerializationError(
        f"key column {column!r} of table {table.qualified!r} is an unchanged TOASTed value: "
        "the key is unknown; fill unchanged TOAST values before serializing (replica identity full or re-read)"
    )


def _value_error(table: TableSchema, fields: Sequence[_Field], row: dict[str, Any], exc: Exception) -> Exception:
    """Name the column whose value failed to encode (the slow path after a failure)."""
    if isinstance(exc, SerializationError):
        return exc
    for name, encode, _ in fields:
        value = row.get(name)
        if value is None or value is UNCHANGED_TOAST or encode is None:
            continue
        try:
            encode(value)
        except (TypeError, ValueError, AttributeError, OverflowError) as column_exc:
            return SerializationError(
                f"column {name!r} of table {table.qualified!r}: cannot encode {type(value).__name__} "
                f"value {value!r:.80}: {column_exc}"
            )
    return SerializationError(f"table {table.qualified!r}: cannot encode a row: {exc}")


def sequence_text(commit_lsn: int | None, lsn: int) -> str:
    """``source.sequence``: ``["<commit lsn>","<lsn>"]`` (the first null outside a transaction)."""
    first = "null" if commit_lsn is None else f'"{int(commit_lsn)}"'
    return f'[{first},"{int(lsn)}"]'


def position_headers(lsn: int, commit_lsn: int | None, xid: int | None, ordinal: int) -> tuple[tuple[str, bytes], ...]:
    if commit_lsn is not None and xid is not None:
        return (
            ("cdc.lsn", b"%d" % lsn),
            ("cdc.commit_lsn", b"%d" % commit_lsn),
            ("cdc.txid", b"%d" % xid),
            ("cdc.ordinal", b"%d" % ordinal),
        )
    headers: list[tuple[str, bytes]] = [("cdc.lsn", b"%d" % lsn)]
    if commit_lsn is not None:
        headers.append(("cdc.commit_lsn", b"%d" % commit_lsn))
    if xid is not None:
        headers.append(("cdc.txid", b"%d" % xid))
    headers.append(("cdc.ordinal", b"%d" % ordinal))
    return tuple(headers)


def _schema_prefix(node: dict[str, Any]) -> bytes:
    return b'{"schema":' + _dumps_node(node) + b',"payload":'


MESSAGE_KEY_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.postgresql.MessageKey",
    version=1,
    fields=(("prefix", _STRING, True),),
)

MESSAGE_VALUE_SCHEMA: Final = ConnectSchema(
    "struct",
    None,
    name="io.debezium.connector.postgresql.MessageValue",
    version=1,
    fields=(
        ("op", _STRING, False),
        ("ts_ms", _INT64, True),
        ("source", SOURCE_SCHEMA, False),
        (
            "message",
            ConnectSchema(
                "struct",
                None,
                name="io.debezium.connector.postgresql.Message",
                version=1,
                fields=(("prefix", _STRING, True), ("content", _BYTES_NODE, True)),
            ),
            False,
        ),
    ),
)
