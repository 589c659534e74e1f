"""Python representations of PostgreSQL values that have no exact built-in Python type.

The decoder turns every column into one of these (or a plain Python value, see
``cdc.decoder.types``); the sink turns them into the wire format. Both sides
import only this module, never each other.

Value contract (what a column of each type holds in a ChangeEvent):

===========================  ==============================================
PostgreSQL type              Python value
===========================  ==============================================
bool                         bool
int2, int4, int8, oid        int
float4, float8               float (nan, inf and -inf included)
numeric, money               decimal.Decimal (NaN, Infinity, -Infinity included)
text, varchar, bpchar, name  str
bytea                        bytes
uuid                         uuid.UUID
json, jsonb, xml             str (the server's text)
date                         int days since 1970-01-01, or Infinity
timestamp                    int microseconds since 1970-01-01 (as if UTC), or Infinity
timestamptz                  int microseconds since 1970-01-01 UTC, or Infinity
time                         int microseconds since midnight
timetz                       TimeTz
interval                     Interval
inet, cidr, macaddr(8)       str
bit, varbit                  str of '0' and '1'
ranges, geometric but point  str (the server's text)
point                        Point
hstore                       dict[str, str | None]
enum                         str (the label)
domain                       the value of its base type
array                        list (nested for several dimensions; None for NULL)
anything else                str (the server's text), column type kind UNKNOWN
unchanged TOAST              UNCHANGED_TOAST (never a real value)
===========================  ==============================================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Infinity(enum.Enum):
    """``infinity`` / ``-infinity`` of date, timestamp and timestamptz."""

    POSITIVE = "infinity"
    NEGATIVE = "-infinity"


@dataclass(frozen=True, slots=True)
class Interval:
    """An interval as PostgreSQL stores it: months, days and microseconds kept apart."""

    months: int
    days: int
    microseconds: int


@dataclass(frozen=True, slots=True)
class TimeTz:
    """A time of day with its UTC offset (seconds east of UTC)."""

    microseconds: int
    utc_offset_seconds: int


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float


class _UnchangedToast:
    """Marks a TOASTed column that an UPDATE left unchanged; its value was not sent."""

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = _UnchangedToast()
