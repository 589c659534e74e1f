"""PostgreSQL text-format values (as pgoutput sends them) to the Python values of ``cdc.values``.

``converter_for(pg_type, modifier)`` is called once per column when a Relation
message arrives and returns a function ``bytes -> value`` for the per-row path.
The value each type becomes is the contract table in ``cdc.values``; this
package follows it exactly.

Assumptions about the server (its defaults): ``DateStyle`` is ISO,
``IntervalStyle`` is postgres, ``bytea_output`` is hex (escape is accepted too),
``lc_monetary`` is C, and text arrives as UTF-8.

A known type whose text does not parse raises ``ValueConversionError``, naming
the type and a short repr of the input. A type this package does not know
(``TypeKind.UNKNOWN``, composites, extension types other than hstore and
citext, catalog types such as ``tsvector``) becomes its text as ``str``: never
dropped, never an error (undecodable UTF-8 there is kept as ``\\xNN`` escapes).

Infinite intervals (PostgreSQL 17) have no place in ``Interval`` of their own;
they become PostgreSQL's internal encoding, ``INTERVAL_INFINITY`` and
``INTERVAL_NEG_INFINITY``.

One concern per module, as the per-row path uses them:

- ``oids``: the built-in types by OID (``BUILTIN_TYPES``, ``CATALOG_TEXT_TYPES``), in one place.
- ``scalar``, ``temporal``, ``composite``: the parsers, ``bytes -> value``.
- ``convert``: which parser a type gets (``converter_for``, ``parser_for``) and ``ValueConversionError``.
"""

from cdc.decoder.types.convert import (
    EXTENSION_TYPE_NAMES,
    PARSE_ERRORS,
    Converter,
    ValueConversionError,
    converter_for,
    parser_for,
)
from cdc.decoder.types.oids import BUILTIN_TYPES, CATALOG_TEXT_TYPES
from cdc.decoder.types.temporal import INTERVAL_INFINITY, INTERVAL_NEG_INFINITY

__all__ = [
    "BUILTIN_TYPES",
    "CATALOG_TEXT_TYPES",
    "EXTENSION_TYPE_NAMES",
    "INTERVAL_INFINITY",
    "INTERVAL_NEG_INFINITY",
    "PARSE_ERRORS",
    "Converter",
    "ValueConversionError",
    "converter_for",
    "parser_for",
]
