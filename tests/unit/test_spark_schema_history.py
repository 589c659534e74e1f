"""The jobs' side of the schema history: the topic's records (offset, key, value) in, each table's versions
in position order out; what cannot be read is kept as such, at its position, or stops the read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cdc.schema_history import BEGINNING, ColumnType, SchemaVersion

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark"))

from cdc_views.history import Entry, SchemaHistory, SchemaHistoryReadError, needed
from cdc_views.tables import Encoding

TOPIC = "shop.__cdc_schema"


def total(scale: int) -> ColumnType:
    return ColumnType("total", "numeric", "pg_catalog", 1700, ((12 << 16) | scale) + 4, 12, scale)


def version(table: str, position: tuple[int, int], scale: int) -> SchemaVersion:
    return SchemaVersion(table, position, (total(scale),))


def test_each_tables_versions_come_out_in_position_order_whatever_the_offsets() -> None:
    late, first, other = (
        version("public.orders", (900, 2), 3),
        version("public.orders", BEGINNING, 2),
        version("public.lines", BEGINNING, 4),
    )
    history = SchemaHistory.of_records(
        TOPIC, [(0, late.key(), late.value()), (1, first.key(), first.value()), (5, other.key(), other.value())]
    )

    assert history.tables == {
        "public.orders": [Entry(BEGINNING, 1, first), Entry((900, 2), 0, late)],
        "public.lines": [Entry(BEGINNING, 5, other)],
    }
    assert history.of("public.orders").entries[1].version is not None
    assert [v.version.scales() for v in history.of("public.orders").entries if v.version] == [
        {"total": 2},
        {"total": 3},
    ]
    assert history.of("public.none").entries == []


def test_the_last_record_of_a_key_wins_and_a_tombstone_removes_the_version() -> None:
    a, b = version("public.orders", (900, 2), 3), version("public.orders", (900, 2), 4)
    gone = version("public.orders", (950, 1), 2)
    history = SchemaHistory.of_records(
        TOPIC, [(0, a.key(), a.value()), (1, gone.key(), gone.value()), (2, b.key(), b.value()), (3, gone.key(), None)]
    )

    assert history.tables == {"public.orders": [Entry((900, 2), 2, b)]}


def test_a_value_that_cannot_be_read_stays_at_its_position_with_the_reason() -> None:
    good = version("public.orders", BEGINNING, 2)
    key = b'{"table":"public.orders","commit_lsn":900,"ordinal":1}'
    history = SchemaHistory.of_records(TOPIC, [(0, good.key(), good.value()), (7, key, b'{"format": 9}')])

    [first, unreadable] = history.tables["public.orders"]
    assert first.version == good
    assert (unreadable.position, unreadable.offset, unreadable.version) == ((900, 1), 7, None)
    assert unreadable.error == "format 9, this reader knows format 1: upgrade the reader"


@pytest.mark.parametrize("key", [None, b"not json", b'{"table":"t","commit_lsn":"1","ordinal":0}', b'{"table":"t"}'])
def test_a_key_that_is_not_a_table_and_position_stops_the_read_naming_its_offset(key: bytes | None) -> None:
    with pytest.raises(
        SchemaHistoryReadError, match=f"record at offset 3 of the schema history topic {TOPIC} has a key"
    ):
        SchemaHistory.of_records(TOPIC, [(3, key, b"{}")])


@pytest.mark.parametrize(
    ("encoding", "wanted"),
    [
        (Encoding(), True),
        (Encoding(schemas_enable=True), False),  # the record's own schema block states the scale
        (Encoding(format="avro"), False),  # its writer schema does
        (Encoding(decimal_handling="string"), False),  # the value is its own text
        (Encoding(decimal_handling="double"), False),
    ],
)
def test_only_plain_json_with_precise_decimals_needs_the_history(encoding: Encoding, wanted: bool) -> None:
    assert needed(encoding) is wanted
