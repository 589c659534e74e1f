"""The built-in types by OID, in one place (values from PostgreSQL's ``pg_type.dat``).

``BUILTIN_TYPES`` holds every pg_catalog type the converters parse, and its array type;
``CATALOG_TEXT_TYPES`` the pg_catalog types whose text travels as ``str``.
"""

from __future__ import annotations

from typing import Final

from cdc.event import PgType, TypeKind

__all__ = ["BOX_OID", "BUILTIN_NAME", "BUILTIN_TYPES", "CATALOG_TEXT_TYPES"]

_BASE_OIDS: Final[tuple[tuple[str, int, int], ...]] = (
    # (typname, oid, array oid)
    ("bool", 16, 1000),
    ("bytea", 17, 1001),
    ("char", 18, 1002),
    ("name", 19, 1003),
    ("int8", 20, 1016),
    ("int2", 21, 1005),
    ("int4", 23, 1007),
    ("text", 25, 1009),
    ("oid", 26, 1028),
    ("json", 114, 199),
    ("xml", 142, 143),
    ("point", 600, 1017),
    ("lseg", 601, 1018),
    ("path", 602, 1019),
    ("box", 603, 1020),
    ("polygon", 604, 1027),
    ("line", 628, 629),
    ("cidr", 650, 651),
    ("float4", 700, 1021),
    ("float8", 701, 1022),
    ("circle", 718, 719),
    ("macaddr8", 774, 775),
    ("money", 790, 791),
    ("macaddr", 829, 1040),
    ("inet", 869, 1041),
    ("bpchar", 1042, 1014),
    ("varchar", 1043, 1015),
    ("date", 1082, 1182),
    ("time", 1083, 1183),
    ("timestamp", 1114, 1115),
    ("timestamptz", 1184, 1185),
    ("interval", 1186, 1187),
    ("timetz", 1266, 1270),
    ("bit", 1560, 1561),
    ("varbit", 1562, 1563),
    ("numeric", 1700, 1231),
    ("uuid", 2950, 2951),
    ("jsonb", 3802, 3807),
    ("jsonpath", 4072, 4073),
)

_RANGE_OIDS: Final[tuple[tuple[str, int, int, str], ...]] = (
    # (typname, oid, array oid, subtype)
    ("int4range", 3904, 3905, "int4"),
    ("numrange", 3906, 3907, "numeric"),
    ("tsrange", 3908, 3909, "timestamp"),
    ("tstzrange", 3910, 3911, "timestamptz"),
    ("daterange", 3912, 3913, "date"),
    ("int8range", 3926, 3927, "int8"),
)

_MULTIRANGE_OIDS: Final[tuple[tuple[str, int, int, str], ...]] = (
    # (typname, oid, array oid, range type)
    ("int4multirange", 4451, 6150, "int4range"),
    ("nummultirange", 4532, 6151, "numrange"),
    ("tsmultirange", 4533, 6152, "tsrange"),
    ("tstzmultirange", 4534, 6153, "tstzrange"),
    ("datemultirange", 4535, 6155, "daterange"),
    ("int8multirange", 4536, 6157, "int8range"),
)


def _builtin_types() -> dict[int, PgType]:
    types: dict[int, PgType] = {}
    by_name: dict[str, PgType] = {}

    def add(t: PgType, array_oid: int) -> None:
        types[t.oid] = t
        by_name[t.name] = t
        types[array_oid] = PgType(array_oid, "_" + t.name, TypeKind.ARRAY, element=t)

    for name, oid, array_oid in _BASE_OIDS:
        add(PgType(oid, name), array_oid)
    for name, oid, array_oid, subtype in _RANGE_OIDS:
        add(PgType(oid, name, TypeKind.RANGE, element=by_name[subtype]), array_oid)
    for name, oid, array_oid, range_name in _MULTIRANGE_OIDS:
        add(PgType(oid, name, TypeKind.MULTIRANGE, element=by_name[range_name]), array_oid)
    return types


BUILTIN_TYPES: Final[dict[int, PgType]] = _builtin_types()
"""Every pg_catalog type this module converts, and its array type, by OID."""

_CATALOG_TEXT_OIDS: Final[tuple[tuple[str, int, int], ...]] = (
    # (typname, oid, array oid): pg_catalog types with no parser here, whose text travels as str.
    ("regproc", 24, 1008),
    ("tid", 27, 1010),
    ("xid", 28, 1011),
    ("cid", 29, 1012),
    ("aclitem", 1033, 1034),
    ("refcursor", 1790, 2201),
    ("regprocedure", 2202, 2207),
    ("regoper", 2203, 2208),
    ("regoperator", 2204, 2209),
    ("regclass", 2205, 2210),
    ("regtype", 2206, 2211),
    ("txid_snapshot", 2970, 2949),
    ("pg_lsn", 3220, 3221),
    ("tsvector", 3614, 3643),
    ("tsquery", 3615, 3645),
    ("regconfig", 3734, 3735),
    ("regdictionary", 3769, 3770),
    ("regnamespace", 4089, 4090),
    ("regrole", 4096, 4097),
    ("regcollation", 4191, 4192),
    ("pg_snapshot", 5038, 5039),
    ("xid8", 5069, 271),
)


def _catalog_text_types() -> dict[int, PgType]:
    types: dict[int, PgType] = {}
    for name, oid, array_oid in _CATALOG_TEXT_OIDS:
        t = PgType(oid, name)
        types[oid] = t
        types[array_oid] = PgType(array_oid, "_" + name, TypeKind.ARRAY, element=t)
    return types


CATALOG_TEXT_TYPES: Final[dict[int, PgType]] = _catalog_text_types()
"""pg_catalog types without a converter of their own, by OID, as ``cdc.catalog.load_types`` resolves them.

The server sends no Type message for catalog types, so a column of one added after start-up would
otherwise be known by its OID alone; with these its values travel as text under the type's name.
"""

BUILTIN_NAME: Final[dict[int, str]] = {oid: t.name for oid, t in BUILTIN_TYPES.items() if t.kind is TypeKind.BASE}
"""The name of each built-in base type (not arrays, ranges, multiranges), by OID: what the converters dispatch on."""

BOX_OID: Final = 603
"""``box``: the one built-in type whose arrays are delimited by ``;`` rather than ``,``."""
