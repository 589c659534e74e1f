"""One captured table (``public.accounts``: a bigint key, an oddly named text column, numeric(12,2), float8) and
``feed``, which runs pgoutput payloads through a change decoder: shared by the renderer and Avro writer tests."""

from __future__ import annotations

from cdc.catalog import TableInfo
from cdc.decoder.changes import ChangeDecoder
from cdc.event import ChangeEvent
from cdc.lsn import Lsn


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


COLUMNS = (
    (1, "id", 20, -1),
    (0, 'we%ird "name', 25, -1),
    (0, "amount", 1700, numeric_typmod(12, 2)),
    (0, "f", 701, -1),
)
TABLES = {
    "public.accounts": TableInfo(
        "public", "accounts", 16384, "d", ("id",), ("id", 'we%ird "name', "amount", "f"), frozenset({"id"})
    )
}


def feed(decoder: ChangeDecoder, *payloads: bytes) -> list[ChangeEvent]:
    out = []
    for i, payload in enumerate(payloads):
        out += [e for e in decoder.feed(payload, Lsn(0x100 + i)) if isinstance(e, ChangeEvent)]
    return out
