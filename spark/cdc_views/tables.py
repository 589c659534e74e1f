"""What a captured table looks like to the jobs: its columns, their kinds, and how the connector wrote them.

The record values carry no types (JSON without the schema block), so the column types come from
the source database's catalog, the same authority the connector used: ``read_shapes(dsn, tables)``.
``Encoding`` holds the connector's settings that change how a value is written (``format``, and
``decimal_handling``, ``time_precision``, ``interval_handling`` of its ``json`` or ``avro``
section, ``json.schemas_enable``); jobs must be given the same settings as the connector.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import psycopg


class Kind(enum.Enum):
    """How a column's values are decoded and compared, whatever its PostgreSQL type name."""

    BOOL = "bool"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT = "float"  # float4 and float8, both as Spark doubles
    DECIMAL = "decimal"  # numeric(p, s) with 0 <= s <= p <= 38, money: Spark decimal(p, s)
    DECIMAL_TEXT = "decimal_text"  # unconstrained numeric (or one Spark cannot hold): plain decimal text
    TEXT = "text"  # text types, uuid, enums, inet, ranges, xml: the text as sent
    JSON = "json"  # json, jsonb: the JSON text as sent
    BYTES = "bytes"
    DATE = "date"
    TIME = "time"  # time without time zone: microseconds of the day
    TIMESTAMP = "timestamp"  # without time zone: the wall clock, stored as a UTC instant
    TIMESTAMPTZ = "timestamptz"
    INTERVAL = "interval"  # numeric handling: microseconds (a month is 365.25/12 days); string: ISO text
    ARRAY = "array"
    OTHER = "other"  # anything else: the JSON text of the value, uncompared types


@dataclass(frozen=True, slots=True)
class Encoding:
    """How the connector wrote the records: its ``format`` and that format's section (``json``/``avro``).

    ``format="avro"``: Confluent wire format, schemas in the registry (``cdc_views.avro``); the
    value settings mean the same as in JSON and ``schemas_enable`` does not apply.
    """

    decimal_handling: Literal["precise", "string", "double"] = "precise"
    time_precision: Literal["adaptive", "iso"] = "adaptive"
    interval_handling: Literal["numeric", "string"] = "numeric"
    schemas_enable: bool = False
    format: Literal["json", "avro"] = "json"
    # what the connector writes for an unchanged TOASTed value (its toast.placeholder; Debezium's
    # unavailable.value.placeholder): the jobs replace it by the key's previous value (cdc_views.toast)
    unavailable_value: str = "__debezium_unavailable_value"


@dataclass(frozen=True, slots=True)
class ColumnShape:
    name: str
    kind: Kind
    type_name: str  # the base type's name, e.g. "int4", "numeric", "_text"
    precision: int | None = None  # DECIMAL; TIME/TIMESTAMP fraction digits
    scale: int | None = None  # DECIMAL
    element: ColumnShape | None = None  # ARRAY
    # a varlena type (pg_type.typlen -1), whose value PostgreSQL may store out of line (TOAST): the only
    # columns where an UPDATE's unchanged value becomes the placeholder. None: not read from a catalog,
    # judged by ``kind`` (``cdc_views.toast.may_hold_placeholder``)
    toastable: bool | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class TableShape:
    schema: str
    name: str
    columns: tuple[ColumnShape, ...]
    key: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def topic(self, prefix: str) -> str:
        """``<prefix>.<schema>.<table>``, with the connector's character rule."""
        raw = f"{prefix}.{self.schema}.{self.name}"
        return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "_" for ch in raw)

    def column(self, name: str) -> ColumnShape:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"table {self.qualified} has no column {name!r}")


class CatalogError(RuntimeError):
    """A table cannot be described from the source database."""


def split_name(qualified: str) -> tuple[str, str]:
    schema, dot, table = qualified.partition(".")
    if not dot or not schema or not table:
        raise CatalogError(f"table {qualified!r} must be schema-qualified, e.g. public.accounts")
    return schema, table


_COLUMNS_SQL = """
SELECT a.attname, a.atttypid, a.atttypmod, t.typlen
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_TYPE_SQL = """
SELECT t.typname, n.nspname, t.typtype, t.typcategory, t.typelem, t.typbasetype, t.typtypmod
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE t.oid = %s
"""

_KEY_SQL = """
SELECT a.attname
FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s::regclass AND (i.indisprimary OR i.indisreplident)
ORDER BY i.indisprimary DESC, k.ord
"""

_BUILTIN_KINDS: dict[str, Kind] = {
    "bool": Kind.BOOL,
    "int2": Kind.INT16,
    "int4": Kind.INT32,
    "int8": Kind.INT64,
    "oid": Kind.INT64,
    "float4": Kind.FLOAT,
    "float8": Kind.FLOAT,
    "bytea": Kind.BYTES,
    "json": Kind.JSON,
    "jsonb": Kind.JSON,
    "date": Kind.DATE,
    "time": Kind.TIME,
    "timestamp": Kind.TIMESTAMP,
    "timestamptz": Kind.TIMESTAMPTZ,
    "interval": Kind.INTERVAL,
    "text": Kind.TEXT,
    "varchar": Kind.TEXT,
    "bpchar": Kind.TEXT,
    "name": Kind.TEXT,
    "char": Kind.TEXT,
    "uuid": Kind.TEXT,
    "xml": Kind.TEXT,
    "inet": Kind.TEXT,
    "cidr": Kind.TEXT,
    "macaddr": Kind.TEXT,
    "macaddr8": Kind.TEXT,
    "citext": Kind.TEXT,
    "ltree": Kind.TEXT,
    "int4range": Kind.TEXT,
    "int8range": Kind.TEXT,
    "numrange": Kind.TEXT,
    "tsrange": Kind.TEXT,
    "tstzrange": Kind.TEXT,
    "daterange": Kind.TEXT,
}


def _numeric_typmod(modifier: int) -> tuple[int, int] | None:
    if modifier < 4:
        return None
    mod = modifier - 4
    return (mod >> 16) & 0xFFFF, ((mod & 0x7FF) ^ 0x400) - 0x400


def _shape(conn: psycopg.Connection[Any], name: str, type_oid: int, modifier: int, depth: int = 0) -> ColumnShape:
    row = conn.execute(_TYPE_SQL, (type_oid,)).fetchone()
    if row is None or depth > 32:
        return ColumnShape(name, Kind.OTHER, str(type_oid))
    typname, nspname, typtype, category, elem, basetype, typtypmod = row
    if typtype == "d":  # a domain: its base type, with the domain's modifier when the column has none
        return _shape(conn, name, basetype, modifier if modifier >= 0 else typtypmod, depth + 1)
    if category == "A" and elem:
        return ColumnShape(name, Kind.ARRAY, typname, element=_shape(conn, name, elem, modifier, depth + 1))
    if typtype == "e":
        return ColumnShape(name, Kind.TEXT, typname)
    if nspname != "pg_catalog" and typname not in ("citext", "ltree", "hstore"):
        return ColumnShape(name, Kind.OTHER, typname)
    if typname in ("numeric", "money"):
        typmod = (19, 2) if typname == "money" else _numeric_typmod(modifier)
        if typmod is not None and 0 <= typmod[1] <= typmod[0] <= 38:
            return ColumnShape(name, Kind.DECIMAL, typname, precision=typmod[0], scale=typmod[1])
        return ColumnShape(name, Kind.DECIMAL_TEXT, typname, scale=typmod[1] if typmod else None)
    if typname in ("time", "timestamp", "timestamptz"):
        return ColumnShape(name, _BUILTIN_KINDS[typname], typname, precision=modifier if 0 <= modifier <= 6 else 6)
    if typname in ("bit", "varbit"):
        return ColumnShape(name, Kind.BOOL if modifier == 1 else Kind.BYTES, typname)
    return ColumnShape(name, _BUILTIN_KINDS.get(typname, Kind.OTHER), typname)


def describe(conn: psycopg.Connection[Any], qualified: str, key: Sequence[str] | None = None) -> TableShape:
    """One table's shape from the catalog; ``key`` overrides the primary key as the connector's ``key`` does."""
    schema, table = split_name(qualified)
    regclass = f'"{schema}"."{table}"'
    try:
        rows = conn.execute(_COLUMNS_SQL, (regclass,)).fetchall()
    except psycopg.errors.UndefinedTable:
        conn.rollback()
        raise CatalogError(f"table {qualified} does not exist in the source database: check the table list") from None
    columns = tuple(
        replace(_shape(conn, attname, typid, typmod), toastable=typlen == -1) for attname, typid, typmod, typlen in rows
    )
    key_columns = tuple(key) if key else tuple(r[0] for r in conn.execute(_KEY_SQL, (regclass,)).fetchall())
    if not key_columns:
        raise CatalogError(f"table {qualified} has no primary key or replica identity index: name its key columns")
    names = {c.name for c in columns}
    unknown = [k for k in key_columns if k not in names]
    if unknown:
        raise CatalogError(f"table {qualified}: key columns {unknown} are not columns of the table")
    return TableShape(schema, table, columns, key_columns)


def read_shapes(dsn: str, tables: Sequence[str], keys: dict[str, Sequence[str]] | None = None) -> dict[str, TableShape]:
    """The shapes of the tables (``schema.table``), in the order given."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {name: describe(conn, name, (keys or {}).get(name)) for name in tables}
