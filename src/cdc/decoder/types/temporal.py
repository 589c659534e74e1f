"""Parsers of dates, times, timestamps and intervals (DateStyle ISO, IntervalStyle postgres).

Dates are days and timestamps microseconds since 1970-01-01 (``int``), or ``Infinity``;
times are microseconds since midnight; see ``cdc.values`` for the contract.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Final

from cdc.values import Infinity, Interval, TimeTz

__all__ = [
    "INTERVAL_INFINITY",
    "INTERVAL_NEG_INFINITY",
    "parse_date",
    "parse_interval",
    "parse_time",
    "parse_timestamp",
    "parse_timestamptz",
    "parse_timetz",
]

INTERVAL_INFINITY: Final = Interval(months=2**31 - 1, days=2**31 - 1, microseconds=2**63 - 1)
"""``'infinity'::interval`` (PostgreSQL 17+), as PostgreSQL stores it."""
INTERVAL_NEG_INFINITY: Final = Interval(months=-(2**31), days=-(2**31), microseconds=-(2**63))
"""``'-infinity'::interval`` (PostgreSQL 17+), as PostgreSQL stores it."""

_DAYS_IN_MONTH: Final = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is 0)."""
    if not 1 <= month <= 12 or not 1 <= day <= _DAYS_IN_MONTH[month]:
        raise ValueError(f"no such date: {year}-{month}-{day}")
    if month == 2 and day == 29 and not (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)):
        raise ValueError(f"no such date: {year}-{month}-{day}")
    # Howard Hinnant's days_from_civil, with Python's floor division.
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


_FRACTION_SCALE: Final = (1, 100000, 10000, 1000, 100, 10, 1)
_US_PER_DAY: Final = 86_400_000_000

_DATE_RE: Final = re.compile(rb"([0-9]{4,})-([0-9]{2})-([0-9]{2})( BC)?")
_TIME = rb"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
_OFFSET = rb"([+-])([0-9]{2})(?::([0-9]{2}))?(?::([0-9]{2}))?"
_TIME_RE: Final = re.compile(_TIME)
_TIMETZ_RE: Final = re.compile(_TIME + _OFFSET)
_TIMESTAMP_RE: Final = re.compile(rb"([0-9]{4,})-([0-9]{2})-([0-9]{2}) " + _TIME + rb"( BC)?")
_TIMESTAMPTZ_RE: Final = re.compile(rb"([0-9]{4,})-([0-9]{2})-([0-9]{2}) " + _TIME + _OFFSET + rb"( BC)?")


def _infinity(data: bytes) -> Infinity:
    if data == b"infinity":
        return Infinity.POSITIVE
    if data == b"-infinity":
        return Infinity.NEGATIVE
    raise ValueError(data)


def _time_of_day(hour: bytes, minute: bytes, second: bytes, fraction: bytes | None) -> int:
    h, m, s = int(hour), int(minute), int(second)
    us = int(fraction) * _FRACTION_SCALE[len(fraction)] if fraction else 0
    if m > 59 or s > 59 or (h > 23 and not (h == 24 and m == 0 and s == 0 and us == 0)):
        raise ValueError(f"no such time: {h}:{m}:{s}")
    return ((h * 60 + m) * 60 + s) * 1_000_000 + us


def _offset_seconds(sign: bytes, hours: bytes, minutes: bytes | None, seconds: bytes | None) -> int:
    """Seconds east of UTC: ``+05:30`` is 19800."""
    m = int(minutes) if minutes else 0
    s = int(seconds) if seconds else 0
    if m > 59 or s > 59:
        raise ValueError("bad UTC offset")
    total = int(hours) * 3600 + m * 60 + s
    return -total if sign == b"-" else total


def _year(digits: bytes, bc: bytes | None) -> int:
    year = int(digits)
    if year == 0:
        raise ValueError("year 0")
    return 1 - year if bc else year


_EPOCH_ORDINAL: Final = 719163  # date(1970, 1, 1).toordinal()
_EPOCH: Final = datetime(1970, 1, 1)
_EPOCH_UTC: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US: Final = timedelta(microseconds=1)
_DOT: Final = 0x2E


_DIGITS_TO_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_COMMON_PREFIX: Final = b"0000-00-00 00:00:00"


def _common_shape(data: bytes) -> bool:
    """``YYYY-MM-DD HH:MM:SS...`` in years 1000-9999 AD: ``datetime`` parses those in C."""
    return data[:19].translate(_DIGITS_TO_ZERO) == _COMMON_PREFIX and data[0] != 0x30 and not data.endswith(b" BC")


def parse_date(data: bytes) -> int | Infinity:
    if len(data) == 10 and data.translate(_DIGITS_TO_ZERO) == b"0000-00-00" and data[0] != 0x30:
        return date.fromisoformat(data.decode("ascii")).toordinal() - _EPOCH_ORDINAL
    m = _DATE_RE.fullmatch(data)
    if m is None:
        return _infinity(data)
    return _days_from_civil(_year(m[1], m[4]), int(m[2]), int(m[3]))


def parse_time(data: bytes) -> int:
    m = _TIME_RE.fullmatch(data)
    if m is None:
        raise ValueError(data)
    return _time_of_day(m[1], m[2], m[3], m[4])


def parse_timetz(data: bytes) -> TimeTz:
    m = _TIMETZ_RE.fullmatch(data)
    if m is None:
        raise ValueError(data)
    return TimeTz(_time_of_day(m[1], m[2], m[3], m[4]), _offset_seconds(m[5], m[6], m[7], m[8]))


def parse_timestamp(data: bytes) -> int | Infinity:
    n = len(data)
    if _common_shape(data) and (n == 19 or (data[19] == _DOT and 21 <= n <= 26)):
        parsed = datetime.fromisoformat(data.decode("ascii"))
        if parsed.tzinfo is not None:
            raise ValueError(data)
        return (parsed - _EPOCH) // _ONE_US
    m = _TIMESTAMP_RE.fullmatch(data)
    if m is None:
        return _infinity(data)
    days = _days_from_civil(_year(m[1], m[8]), int(m[2]), int(m[3]))
    tod = _time_of_day(m[4], m[5], m[6], m[7])
    if tod >= _US_PER_DAY:
        raise ValueError(data)
    return days * _US_PER_DAY + tod


def _offset_at(data: bytes) -> int:
    """Where a timestamptz's offset starts after ``...:SS[.f{1,6}]`` (0 when the shape is not that)."""
    at = data.find(b"+", 19)
    if at < 0:
        at = data.find(b"-", 19)
    if at == 19 or (21 <= at <= 26 and data[19] == _DOT):
        return at  # datetime.fromisoformat checks the fraction's digits
    return 0


_COLON: Final = 0x3A
_SECONDS_US: Final[dict[bytes, int]] = {b"%02d" % s: s * 1_000_000 for s in range(60)}
_MINUTES_UTC: dict[bytes, int] = {}  # b"YYYY-MM-DD HH:MM" -> microseconds since the epoch, UTC
_MINUTES_UTC_MAX: Final = 65_536
_MINUTE_SHAPE: Final = b"0000-00-00 00:00"


def _minute_utc(prefix: bytes) -> int | None:
    """``YYYY-MM-DD HH:MM`` (years 1000-9999) as microseconds since the epoch; None for another shape."""
    if prefix.translate(_DIGITS_TO_ZERO) != _MINUTE_SHAPE or prefix[0] == 0x30:
        return None
    moment = datetime(int(prefix[:4]), int(prefix[5:7]), int(prefix[8:10]), int(prefix[11:13]), int(prefix[14:16]))
    us = (moment - _EPOCH) // _ONE_US
    if len(_MINUTES_UTC) >= _MINUTES_UTC_MAX:
        _MINUTES_UTC.clear()
    _MINUTES_UTC[prefix] = us
    return us


def parse_timestamptz(data: bytes) -> int | Infinity:
    # The fast path: the replication and snapshot sessions run in UTC, so nearly every value is
    # ``YYYY-MM-DD HH:MM:SS[.f{1,6}]+00``; the minute is looked up, seconds and fraction added.
    n = len(data)
    if n >= 22 and data[n - 3 :] == b"+00" and data[16] == _COLON and (n == 22 or (n >= 24 and data[19] == _DOT)):
        base = _MINUTES_UTC.get(data[:16])
        if base is None:
            base = _minute_utc(data[:16])
        if base is not None:
            us = base + _SECONDS_US[data[17:19]]
            if n == 22:
                return us
            fraction = data[20 : n - 3]
            if len(fraction) <= 6 and fraction.isdigit():
                return us + int(fraction) * _FRACTION_SCALE[len(fraction)]
    return _timestamptz_general(data)


def _timestamptz_general(data: bytes) -> int | Infinity:
    if _common_shape(data) and _offset_at(data) > 0:
        parsed = datetime.fromisoformat(data.decode("ascii"))
        if parsed.tzinfo is None:
            raise ValueError(data)
        return (parsed - _EPOCH_UTC) // _ONE_US
    m = _TIMESTAMPTZ_RE.fullmatch(data)
    if m is None:
        return _infinity(data)
    days = _days_from_civil(_year(m[1], m[12]), int(m[2]), int(m[3]))
    tod = _time_of_day(m[4], m[5], m[6], m[7])
    if tod >= _US_PER_DAY:
        raise ValueError(data)
    offset = _offset_seconds(m[8], m[9], m[10], m[11])
    return days * _US_PER_DAY + tod - offset * 1_000_000


_SIGNED_INT_RE: Final = re.compile(rb"[+-]?[0-9]+")
_INTERVAL_TIME_RE: Final = re.compile(rb"([+-])?([0-9]+):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?")
_INTERVAL_UNITS: Final[dict[bytes, int]] = {
    # unit -> 0 months, 1 days (years are 12 months)
    b"year": 12,
    b"years": 12,
    b"mon": 1,
    b"mons": 1,
    b"day": 0,
    b"days": 0,
}


def parse_interval(data: bytes) -> Interval:
    """IntervalStyle postgres: ``1 year 2 mons -3 days +04:05:06.789``, ``00:00:00``, ``infinity``."""
    if data == b"infinity":
        return INTERVAL_INFINITY
    if data == b"-infinity":
        return INTERVAL_NEG_INFINITY
    tokens = data.split(b" ")
    months = days = micros = 0
    seen_time = False
    i = 0
    n = len(tokens)
    while i < n:
        token = tokens[i]
        if b":" in token:
            m = _INTERVAL_TIME_RE.fullmatch(token)
            if m is None or seen_time or int(m[3]) > 59 or int(m[4]) > 59:
                raise ValueError(data)
            seen_time = True
            fraction = m[5]
            magnitude = ((int(m[2]) * 60 + int(m[3])) * 60 + int(m[4])) * 1_000_000
            if fraction:
                magnitude += int(fraction) * _FRACTION_SCALE[len(fraction)]
            micros = -magnitude if m[1] == b"-" else magnitude
            i += 1
            continue
        if i + 1 >= n:
            raise ValueError(data)
        if _SIGNED_INT_RE.fullmatch(token) is None:
            raise ValueError(data)
        amount = int(token)
        unit = _INTERVAL_UNITS[tokens[i + 1]]
        if unit:
            months += amount * unit
        else:
            days += amount
        i += 2
    return Interval(months, days, micros)
