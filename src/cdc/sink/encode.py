"""Value encoders: a column's typed value (as ``cdc.values`` defines it) -> what JSON or Avro writes for
its Connect schema (``cdc.sink.typemap`` says which encoder a column gets and why).
"""

from __future__ import annotations

import binascii
import functools
import math
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

import orjson

from cdc.sink.connect import Encoder
from cdc.sink.errors import SerializationError
from cdc.values import Infinity, Interval, Point, TimeTz

INT32_MAX: Final = 2**31 - 1
_INT32_MIN: Final = -(2**31)
_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)
_TIMESTAMP_POSITIVE_INFINITY: Final = 9223372036825200000
_TIMESTAMP_NEGATIVE_INFINITY: Final = -9223372036832400000
_US_PER_DAY: Final = 86_400_000_000
_US_PER_MONTH: Final = 2_629_800_000_000  # 365.25 / 12 days, exactly
_INF: Final = math.inf
_WKB_POINT: Final = struct.Struct("<BIdd")


def b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def json_float(value: float) -> float | str:
    if value != value:
        return "NaN"
    if value == _INF:
        return "Infinity"
    if value == -_INF:
        return "-Infinity"
    return value


def twos_complement(n: int) -> bytes:
    """Java's BigInteger.toByteArray(): minimal big-endian two's complement."""
    length = (n.bit_length() if n >= 0 else (~n).bit_length()) // 8 + 1
    return n.to_bytes(length, "big", signed=True)


def _special_decimal(where: str, value: Decimal, fmt: str) -> SerializationError:
    return SerializationError(
        f"{where}: numeric value {value} cannot be written with decimal_handling='precise' "
        "(a Kafka Connect Decimal has no NaN or Infinity); set decimal_handling='string' "
        f"(or 'double') in the {fmt} settings"
    )


def fixed_decimal_bytes(scale: int, where: str, fmt: str) -> Callable[[Decimal], bytes]:
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
        return twos_complement(unscaled)

    return encode


def fixed_decimal(scale: int, where: str) -> Encoder:
    unscaled = fixed_decimal_bytes(scale, where, "JSON")

    def encode(value: Decimal) -> str:
        return b64(unscaled(value))

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
        return scale, twos_complement(unscaled)

    return encode


def variable_decimal(where: str) -> Encoder:
    parts = _variable_decimal_parts(where, "JSON")

    def encode(value: Decimal) -> dict[str, Any]:
        scale, unscaled = parts(value)
        return {"scale": scale, "value": b64(unscaled)}

    return encode


def variable_decimal_avro(where: str) -> Encoder:
    parts = _variable_decimal_parts(where, "Avro")

    def encode(value: Decimal) -> dict[str, Any]:
        scale, unscaled = parts(value)
        return {"scale": scale, "value": unscaled}

    return encode


def plain_decimal(value: Decimal) -> str:
    return format(value, "f")


def double_decimal(value: Decimal) -> float | str:
    return json_float(float(value))


def bytea(value: bytes) -> str:
    return b64(value)


def hstore(value: dict[str, str | None]) -> str:
    return orjson.dumps(value).decode()


def point(value: Point) -> dict[str, Any]:
    return {
        "x": json_float(value.x),
        "y": json_float(value.y),
        "wkb": b64(_WKB_POINT.pack(1, 1, value.x, value.y)),
        "srid": None,
    }


def point_avro(value: Point) -> dict[str, Any]:
    return {"x": value.x, "y": value.y, "wkb": _WKB_POINT.pack(1, 1, value.x, value.y), "srid": None}


def bit_bool(value: str) -> bool:
    return "1" in value


def bits_bytes(value: str) -> bytes:
    n = int(value, 2) if value else 0
    return n.to_bytes((n.bit_length() + 7) // 8, "little")


def bits(value: str) -> str:
    return b64(bits_bytes(value))


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


def date_days(value: int | Infinity) -> int:
    if type(value) is int:
        return value
    return INT32_MAX if value is Infinity.POSITIVE else _INT32_MIN


def date_iso(value: int | Infinity) -> str:
    if type(value) is int:
        return _date_text(value) + "Z"
    assert isinstance(value, Infinity)
    return value.value


def time_ms(value: int) -> int:
    return value // 1000


def time_iso(value: int) -> str:
    return _clock_text(value, None) + "Z"


def timestamp_ms(value: int | Infinity) -> int:
    if type(value) is int:
        return value // 1000
    return _TIMESTAMP_POSITIVE_INFINITY if value is Infinity.POSITIVE else _TIMESTAMP_NEGATIVE_INFINITY


def timestamp_us(value: int | Infinity) -> int:
    if type(value) is int:
        return value
    return _TIMESTAMP_POSITIVE_INFINITY if value is Infinity.POSITIVE else _TIMESTAMP_NEGATIVE_INFINITY


def timestamp_iso(value: int | Infinity) -> str:
    if type(value) is int:
        return _timestamp_text(value, None)
    assert isinstance(value, Infinity)
    return value.value


def zoned_timestamp(width: int) -> Encoder:
    def encode(value: int | Infinity) -> str:
        if type(value) is int:
            return _timestamp_text(value, width)
        assert isinstance(value, Infinity)
        return value.value

    return encode


def zoned_time(value: TimeTz) -> str:
    utc = value.microseconds - value.utc_offset_seconds * 1_000_000
    if utc != _US_PER_DAY:  # 24:00:00+00 stays 24:00:00Z
        utc %= _US_PER_DAY
    return _clock_text(utc, None) + "Z"


def offset_time(value: TimeTz) -> str:
    """An injective timetz text for keys: the local time and its own offset (``12:00:00+05:30``)."""
    offset = value.utc_offset_seconds
    sign = "-" if offset < 0 else "+"
    hours, rest = divmod(abs(offset), 3600)
    minutes, seconds = divmod(rest, 60)
    suffix = f"{sign}{hours:02d}:{minutes:02d}" + (f":{seconds:02d}" if seconds else "")
    return _clock_text(value.microseconds, None) + suffix


def _is_infinite_interval(value: Interval) -> int:
    """1 for PostgreSQL 17's +infinity interval, -1 for -infinity, else 0."""
    if value.months == INT32_MAX and value.days == INT32_MAX and value.microseconds == _INT64_MAX:
        return 1
    if value.months == _INT32_MIN and value.days == _INT32_MIN and value.microseconds == _INT64_MIN:
        return -1
    return 0


def interval_micros(value: Interval) -> int:
    infinite = _is_infinite_interval(value)
    if infinite:
        return _INT64_MAX if infinite > 0 else _INT64_MIN
    return value.months * _US_PER_MONTH + value.days * _US_PER_DAY + value.microseconds


def interval_iso(value: Interval) -> str:
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
