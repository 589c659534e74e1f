"""The compiled Avro envelope (``cdc.sink._envelope.AvroRecords``) against the reference
(``EventSerializer.reference_records`` of the Avro serializer): the same events in, the same records out, byte for byte
(topic, key, value in the Confluent wire format, headers, partition), the same errors, and the same schemas
registered under the same subjects in the same order.

As ``test_envelope_codec.py`` does for JSON: the events are decoded once from pgoutput (rows rendered into
Avro binary by the chosen row codec) and handed to two serializers of the same settings, each with its own
in-memory registry, one serializing with the compiled envelope, one with the reference: inserts, updates with
and without the old row, key changes, deletes by key and by the whole old row, unchanged TOASTed values,
NULLs, snapshot reads, transaction blocks, several tables and transactions, with the position headers on and
off; then hypothesis for values, positions and clocks.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.compiled import FORCE_REFERENCE_ENV
from cdc.decoder.changes import ChangeDecoder
from cdc.event import ChangeEvent, Event, TableInfo, TransactionBlock
from cdc.lsn import Lsn
from cdc.render.codec import TableRenderer
from cdc.sink import envelopes
from cdc.sink.avro import AvroSerializer, AvroSettings
from cdc.sink.errors import SerializationError
from cdc.sink.records import EventSerializer
from cdc.sink.rendering import RenderedRow
from tests.support.accounts import numeric_typmod
from tests.support.envelope_workload import account, transactions, two_transactions, variants
from tests.support.pgoutput import begin, commit, delete, insert, relation, tuple_data

try:
    from cdc.sink import _envelope
except ImportError as exc:  # pragma: no cover - the reference's run, or a broken build
    if os.environ.get(FORCE_REFERENCE_ENV, "") in ("", "0"):
        raise ImportError(
            f"the compiled envelope is not built ({exc}): build it (pip install -e ., or python setup.py "
            "build_ext --inplace), or set CDC_PURE_PYTHON=1 to run the suite on the reference alone"
        ) from exc
    pytest.skip(f"{FORCE_REFERENCE_ENV} is set and the compiled envelope is not built", allow_module_level=True)

NUMERIC = numeric_typmod(12, 2)
# relation id -> (table, columns as a Relation message gives them, replica identity)
TABLES: dict[int, tuple[TableInfo, tuple[tuple[int, str, int, int], ...], bytes]] = {
    16384: (
        TableInfo(
            "public",
            "accounts",
            16384,
            "d",
            ("id",),
            ("id", "name", "amount", "at", "ref", "doc", "note"),
            frozenset({"id", "name"}),
        ),
        (
            (1, "id", 20, -1),
            (0, "name", 25, -1),
            (0, "amount", 1700, NUMERIC),
            (0, "at", 1184, -1),
            (0, "ref", 2950, -1),
            (0, "doc", 3802, -1),
            (0, "note", 1043, 24),
        ),
        b"d",
    ),
    16385: (
        TableInfo("shop", "orders", 16385, "f", ("order_id",), ("order_id", "item", "qty"), frozenset({"order_id"})),
        ((1, "order_id", 20, -1), (0, "item", 25, -1), (0, "qty", 23, -1)),
        b"f",
    ),
    16386: (
        TableInfo("public", "pairs", 16386, "d", ("a", "b"), ("a", "b", "v"), frozenset({"a", "b"})),
        ((1, "a", 23, -1), (1, "b", 25, -1), (0, "v", 16, -1)),
        b"d",
    ),
}
CLOCK = 1_700_000_000_123_456_789


class Registry:
    """In memory: an id per distinct schema (from ``first_id``), every call kept in order."""

    def __init__(self, first_id: int = 1) -> None:
        self.calls: list[tuple[str, int]] = []
        self._ids: dict[bytes, int] = {}
        self._next = first_id

    def register(self, subject: str, schema: Any, *, source: str | None = None) -> int:
        canonical = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        schema_id = self._ids.get(canonical)
        if schema_id is None:
            schema_id = self._ids[canonical] = self._next
            self._next += 1
        self.calls.append((subject, schema_id))
        return schema_id


def counter(start: int, step: int = 1_000_003) -> Callable[[], int]:
    """A clock that moves on each call: both sides must read it once per event, in the same order."""
    now = [start - step]

    def clock() -> int:
        now[0] += step
        return now[0]

    return clock


def new_serializer(headers: bool, clock: Callable[[], int], first_id: int = 1) -> tuple[AvroSerializer, Registry]:
    registry = Registry(first_id)
    ser = AvroSerializer(AvroSettings(topic_prefix="p", database="db"), lambda topic: 2, registry, clock_ns=clock)
    ser.position_headers = headers
    return ser, registry


def decode(payloads: Sequence[tuple[bytes, int]], relation_ids: Sequence[int] = tuple(TABLES)) -> list[Event]:
    """The events of ``payloads`` (each with its WAL position) after the tables' Relation messages; rows
    rendered for the Avro format by the chosen row codec."""
    ser, _ = new_serializer(True, lambda: CLOCK)
    tables = {f"{info.schema}.{info.name}": info for info, _, _ in (TABLES[r] for r in relation_ids)}
    decoder = ChangeDecoder(tables, {}, renderer=TableRenderer(ser.row_rendering))
    for rel in relation_ids:
        info, columns, identity = TABLES[rel]
        decoder.feed(relation(rel, info.schema, info.name, identity, columns), Lsn(0x10))
    events: list[Event] = []
    for payload, lsn in payloads:
        events += decoder.feed(payload, Lsn(lsn))
    return events


def serialize(records: Callable[[Any], Any], events: Sequence[Event]) -> list[Any]:
    out: list[Any] = []
    for event in events:
        if not isinstance(event, ChangeEvent):
            continue
        try:
            out.append(records(event))
        except Exception as exc:
            out.append((type(exc).__name__, str(exc)))
    return out


def compare(events: Sequence[Event], headers: bool, clock_start: int = CLOCK, first_id: int = 1) -> int:
    """Both over ``events``: the same records, byte for byte, and the same registrations; how many events the
    compiled envelope wrote itself."""
    reference, reference_registry = new_serializer(headers, counter(clock_start), first_id)
    expected = serialize(lambda e: EventSerializer.reference_records(reference, e), events)
    clock = counter(clock_start)
    compiled_side, compiled_registry = new_serializer(headers, clock, first_id)
    handed: list[Any] = []

    def fallback(event: Any) -> Any:
        handed.append(event)
        return EventSerializer.reference_records(compiled_side, event)

    records = envelopes.avro_records(
        compiled_side,
        _envelope.AvroRecords,
        clock_ns=clock,
        source_fields=compiled_side.source_fields,
        reference=fallback,
    )
    assert isinstance(records, _envelope.AvroRecords)
    got = serialize(records, events)
    assert got == expected
    for a, b in zip(got, expected, strict=True):  # the same bytes, and records of the same class
        if isinstance(b, list):
            assert [type(r) for r in a] == [type(r) for r in b]
    assert compiled_registry.calls == reference_registry.calls
    return sum(isinstance(e, ChangeEvent) for e in events) - len(handed)


def workload() -> list[tuple[bytes, int]]:
    """Three transactions over three tables: every op, NULLs, unchanged TOAST, key changes, LSNs past an Avro long."""
    third = [
        (begin(final_lsn=0x7FFFFFFFFFFFFF00, ts=0, xid=0xFFFFFFFF), 0x7FFFFFFFFFFFFE00),
        (insert(16384, account(4)), 0x7FFFFFFFFFFFFE01),
        (insert(16384, account(5, name=None)), 0x7FFFFFFFFFFFFE02),  # a NULL in a NOT NULL column
        (insert(16386, tuple_data(None, None, b"t")), 0x7FFFFFFFFFFFFE03),  # a NULL key: an error, the same one
        (delete(16384, key=tuple_data(b"4", None, None, None, None, None, None)), 0x7FFFFFFFFFFFFFFF),
        (commit(commit_lsn=0x7FFFFFFFFFFFFF00, end_lsn=0x7FFFFFFFFFFFFF10), 0x7FFFFFFFFFFFFF10),
    ]
    fourth = [  # past an Avro long: the source's lsn cannot be written, by either side
        (begin(final_lsn=0xFFFFFFFFFFFFFF00, xid=702), 0xFFFFFFFFFFFFFE00),
        (insert(16385, tuple_data(b"12", b"cap", b"1")), 0xFFFFFFFFFFFFFE01),
        (commit(commit_lsn=0xFFFFFFFFFFFFFF00, end_lsn=0xFFFFFFFFFFFFFF10), 0xFFFFFFFFFFFFFF10),
    ]
    return two_transactions() + third + fourth


@pytest.mark.parametrize("headers", [False, True])
def test_every_op_of_several_tables_and_transactions_writes_the_same_records(headers: bool) -> None:
    events = decode(workload())
    rows = [r for e in events if isinstance(e, ChangeEvent) for r in (e.before, e.after) if r is not None]
    assert sum(type(r) is RenderedRow for r in rows) >= 15  # mostly rendered, some typed (TOAST, NULLs)
    assert any(type(r) is not RenderedRow for r in rows)
    compiled = compare(events, headers)
    assert compiled >= 12  # the compiled envelope wrote most of them itself
    assert compare(list(variants(events)), headers) > compiled


def test_schema_ids_of_every_width_are_the_registrys() -> None:
    events = decode(workload()[:8])
    for first_id in (0, 1, 0x7F, 0x01020304, 2**32 - 10):
        assert compare(events, True, first_id=first_id) == 6


def test_transaction_blocks_are_written_compiled_as_the_reference_writes_them() -> None:
    events = [e for e in decode(workload()[:8]) if isinstance(e, ChangeEvent)]
    blocks = [
        dataclasses.replace(e, transaction=TransactionBlock(f"700:{4096 + i}", i + 1, i)) for i, e in enumerate(events)
    ]
    assert compare(blocks, True) == len(events) == 6
    odd = [dataclasses.replace(events[0], transaction=TransactionBlock("x", 2**63, 0))]  # past a long: the same error
    assert compare(odd, True) == 0


def test_a_table_announced_again_and_tables_interleaved_in_one_transaction_keep_their_own_records() -> None:
    info, columns, identity = TABLES[16384]
    payloads = [
        (begin(final_lsn=0x3000, xid=702), 0x300),
        (insert(16384, account(1)), 0x301),
        (insert(16385, tuple_data(b"7", b"cup", b"1")), 0x302),
        (relation(16384, info.schema, info.name, identity, columns), 0x303),  # an equal schema, a new object
        (insert(16384, account(2)), 0x304),
        (relation(16384, info.schema, info.name, identity, columns[:-1]), 0x305),  # a column dropped: a new schema id
        (
            insert(
                16384,
                tuple_data(
                    b"3", b"bo", b"1.00", b"2026-11-27 10:11:12+00", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", b"[]"
                ),
            ),
            0x306,
        ),
        (insert(16385, tuple_data(b"8", b"cup", b"2")), 0x307),
        (commit(commit_lsn=0x3000, end_lsn=0x3010), 0x308),
    ]
    events = decode(payloads)
    assert sum(isinstance(e, ChangeEvent) for e in events) == 5
    for headers in (False, True):
        assert compare(events, headers) == 5


def test_the_chooser_gives_the_compiled_envelope_unless_the_reference_is_forced() -> None:
    ser, _ = new_serializer(False, lambda: CLOCK)
    forced = os.environ.get(FORCE_REFERENCE_ENV, "") not in ("", "0")
    assert isinstance(ser.records, _envelope.AvroRecords) is not forced
    events = [e for e in decode(workload()[:3]) if isinstance(e, ChangeEvent)]
    assert ser.records(events[0]) == EventSerializer.reference_records(
        new_serializer(False, lambda: CLOCK)[0], events[0]
    )


def test_the_position_headers_switched_after_the_serializer_was_made_are_followed() -> None:
    events = [e for e in decode(workload()[:3]) if isinstance(e, ChangeEvent)]
    ser, _ = new_serializer(False, lambda: CLOCK)
    records = envelopes.avro_records(
        ser, _envelope.AvroRecords, clock_ns=lambda: CLOCK, source_fields=ser.source_fields
    )
    assert records(events[0])[0].headers == ()
    ser.position_headers = True
    assert [name for name, _ in records(events[0])[0].headers] == [
        "cdc.lsn",
        "cdc.commit_lsn",
        "cdc.txid",
        "cdc.ordinal",
    ]


def test_clocks_before_the_epoch_and_at_its_edge_write_the_same_times() -> None:
    events = decode(workload()[:8])
    for start in (0, -1, -(10**18), 999_999, 2**63 - 2**40, -(2**63)):
        assert compare(events, True, clock_start=start, first_id=3) == 6


def test_a_clock_beyond_an_avro_long_is_the_same_error_on_both_sides() -> None:
    """ts_ns is an Avro long: past it (2262, or a broken clock) both raise the reference's SerializationError,
    from the event where the clock crosses the edge on (compare() holds the errors equal, message included)."""
    events = decode(workload()[:8])
    for start in (2**63 - 2_000_000, 2**64, -(2**63) - 1):
        assert compare(events, False, clock_start=start, first_id=3) == 6
    ser, _ = new_serializer(False, lambda: 2**63)
    records = envelopes.avro_records(
        ser, _envelope.AvroRecords, clock_ns=lambda: 2**63, source_fields=ser.source_fields
    )
    change = next(e for e in events if isinstance(e, ChangeEvent))
    with pytest.raises(SerializationError, match="beyond what an Avro long holds"):
        records(change)


# -- hypothesis: values, positions, transactions and clocks ---------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    transactions(st.integers(0, 2**63 - 40) | st.integers(0, 2**64 - 40)),  # mostly within an Avro long
    st.booleans(),
    st.integers(-(2**62), 2**63 - 2**40) | st.integers(-(2**64), 2**65),
    st.booleans(),
)
def test_random_transactions_write_the_same_records(
    payloads: list[tuple[bytes, int]], headers: bool, clock: int, more: bool
) -> None:
    try:
        events = decode(payloads, (16384, 16385))
    except Exception:
        return
    compare(list(variants(events)) if more else events, headers, clock)
