"""Column values as the connector wrote them (Debezium JSON encodings) -> typed Spark columns.

Every function here builds Spark expressions (no Python UDFs): the row of an envelope is parsed
with every column as a string (Spark's JSON parser keeps the text of numbers, and the JSON text of
objects and arrays, for string fields), then each column is converted by the expression of its
``Kind`` under the connector's ``Encoding``. A value that is present but cannot be converted
becomes null here; ``failed(raw, decoded)`` tells the reader, which reports the record (topic,
partition, offset, column), or skips and counts it with ``--on-bad-record skip``.

Spark 4 runs with ANSI SQL on (``spark.sql.ansi.enabled``): a plain ``CAST`` of malformed text, an
array index out of bounds or an arithmetic overflow raises, failing the whole job with Spark's
message and no record named. So every conversion of a record's text here is a ``try_`` form
(``try_cast``, ``try_multiply``, ``try_add``, ``get``, ``try_to_date``): null on what does not
convert, which ``failed`` reports. They are stricter than Spark 3's non-ANSI casts, never looser:
``"1.5"`` as an integer is null (reported), not 1.

Kafka Connect Decimals (``numeric(p,s)`` with ``decimal_handling=precise``) are base64 of the
big-endian two's-complement unscaled value; ``unscaled_decimal_text`` turns them into decimal text
with integer arithmetic on two 64-bit halves (exact up to 38 digits), then the text is cast.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cdc_views.tables import ColumnShape, Encoding, Kind

_TWO_POW_64 = Decimal(2**64)
_HEX = "0123456789ABCDEF"
_HEX_NOT = "FEDCBA9876543210"
# Debezium's stand-ins for infinite dates and timestamps: no Spark value holds them.
_DATE_INFINITIES = ("2147483647", "-2147483648")
_TIMESTAMP_INFINITIES = ("9223372036825200000", "-9223372036832400000")
_US_PER_MONTH = 2_629_800_000_000
_US_PER_DAY = 86_400_000_000


def spark_type(column: ColumnShape, encoding: Encoding) -> DataType:
    """The Spark type a column is stored as in the views."""
    kind = column.kind
    if kind is Kind.ARRAY:
        assert column.element is not None
        return ArrayType(spark_type(column.element, encoding), True)
    if kind is Kind.DECIMAL:
        if encoding.decimal_handling == "double":
            return DoubleType()
        assert column.precision is not None and column.scale is not None
        return DecimalType(column.precision, column.scale)
    if kind is Kind.DECIMAL_TEXT:
        return DoubleType() if encoding.decimal_handling == "double" else StringType()
    if kind is Kind.INTERVAL:
        return LongType() if encoding.interval_handling == "numeric" else StringType()
    return _SIMPLE_TYPES.get(kind, StringType())


_SIMPLE_TYPES: dict[Kind, DataType] = {
    Kind.BOOL: BooleanType(),
    Kind.INT16: ShortType(),
    Kind.INT32: IntegerType(),
    Kind.INT64: LongType(),
    Kind.FLOAT: DoubleType(),
    Kind.BYTES: BinaryType(),
    Kind.DATE: DateType(),
    Kind.TIME: LongType(),
    Kind.TIMESTAMP: TimestampType(),
    Kind.TIMESTAMPTZ: TimestampType(),
}


def row_schema(columns: tuple[ColumnShape, ...]) -> StructType:
    """The schema ``after`` is parsed with: every column as a string (converted afterwards)."""
    return StructType([StructField(c.name, StringType(), True) for c in columns])


def decode(raw: Column, column: ColumnShape, encoding: Encoding, *, scale: Column | None = None) -> Column:
    """The typed value of ``raw`` (the column's JSON text, null for JSON null); ``scale``: a Decimal's scale
    as the record itself states it (JSON with schemas), else the column's from the catalog."""
    kind = column.kind
    if kind is Kind.ARRAY:
        assert column.element is not None
        element = column.element
        items = F.from_json(raw, ArrayType(StringType(), True))
        return F.transform(items, lambda item: decode(item, element, encoding))
    if kind in (Kind.INT16, Kind.INT32, Kind.INT64, Kind.FLOAT):
        return raw.try_cast(spark_type(column, encoding))  # "NaN", "Infinity", "-Infinity" cast to doubles
    if kind is Kind.BOOL:
        return raw.try_cast(BooleanType())
    if kind is Kind.DECIMAL:
        return _decimal(raw, column, encoding, scale)
    if kind is Kind.DECIMAL_TEXT:
        return _decimal_text(raw, encoding)
    if kind is Kind.BYTES:
        return F.when(_is_base64(raw), F.unbase64(raw))
    if kind is Kind.DATE:
        return _date(raw, encoding)
    if kind is Kind.TIME:
        return _time(raw, column, encoding)
    if kind is Kind.TIMESTAMP:
        return _timestamp(raw, column, encoding)
    if kind is Kind.TIMESTAMPTZ:
        return F.when(~raw.isin("infinity", "-infinity"), raw.try_cast(TimestampType()))
    if kind is Kind.INTERVAL:
        return raw.try_cast(LongType()) if encoding.interval_handling == "numeric" else raw
    return raw  # TEXT, JSON, OTHER: the text as sent


def failed(raw: Column, decoded: Column, column: ColumnShape) -> Column:
    """True where a present value did not convert (an array: any present element)."""
    if column.kind is Kind.ARRAY:
        items = F.from_json(raw, ArrayType(StringType(), True))
        present = F.size(F.filter(items, lambda item: item.isNotNull()))
        converted = F.size(F.filter(decoded, lambda item: item.isNotNull()))
        return raw.isNotNull() & (decoded.isNull() | (present != converted))
    return raw.isNotNull() & decoded.isNull()


# --- numbers -----------------------------------------------------------------


def _is_base64(raw: Column) -> Column:
    """Padded standard base64 (Spark's unbase64 skips characters it does not know, so check first)."""
    return raw.rlike("^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")


def unscaled_decimal_text(b64: Column) -> tuple[Column, Column]:
    """(sign, digits) of a base64 big-endian two's-complement integer of at most 16 bytes.

    Negative values are read through their bitwise complement (``-x = ~x + 1``), so each 64-bit
    half stays a non-negative number that ``conv`` can read. Longer inputs, and 16-byte values
    beyond 38 digits, give null digits.
    """
    hexed = F.hex(F.unbase64(b64))
    negative = F.substring(hexed, 1, 1) >= F.lit("8")
    magnitude_hex = F.lpad(F.when(negative, F.translate(hexed, _HEX, _HEX_NOT)).otherwise(hexed), 32, "0")
    high = F.conv(F.substring(magnitude_hex, 1, 16), 16, 10).cast(DecimalType(38, 0))
    low = F.conv(F.substring(magnitude_hex, 17, 16), 16, 10).cast(DecimalType(38, 0))
    carry = F.when(negative, F.lit(1)).otherwise(F.lit(0))
    magnitude = F.try_add(F.try_add(F.try_multiply(high, F.lit(_TWO_POW_64).cast(DecimalType(38, 0))), low), carry)
    digits = F.when(F.length(hexed) <= 32, magnitude.cast(DecimalType(38, 0)).cast(StringType()))
    return F.when(negative, F.lit("-")).otherwise(F.lit("")), digits


def signed_unscaled_text(b64: Column) -> Column:
    """The signed digits (``-123``) of a base64 big-endian two's-complement integer of at most 16 bytes; null
    beyond. Up to 8 bytes (every unscaled value of a precision up to 18), one ``conv`` of the value sign-extended
    to 64 bits and read as signed (#39: less than half of ``unscaled_decimal_text``'s cost: no complement, no second
    half, no decimal arithmetic); longer, ``unscaled_decimal_text``, its reference."""
    hexed = F.hex(F.unbase64(b64))
    word = F.when(F.substring(hexed, 1, 1) >= F.lit("8"), F.lpad(hexed, 16, "F")).otherwise(F.lpad(hexed, 16, "0"))
    sign, digits = unscaled_decimal_text(b64)
    return F.when(F.length(hexed) <= 16, F.conv(word, 16, -10)).otherwise(F.concat(sign, digits))


def _scientific(signed: Column, scale: int | Column) -> Column:
    """``<signed digits>E-<scale>``: exact when cast to a decimal (Java's BigDecimal parses it)."""
    return F.concat(signed, F.lit("E-"), scale if isinstance(scale, Column) else F.lit(str(scale)))


def _let(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` computed once (a one-element array's transform binds it)."""
    return F.element_at(F.transform(F.array(value), body), 1)


def _plain_text(sign: Column, digits: Column, scale: Column) -> Column:
    """Plain decimal text of an unscaled integer's sign and digits and a (per-row) scale >= 0."""

    def text(pair: Column) -> Column:
        digits_, scale_ = pair["d"], pair["s"]
        padded = F.call_function("lpad", digits_, F.greatest(F.length(digits_), scale_ + 1), F.lit("0"))
        return _let(
            padded,
            lambda p: F.when(
                scale_ > 0,
                F.concat(
                    F.call_function("substring", p, F.lit(1), F.length(p) - scale_),
                    F.lit("."),
                    F.call_function("substring", p, F.length(p) - scale_ + 1, scale_),
                ),
            ).otherwise(p),
        )

    return F.concat(sign, _let(F.struct(digits.alias("d"), scale.alias("s")), text))


def _decimal(raw: Column, column: ColumnShape, encoding: Encoding, scale: Column | None = None) -> Column:
    assert column.precision is not None and column.scale is not None
    target = DecimalType(column.precision, column.scale)
    if encoding.decimal_handling == "double":
        return raw.try_cast(DoubleType())
    if encoding.decimal_handling == "string":
        return raw.try_cast(target)
    signed = signed_unscaled_text(raw)
    if scale is None:
        return F.when(_is_base64(raw), _scientific(signed, column.scale).try_cast(target))
    # The record's own scale (rounded half up to the column's, as PostgreSQL rounded the table, when it shrank)
    exponent = F.coalesce(scale, F.lit(column.scale)).cast(StringType())
    return F.when(_is_base64(raw), _scientific(signed, exponent).try_cast(target))


def _decimal_text(raw: Column, encoding: Encoding) -> Column:
    """Unconstrained numeric: VariableScaleDecimal ``{"scale":s,"value":b64}`` (precise) -> plain text."""
    if encoding.decimal_handling == "double":
        return raw.try_cast(DoubleType())
    if encoding.decimal_handling == "string":
        return raw
    parsed = F.from_json(raw, StructType([StructField("scale", IntegerType()), StructField("value", StringType())]))
    sign, digits = unscaled_decimal_text(parsed["value"])
    return F.when((parsed["scale"] >= 0) & _is_base64(parsed["value"]), _plain_text(sign, digits, parsed["scale"]))


# --- dates and times -----------------------------------------------------------


def _date(raw: Column, encoding: Encoding) -> Column:
    if encoding.time_precision == "iso":  # "2024-05-01Z"
        return F.when(~raw.isin("infinity", "-infinity"), F.try_to_date(F.regexp_replace(raw, "Z$", ""), "yyyy-MM-dd"))
    return F.when(~raw.isin(*_DATE_INFINITIES), F.call_function("date_from_unix_date", raw.try_cast(IntegerType())))


def _clock_micros(text: Column) -> Column:
    """``HH:MM:SS[.ffffff]`` -> microseconds of the day (``24:00:00`` included)."""
    parts = F.split(text, ":")
    hours, minutes = F.get(parts, 0).try_cast(LongType()), F.get(parts, 1).try_cast(LongType())
    seconds = F.get(parts, 2).try_cast(DecimalType(9, 6))
    return F.try_add(
        F.try_add(F.try_multiply(hours, F.lit(3_600_000_000)), F.try_multiply(minutes, F.lit(60_000_000))),
        (seconds * 1_000_000).cast(LongType()),  # at most 999,999,999,999,999: a long
    )


def _time(raw: Column, column: ColumnShape, encoding: Encoding) -> Column:
    if encoding.time_precision == "iso":  # "12:34:56.5Z"
        return _clock_micros(F.regexp_replace(raw, "Z$", ""))
    millis = (column.precision or 6) <= 3
    return F.try_multiply(raw.try_cast(LongType()), F.lit(1000)) if millis else raw.try_cast(LongType())


def _timestamp(raw: Column, column: ColumnShape, encoding: Encoding) -> Column:
    if encoding.time_precision == "iso":  # "2024-05-01T12:34:56.5Z"
        return F.when(~raw.isin("infinity", "-infinity"), raw.try_cast(TimestampType()))
    # timestamp_millis raises on a long overflow (ANSI or not): multiply first, null when it overflows
    micros = raw.try_cast(LongType())
    if (column.precision or 6) <= 3:
        micros = F.try_multiply(micros, F.lit(1000))
    return F.when(~raw.isin(*_TIMESTAMP_INFINITIES), F.call_function("timestamp_micros", micros))
