"""The types of captured columns that are not built in (enums, domains, arrays of them, ranges), from pg_type."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import psycopg

from cdc.event import PgType, TypeKind


def load_types(conn: psycopg.Connection[tuple[object, ...]], oids: Iterable[int]) -> dict[int, PgType]:
    """Resolve non-built-in types (enums, domains, arrays of them, ranges) from pg_type, recursively."""
    resolved: dict[int, PgType] = {}
    pending = set(oids)
    rows_by_oid: dict[int, tuple[object, ...]] = {}
    while pending:
        rows = conn.execute(
            """
            SELECT t.oid::int, t.typname, n.nspname, t.typtype, t.typelem::int, t.typbasetype::int,
                   t.typcategory,
                   COALESCE(r.rngsubtype, 0)::int,
                   ARRAY(SELECT enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)
              FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
              LEFT JOIN pg_range r ON r.rngtypid = t.oid
             WHERE t.oid = ANY(%s)
            """,
            (list(pending),),
        ).fetchall()
        pending = set()
        for r in rows:
            oid = int(str(r[0]))
            rows_by_oid[oid] = r
            for dep in (r[4], r[5], r[7]):
                d = int(str(dep))
                if d and d not in rows_by_oid:
                    pending.add(d)

    def build(oid: int) -> PgType:
        if oid in resolved:
            return resolved[oid]
        r = rows_by_oid[oid]
        name, schema, typtype, elem, base, category, subtype, labels = (
            str(r[1]),
            str(r[2]),
            str(r[3]),
            int(str(r[4])),
            int(str(r[5])),
            str(r[6]),
            int(str(r[7])),
            r[8],
        )
        element: PgType | None = None
        if typtype == "e":
            kind = TypeKind.ENUM
        elif typtype == "d":
            kind, element = TypeKind.DOMAIN, build(base)
        elif typtype == "r":
            kind, element = TypeKind.RANGE, build(subtype) if subtype else None
        elif typtype == "m":
            kind = TypeKind.MULTIRANGE
        elif typtype == "c":
            kind = TypeKind.COMPOSITE
        elif category == "A" and elem:
            kind, element = TypeKind.ARRAY, build(elem)
        else:
            kind = TypeKind.BASE
        label_tuple = tuple(str(x) for x in labels) if isinstance(labels, list) else ()
        t = PgType(oid, name, kind, schema, element, label_tuple)
        resolved[oid] = t
        return t

    for oid in rows_by_oid:
        build(oid)
    return resolved


def column_type_oids(conn: psycopg.Connection[tuple[object, ...]], table_oids: Sequence[int]) -> set[int]:
    rows = conn.execute(
        "SELECT DISTINCT atttypid::int FROM pg_attribute WHERE attrelid = ANY(%s) AND attnum > 0 AND NOT attisdropped",
        (list(table_oids),),
    ).fetchall()
    return {int(str(r[0])) for r in rows}
