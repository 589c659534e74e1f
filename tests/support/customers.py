"""The customers table of the serializer tests (Debezium's note example) and Alice's row in it, before and
after her update."""

from __future__ import annotations

from decimal import Decimal

from cdc.event import Column, PgType, TableSchema

COMMIT_US = 1714566896789012


def T(oid: int, name: str) -> PgType:
    return PgType(oid, name)


INT4, INT8, TEXT = T(23, "int4"), T(20, "int8"), T(25, "text")


NUMERIC, TSTZ = T(1700, "numeric"), T(1184, "timestamptz")


def numeric_mod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


CUSTOMERS = TableSchema(
    "public",
    "customers",
    (
        Column("id", INT4, key=True, nullable=False),
        Column("name", TEXT),
        Column("balance", NUMERIC, modifier=numeric_mod(10, 2)),
        Column("updated_at", TSTZ),
    ),
    replica_identity="f",
)


ALICE_BEFORE = {"id": 1, "name": "Alice", "balance": Decimal("1000.00"), "updated_at": 1714467600_000000}


ALICE_AFTER = {"id": 1, "name": "Alice", "balance": Decimal("1234.56"), "updated_at": COMMIT_US}
