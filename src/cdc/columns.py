"""Which columns a table publishes, and masked how: a pure transform between decoder and serializer.

Applied only to tables whose configuration asks for it; the others pass
through untouched. The published schema changes with it: excluded columns are
gone, masked ones are text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from cdc.config import TableConfig
from cdc.event import AnyRow, ChangeEvent, Column, PgType, Row, TableSchema
from cdc.values import UNCHANGED_TOAST

TEXT = PgType(25, "text")


class ColumnPolicyError(ValueError):
    pass


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    return str(value)


class ColumnPolicy:
    """include / exclude / mask for one table."""

    def __init__(self, table: TableConfig, fixed_value: str, salt: str | None) -> None:
        self._name = table.qualified
        self._include = set(table.columns) if table.columns is not None else None
        self._exclude = set(table.exclude_columns)
        self._masks: dict[str, Callable[[Any], Any]] = {}
        salt_bytes = (salt or "").encode()

        def fixed(_value: Any) -> str:
            return fixed_value

        def salted_hash(value: Any) -> str:
            return hashlib.sha256(salt_bytes + _text(value).encode()).hexdigest()

        for column, how in table.mask.items():
            self._masks[column] = fixed if how == "fixed" else salted_hash
        self._schemas: dict[int, tuple[TableSchema, TableSchema]] = {}

    def check(self, columns: Iterable[str]) -> None:
        """Every configured column name exists in the table."""
        existing = set(columns)
        named = (self._include or set()) | self._exclude | set(self._masks)
        unknown = sorted(named - existing)
        if unknown:
            raise ColumnPolicyError(
                f"tables[{self._name}] names columns it does not have: {', '.join(unknown)}. "
                "Fix: correct the names in columns / exclude_columns / mask."
            )

    def _keep(self, column: Column) -> bool:
        if column.key:
            return True
        if column.name in self._exclude:
            return False
        return self._include is None or column.name in self._include

    def schema(self, table: TableSchema) -> TableSchema:
        cached = self._schemas.get(id(table))
        if cached is not None and cached[0] is table:
            return cached[1]
        columns = tuple(
            Column(c.name, TEXT, -1, c.key, c.nullable) if c.name in self._masks else c
            for c in table.columns
            if self._keep(c)
        )
        out = TableSchema(table.schema, table.name, columns, table.relation_id, table.replica_identity)
        self._schemas[id(table)] = (table, out)
        return out

    def _row(self, schema: TableSchema, row: AnyRow | None) -> Row | None:
        if row is None:
            return None
        masks = self._masks
        out: Row = {}
        for c in schema.columns:
            if c.name not in row:
                continue
            value = row[c.name]
            mask = masks.get(c.name)
            if mask is not None and value is not None and value is not UNCHANGED_TOAST:
                value = mask(value)
            out[c.name] = value
        return out

    def apply(self, event: ChangeEvent) -> ChangeEvent:
        schema = self.schema(event.table)
        kept = {c.name for c in schema.columns}
        return ChangeEvent(
            event.op,
            schema,
            self._row(schema, event.before),
            self._row(schema, event.after),
            event.commit_lsn,
            event.lsn,
            event.xid,
            event.ordinal,
            event.commit_ts_us,
            event.snapshot,
            frozenset(n for n in event.unchanged if n in kept),
        )


def policies(tables: Iterable[TableConfig], fixed_value: str, salt: str | None) -> dict[str, ColumnPolicy]:
    """A policy for each table that restricts or masks columns; tables not listed publish everything."""
    return {
        t.qualified: ColumnPolicy(t, fixed_value, salt)
        for t in tables
        if t.columns is not None or t.exclude_columns or t.mask
    }
