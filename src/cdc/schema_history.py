"""Schema history: each captured table's column types, and the position from which they hold.

A record written before ``ALTER COLUMN ... TYPE numeric(14,3)`` holds its Decimal at the old scale, and
Debezium JSON without the schema block does not say which. So the daemon publishes every version of a
table's columns to the compacted topic ``<topic_prefix>.__cdc_schema`` (one partition), and readers
take, for a record at position ``(commit LSN, ordinal)`` (its ``cdc.commit_lsn`` and ``cdc.ordinal``
headers), the version with the greatest position at or before it. A record without position headers
(``kafka.position_headers: false``) has no ordinal: its envelope gives ``(commit LSN, LSN)``
(``cdc.sink.position``), and each version also records ``after_lsn``, the LSN of the last change of its
commit before it (0: none), so that within one commit it holds for the records with a greater LSN.

Record key (JSON): ``{"table":"<schema>.<table>","commit_lsn":<int>,"ordinal":<int>}``. Keyed by table
AND position: compaction keeps every version (a key of the table alone would keep only the newest, and a
replay from offset 0 needs them all). Publishing one again gives the same key and value.

Record value (JSON)::

    {"format": 1, "table": "public.orders", "schema": "public", "name": "orders",
     "commit_lsn": 23734416, "ordinal": 1, "position": "0/16A2A90:1", "after_lsn": 0, "relation_id": 16390,
     "columns": [{"name": "total", "type": "numeric", "type_schema": "pg_catalog", "type_oid": 1700,
                  "typmod": 917510, "precision": 14, "scale": 3, "length": null, "key": false,
                  "nullable": true}, ...]}

``precision``/``scale``: ``numeric(p, s)``; ``length``: ``varchar(n)``, ``char(n)``, ``bit(n)``,
``varbit(n)``; ``precision`` also the fraction digits of ``time``/``timestamp``/``interval`` types; null
where the type modifier says nothing. Position ``0/0:0`` covers everything before the table's first
version read from a Relation message (the version the catalog gave at the daemon's first start-up).

Pure: encoding, decoding and the look-up. Kafka I/O is ``cdc.pipeline.history``'s; the Spark jobs read
the topic with ``cdc_views.history``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from cdc.event import Column, TableSchema
from cdc.lsn import Lsn

FORMAT: Final = 1
TOPIC_SUFFIX: Final = "__cdc_schema"
BEGINNING: Final = (0, 0)
"""The position of a version that covers everything before the table's first announced one."""

_NUMERIC: Final = frozenset({"numeric", "_numeric"})
_LENGTH_TYPES: Final = frozenset({"varchar", "bpchar", "bit", "varbit", "_varchar", "_bpchar", "_bit", "_varbit"})
_TIME_TYPES: Final = frozenset(
    {
        "time",
        "timetz",
        "timestamp",
        "timestamptz",
        "interval",
        "_time",
        "_timetz",
        "_timestamp",
        "_timestamptz",
        "_interval",
    }
)

Position = tuple[int, int]
"""(commit LSN, ordinal): where a record sits in the source's commit order."""


class SchemaHistoryError(ValueError):
    """A schema history record that is not what the daemon writes; the message names what is wrong."""


def topic_for(topic_prefix: str) -> str:
    return f"{topic_prefix}.{TOPIC_SUFFIX}"


@dataclass(frozen=True, slots=True)
class ColumnType:
    name: str
    type: str  # pg_type.typname, "numeric", "_int4"
    type_schema: str
    type_oid: int
    typmod: int
    precision: int | None = None
    scale: int | None = None
    length: int | None = None
    key: bool = False
    nullable: bool = True

    @classmethod
    def of(cls, column: Column) -> ColumnType:
        name, mod = column.type.name, column.modifier
        precision = scale = length = None
        if name in _NUMERIC:
            ps = column.precision_scale
            if ps is not None:
                precision, scale = ps
        elif name in _LENGTH_TYPES and mod >= 0:
            length = mod - 4 if name in ("varchar", "bpchar", "_varchar", "_bpchar") else mod
        elif name in _TIME_TYPES and mod >= 0:
            precision = mod & 0xFFFF if name in ("interval", "_interval") else mod
        return cls(
            column.name,
            name,
            column.type.schema,
            column.type.oid,
            mod,
            precision,
            scale,
            length,
            column.key,
            column.nullable,
        )

    @property
    def shape(self) -> tuple[str, int, int]:
        """What decides how a value was written: name, type and modifier."""
        return (self.name, self.type_oid, self.typmod)


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    table: str  # "schema.table"
    position: Position
    columns: tuple[ColumnType, ...]
    relation_id: int = 0
    # within its commit, it holds for the changes with an LSN above this (0: all); None: not recorded
    after_lsn: int | None = None

    @classmethod
    def of(cls, table: TableSchema, position: Position, after_lsn: int | None = None) -> SchemaVersion:
        return cls(
            table.qualified, position, tuple(ColumnType.of(c) for c in table.columns), table.relation_id, after_lsn
        )

    @property
    def shape(self) -> tuple[tuple[str, int, int], ...]:
        return tuple(c.shape for c in self.columns)

    def scales(self) -> dict[str, int]:
        """Each constrained numeric column's scale, by column name."""
        return {c.name: c.scale for c in self.columns if c.scale is not None}

    def key(self) -> bytes:
        return orjson.dumps({"table": self.table, "commit_lsn": self.position[0], "ordinal": self.position[1]})

    def value(self) -> bytes:
        schema, _, name = self.table.partition(".")
        return orjson.dumps(
            {
                "format": FORMAT,
                "table": self.table,
                "schema": schema,
                "name": name,
                "commit_lsn": self.position[0],
                "ordinal": self.position[1],
                "position": f"{Lsn(self.position[0])}:{self.position[1]}",
                **({"after_lsn": self.after_lsn} if self.after_lsn is not None else {}),
                "relation_id": self.relation_id,
                "columns": [
                    {
                        "name": c.name,
                        "type": c.type,
                        "type_schema": c.type_schema,
                        "type_oid": c.type_oid,
                        "typmod": c.typmod,
                        "precision": c.precision,
                        "scale": c.scale,
                        "length": c.length,
                        "key": c.key,
                        "nullable": c.nullable,
                    }
                    for c in self.columns
                ],
            }
        )


def decode(key: bytes | None, value: bytes | None) -> SchemaVersion | None:
    """A schema history record -> its version; None for a tombstone. ``SchemaHistoryError`` when the
    record is not one the daemon writes (or a later format)."""
    if value is None:
        return None
    try:
        data = orjson.loads(value)
        if not isinstance(data, dict):
            raise SchemaHistoryError("the value is not a JSON object")
        if data.get("format") != FORMAT:
            raise SchemaHistoryError(
                f"format {data.get('format')!r}, this reader knows format {FORMAT}: upgrade the reader"
            )
        columns = tuple(_column(c) for c in data["columns"])
        version = SchemaVersion(
            str(data["table"]),
            (_int(data["commit_lsn"]), _int(data["ordinal"])),
            columns,
            _int(data.get("relation_id", 0)),
            _optional_int(data.get("after_lsn")),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, SchemaHistoryError):
            raise
        raise SchemaHistoryError(f"not a schema version ({type(e).__name__}: {e})") from None
    if key is not None and key != version.key():
        raise SchemaHistoryError(f"its key {key[:200]!r} is not its value's table and position")
    return version


def _int(value: Any) -> int:
    if type(value) is not int:
        raise SchemaHistoryError(f"{value!r} is not an integer")
    return value


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _column(data: Mapping[str, Any]) -> ColumnType:
    return ColumnType(
        str(data["name"]),
        str(data["type"]),
        str(data["type_schema"]),
        _int(data["type_oid"]),
        _int(data["typmod"]),
        _optional_int(data.get("precision")),
        _optional_int(data.get("scale")),
        _optional_int(data.get("length")),
        bool(data.get("key", False)),
        bool(data.get("nullable", True)),
    )


@dataclass
class History:
    """Every known version of each table, ordered by position; ``in_force`` looks one up."""

    _positions: dict[str, list[Position]] = field(default_factory=dict)
    _versions: dict[str, list[SchemaVersion]] = field(default_factory=dict)

    @classmethod
    def of(cls, versions: Iterable[SchemaVersion]) -> History:
        history = cls()
        for version in versions:
            history.add(version)
        return history

    def add(self, version: SchemaVersion) -> None:
        """Adds ``version`` (replaces the one at the same position: the record's key is the same)."""
        positions = self._positions.setdefault(version.table, [])
        versions = self._versions.setdefault(version.table, [])
        at = bisect.bisect_left(positions, version.position)
        if at < len(positions) and positions[at] == version.position:
            versions[at] = version
        else:
            positions.insert(at, version.position)
            versions.insert(at, version)

    def in_force(self, table: str, position: Position) -> SchemaVersion | None:
        """The version of ``table`` with the greatest position at or before ``position``; None before the first."""
        return self._last(table, bisect.bisect_right, position)

    def in_force_for(self, table: str, commit_lsn: int, ordinal: int | None, lsn: int) -> SchemaVersion | None:
        """``in_force`` for a record read back from Kafka: by its ordinal when it has one (``cdc.ordinal``), else
        by its LSN, above a version's ``after_lsn`` within the version's own commit; a version without one (from
        before they recorded it) is taken as in force there. The Spark jobs' rule (``cdc_views.history``)."""
        if ordinal is not None:
            return self.in_force(table, (commit_lsn, ordinal))
        found = None
        for version in self._versions.get(table, ()):
            commit, ordinal_from = version.position
            if commit > commit_lsn:
                break
            after = version.after_lsn
            if commit < commit_lsn or ordinal_from == 0 or not after or lsn > after:
                found = version
        return found

    def before(self, table: str, position: Position) -> SchemaVersion | None:
        """The version of ``table`` with the greatest position strictly before ``position``."""
        return self._last(table, bisect.bisect_left, position)

    def _last(
        self, table: str, cut: Callable[[list[Position], Position], int], position: Position
    ) -> SchemaVersion | None:
        at = cut(self._positions.get(table, []), position)
        return self._versions[table][at - 1] if at else None

    def versions(self, table: str) -> Sequence[SchemaVersion]:
        return tuple(self._versions.get(table, ()))

    def tables(self) -> set[str]:
        return {t for t, v in self._versions.items() if v}
