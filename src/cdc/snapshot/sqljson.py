"""Snapshot rows as JSON text built by the server: the per-row work of the initial snapshot moved into the COPY.

Reading a chunk the ordinary way costs Python tens of microseconds per row (parse the COPY line into
typed values, build the event, encode it, serialize the envelope; bench/README.md, "Figures behind the
code's choices").
For tables whose every column has a type in the list below, and the JSON
format, the chunk's ``COPY (SELECT ...)`` instead returns per row the key
object and the ``after`` object already as Debezium's JSON (``'{"id":' ||
id || ...``), and the worker only splices them between the envelope's constant
parts (``cdc.sink.json.ReadParts``) and produces.

Each SQL encoding writes the same JSON value as the column's Python encoder in
``cdc.sink.json`` (the integration tests compare both on edge values).
A value outside what an encoding covers (a NaN or infinite numeric, an
infinite or out-of-range date or timestamp) makes the row's JSON NULL and
the row's columns are sent as ordinary COPY text instead: that row takes the
ordinary path, with its conversions and its errors (e.g. a NaN under
``decimal_handling='precise'``). Nothing is approximated.

Not covered (the table takes the ordinary path): the Avro format, column
policies (include/exclude/mask), domains, arrays, composite and range types,
floats, time, timetz, interval, money, bits, geometry, hstore; numerics
without a declared precision or with more than 18 digits; the ``string`` and
``double`` decimal handling and ``iso`` time precision; a database whose
encoding is not UTF8.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from psycopg import sql

from cdc.event import Column, TableSchema, TypeKind
from cdc.sink.json import JsonSettings, ReadParts
from cdc.snapshot.plan import Chunk, SnapshotTable, chunk_where

__all__ = ["JsonQuery", "json_query"]

_TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "name"})
_INT_TYPES = frozenset({"int2", "int4", "int8", "oid"})
_MAX_FAST_PRECISION = 18  # the unscaled value of numeric(18, s) fits int8


@dataclass(frozen=True, slots=True)
class _Encoding:
    json: sql.Composable  # the value as JSON text; evaluated only where ``ok`` holds and the value is not NULL
    ok: sql.Composable | None  # None: every value is covered


def _quoted(inner: sql.Composable) -> sql.Composable:
    return sql.SQL("""'"' || {} || '"'""").format(inner)


def _twos_complement_base64(unscaled: sql.Composable) -> sql.Composable:
    """Java's BigInteger.toByteArray() of an int8, base64: the fewest big-endian bytes that keep the sign."""
    steps = [
        sql.SQL("WHEN {u} BETWEEN {lo} AND {hi} THEN {n}").format(
            u=unscaled, lo=sql.Literal(-(2 ** (8 * n - 1))), hi=sql.Literal(2 ** (8 * n - 1) - 1), n=sql.Literal(9 - n)
        )
        for n in range(1, 8)
    ]
    start = sql.SQL("CASE {} ELSE 1 END").format(sql.SQL(" ").join(steps))
    return sql.SQL("encode(substring(int8send({}) FROM {}), 'base64')").format(unscaled, start)


def _encoding(column: Column, settings: JsonSettings) -> _Encoding | None:
    """The SQL that writes this column's JSON value as ``cdc.sink.json`` does, or None when there is none."""
    c = sql.Identifier(column.name)
    t = column.type
    if t.kind is TypeKind.ENUM:
        return _Encoding(sql.SQL("to_json({}::text)::text").format(c), None)
    if t.kind is not TypeKind.BASE or t.schema != "pg_catalog":
        return None
    name = t.name
    if name == "bool":
        return _Encoding(sql.SQL("CASE WHEN {c} THEN 'true' WHEN NOT {c} THEN 'false' END").format(c=c), None)
    if name in _INT_TYPES:
        return _Encoding(sql.SQL("{}::text").format(c), None)
    if name in _TEXT_TYPES:
        return _Encoding(sql.SQL("to_json({})::text").format(c), None)
    if name in ("json", "jsonb"):
        return _Encoding(sql.SQL("to_json({}::text)::text").format(c), None)
    if name == "uuid":
        return _Encoding(_quoted(sql.SQL("{}::text").format(c)), None)
    if name == "bytea":
        return _Encoding(_quoted(sql.SQL("translate(encode({}, 'base64'), E'\\n', '')").format(c)), None)
    if name == "numeric" and settings.decimal_handling == "precise":
        if column.modifier < 4:
            return None  # no declared precision: VariableScaleDecimal
        mod = column.modifier - 4
        precision, scale = (mod >> 16) & 0xFFFF, ((mod & 0x7FF) ^ 0x400) - 0x400  # as cdc.sink.typemap reads it
        if not 0 <= scale <= precision <= _MAX_FAST_PRECISION:
            return None
        unscaled = sql.SQL("({} * {})::int8").format(c, sql.Literal(10**scale))
        bound = sql.Literal(10 ** (precision - scale))
        return _Encoding(_quoted(_twos_complement_base64(unscaled)), sql.SQL("abs({}) < {}").format(c, bound))
    adaptive = settings.time_precision == "adaptive"
    in_range = sql.SQL("{c} >= {lo} AND {c} < {hi}")
    if name == "timestamptz":
        width = column.modifier if 0 <= column.modifier <= 6 else 6
        fmt = 'YYYY-MM-DD"T"HH24:MI:SS' + (".US" if width else "")
        text = sql.SQL("to_char({} AT TIME ZONE 'UTC', {})").format(c, sql.Literal(fmt))
        if 0 < width < 6:
            text = sql.SQL("left({}, {})").format(text, sql.Literal(20 + width))
        lo, hi = sql.Literal("0001-01-01 00:00:00+00"), sql.Literal("10000-01-01 00:00:00+00")
        return _Encoding(
            _quoted(sql.SQL("{} || 'Z'").format(text)),
            in_range.format(c=c, lo=sql.SQL("{}::timestamptz").format(lo), hi=sql.SQL("{}::timestamptz").format(hi)),
        )
    if name == "timestamp" and adaptive:
        width = column.modifier if 0 <= column.modifier <= 6 else 6
        factor = 1000 if width <= 3 else 1_000_000  # io.debezium.time.Timestamp (ms) or MicroTimestamp (µs)
        value = sql.SQL("floor(extract(epoch FROM {}) * {})::int8::text").format(c, sql.Literal(factor))
        return _Encoding(value, sql.SQL("isfinite({})").format(c))
    if name == "date" and adaptive:
        return _Encoding(sql.SQL("({} - DATE '1970-01-01')::text").format(c), sql.SQL("isfinite({})").format(c))
    return None


@dataclass(frozen=True, slots=True)
class JsonQuery:
    """How to read a table's chunks with server-built JSON: the COPY's fields per row are the key object,
    the ``after`` object (both NULL for a row the SQL does not cover) and then every column, NULL unless
    the row is not covered."""

    table: SnapshotTable
    parts: ReadParts
    select_list: sql.Composable

    def copy(self, chunk: Chunk) -> sql.Composed:
        relation = sql.Identifier(self.table.schema.schema, self.table.schema.name)
        return sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(
            self.select_list, relation, chunk_where(self.table, chunk)
        )


def json_query(table: SnapshotTable, parts: ReadParts, settings: JsonSettings) -> JsonQuery | None:
    """The server-built JSON reading of ``table``, or None when some column has no SQL encoding."""
    schema: TableSchema = table.schema
    if parts.columns != tuple(c.name for c in schema.columns) or not parts.key_columns:
        return None
    encodings: dict[str, _Encoding] = {}
    for column in schema.columns:
        encoding = _encoding(column, settings)
        if encoding is None:
            return None
        encodings[column.name] = encoding
    checks = []
    for column in schema.columns:
        ok = encodings[column.name].ok
        if ok is not None:
            checks.append(sql.SQL("({} IS NULL OR ({}))").format(sql.Identifier(column.name), ok))
    covered: sql.Composable = sql.SQL(" AND ").join(checks) if checks else sql.SQL("TRUE")

    def members(names: tuple[str, ...]) -> sql.Composable:
        pieces: list[sql.Composable] = []
        for i, name in enumerate(names):
            label = ("{" if i == 0 else ",") + orjson.dumps(name).decode() + ":"
            value = sql.SQL("coalesce({}, 'null')").format(encodings[name].json)
            pieces.append(sql.SQL("{} || {}").format(sql.Literal(label), value))
        return sql.SQL("{} || '}}'").format(sql.SQL(" || ").join(pieces))

    fields: list[sql.Composable] = [
        sql.SQL("CASE WHEN {} THEN {} END").format(covered, members(parts.key_columns)),
        sql.SQL("CASE WHEN {} THEN {} END").format(covered, members(parts.columns)),
    ]
    fields.extend(
        sql.SQL("CASE WHEN NOT ({}) THEN {} END").format(covered, sql.Identifier(c.name)) for c in schema.columns
    )
    return JsonQuery(table, parts, sql.SQL(", ").join(fields))
