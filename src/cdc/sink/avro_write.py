"""Avro binary writers compiled once per registered schema, for the schemas ``cdc.sink.avro`` makes.

``fastavro.schemaless_writer`` interprets the schema on every call, per field, so one change event's
envelope (its ``source`` block alone has 16 fields) costs tens of microseconds (bench/README.md, "Figures
behind the code's choices"). A writer compiled
here is a tree of closures made once per schema, and the envelope's ``source`` block, the same
for every event of a transaction but for its LSN, can be spliced in already encoded
(``Encoded``). The bytes are exactly fastavro's (``tests/unit/test_avro_write.py`` compares them
on random schemas and data); fastavro stays the reference, and ``cdc.sink.avro`` falls back to
it whenever a compiled writer raises, so that a datum that does not fit gets fastavro's error.

Covered: the schema subset ``avro_schema`` emits: records (named, referenced by full name once
defined), unions of null and one type (either order), arrays, and the primitives null, boolean,
int, long, float, double, bytes and string (logical types are annotations over these: the
encoders hand over physical values). Anything else raises ``Unsupported`` at compile time.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

Write = Callable[[Any], bytes]

_PACK_FLOAT: Final = struct.Struct("<f").pack
_PACK_DOUBLE: Final = struct.Struct("<d").pack
_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1
_SMALL: Final = tuple(bytes(((n << 1) ^ (n >> 63),)) for n in range(-64, 64))  # one byte each
COMPILED_ERRORS: Final = (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError)
"""What a compiled writer raises for a datum that does not fit its schema."""


class Unsupported(ValueError):
    """A schema construct outside the subset this module compiles."""


class Encoded:
    """A record field's value already in Avro binary, spliced in as it is. ``datum()`` is the value it
    encodes, for fastavro when the compiled writer is not used: ``value``, or made by ``make`` then."""

    __slots__ = ("data", "_value", "_make")

    def __init__(self, data: bytes, value: Any = None, make: Callable[[], Any] | None = None) -> None:
        self.data = data
        self._value = value
        self._make = make

    def datum(self) -> Any:
        return self._make() if self._make is not None else self._value


# Zig-zag varints by 14-bit chunks from two tables instead of a loop per 7 bits: a long of 40 to 64
# bits (timestamps in µs and ns, LSNs: several in every change event's envelope) takes 3-5 lookups
# instead of 6-10 rounds of a Python loop. _CONT[c]: chunk c as two bytes, both continued; _LAST[c]:
# chunk c as the varint's end (one byte below 128, else two).
_CHUNK: Final = 1 << 14
_MASK: Final = _CHUNK - 1
_CONT: Final = tuple(bytes(((c & 0x7F) | 0x80, (c >> 7) | 0x80)) for c in range(_CHUNK))
_LAST: Final = tuple(bytes((c,)) if c < 0x80 else bytes(((c & 0x7F) | 0x80, c >> 7)) for c in range(_CHUNK))


def write_long(n: int) -> bytes:
    """Zig-zag varint, as Avro writes int and long."""
    if -64 <= n < 64:
        return _SMALL[n + 64]
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise OverflowError(f"{n} does not fit an Avro long")
    z = (n << 1) ^ (n >> 63)  # 0 <= z < 2**64
    if z < _CHUNK:
        return _LAST[z]
    cont, last = _CONT, _LAST
    if z < 1 << 28:
        return cont[z & _MASK] + last[z >> 14]
    if z < 1 << 42:
        return cont[z & _MASK] + cont[(z >> 14) & _MASK] + last[z >> 28]
    if z < 1 << 56:
        return cont[z & _MASK] + cont[(z >> 14) & _MASK] + cont[(z >> 28) & _MASK] + last[z >> 42]
    return cont[z & _MASK] + cont[(z >> 14) & _MASK] + cont[(z >> 28) & _MASK] + cont[(z >> 42) & _MASK] + last[z >> 56]


def _write_int(n: Any) -> bytes:
    if type(n) is bool or not isinstance(n, int) or not _INT_MIN <= n <= _INT_MAX:
        raise TypeError(f"{n!r} is not an Avro int")
    return write_long(n)


def _write_long(n: Any) -> bytes:
    if type(n) is bool or not isinstance(n, int):
        raise TypeError(f"{n!r} is not an Avro long")
    return write_long(n)  # raises OverflowError outside 64 bits


def _write_boolean(v: Any) -> bytes:
    if v is True:
        return b"\x01"
    if v is False:
        return b"\x00"
    raise TypeError(f"{v!r} is not an Avro boolean")


def _write_float(v: Any) -> bytes:
    if type(v) is not float and type(v) is not int:
        raise TypeError(f"{v!r} is not an Avro float")
    return _PACK_FLOAT(v)


def _write_double(v: Any) -> bytes:
    if type(v) is not float and type(v) is not int:
        raise TypeError(f"{v!r} is not an Avro double")
    return _PACK_DOUBLE(v)


def _write_bytes(v: Any) -> bytes:
    if type(v) is not bytes:
        raise TypeError(f"{v!r} is not Avro bytes")
    return write_long(len(v)) + v


def _write_string(v: Any) -> bytes:
    if type(v) is not str:
        raise TypeError(f"{v!r} is not an Avro string")
    data = v.encode()
    return write_long(len(data)) + data


def _write_null(v: Any) -> bytes:
    if v is not None:
        raise TypeError(f"{v!r} is not an Avro null")
    return b""


_PRIMITIVES: Final[dict[str, Write]] = {
    "null": _write_null,
    "boolean": _write_boolean,
    "int": _write_int,
    "long": _write_long,
    "float": _write_float,
    "double": _write_double,
    "bytes": _write_bytes,
    "string": _write_string,
}


class _Compiler:
    def __init__(self) -> None:
        self.records: dict[str, Callable[[Any], bytes]] = {}
        self.fields: dict[str, list[tuple[str, Write]]] = {}

    def compile(self, schema: Any, namespace: str = "") -> Write:
        if isinstance(schema, str):
            primitive = _PRIMITIVES.get(schema)
            if primitive is not None:
                return primitive
            full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            record = self.records.get(full)
            if record is None:
                raise Unsupported(f"a reference to {schema!r}, which is not defined before it")
            return record
        if isinstance(schema, list):
            return self._union(schema, namespace)
        if not isinstance(schema, dict):
            raise Unsupported(f"schema {schema!r}")
        kind = schema.get("type")
        if kind == "record":
            return self._record(schema, namespace)
        if kind == "array":
            return self._array(self.compile(schema["items"], namespace))
        if isinstance(kind, str) and kind in _PRIMITIVES:
            return _PRIMITIVES[kind]  # logicalType and connect.* properties annotate the physical type
        raise Unsupported(f"schema type {kind!r}")

    def _union(self, branches: list[Any], namespace: str) -> Write:
        if len(branches) != 2 or "null" not in branches:
            raise Unsupported(f"union {branches!r}: only null and one other type")
        null_index = branches.index("null")
        other = self.compile(branches[1 - null_index], namespace)
        null = write_long(null_index)
        tag = write_long(1 - null_index)

        def write(v: Any) -> bytes:
            if v is None:
                return null
            if type(v) is tuple:  # fastavro's (record name, value) notation
                v = v[1]
            if type(v) is Encoded:
                return tag + v.data
            return tag + other(v)

        return write

    @staticmethod
    def _array(item: Write) -> Write:
        def write(values: Any) -> bytes:
            if type(values) is not list:
                raise TypeError(f"{values!r} is not an Avro array")
            if not values:
                return b"\x00"
            return write_long(len(values)) + b"".join([item(v) for v in values]) + b"\x00"

        return write

    def _record(self, schema: dict[str, Any], namespace: str) -> Write:
        name = schema["name"]
        space = schema.get("namespace", namespace if "." not in name else "")
        full = name if "." in name else (f"{space}.{name}" if space else name)
        inner = full.rpartition(".")[0]
        fields: list[tuple[str, Write]] = []
        built: list[Write] = []

        def write(record: Any) -> bytes:
            return built[0](record)

        self.records[full] = write  # before the fields: a field may refer to the record itself
        for field in schema["fields"]:
            fields.append((field["name"], self.compile(field["type"], inner)))
        self.fields[full] = fields
        built.append(_record_writer(fields))
        return write


def _record_writer(fields: list[tuple[str, Write]]) -> Write:
    """A record: its fields' encodings in order; a field holding ``Encoded`` is spliced as it is."""

    def write(record: Any) -> bytes:
        if type(record) is tuple:
            record = record[1]
        out = []
        for name, field in fields:
            value = record[name]
            out.append(value.data if type(value) is Encoded else field(value))
        return b"".join(out)

    return write


def compile_writer(schema: Any) -> tuple[Write, dict[str, list[tuple[str, Write]]]]:
    """The writer of ``schema`` (datum -> Avro binary, no wire prefix), and each record's field writers by
    full name (to encode parts of a record ahead, e.g. the envelope's ``source``)."""
    compiler = _Compiler()
    return compiler.compile(schema), compiler.fields
