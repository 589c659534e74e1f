"""The compiled JSON envelope (``cdc.sink._envelope``) against the reference (``EventSerializer.reference_records`` of
the JSON serializer): the same events in, the same records out, byte for byte (topic, key, value, headers,
partition), and the same errors.

The events are decoded once from pgoutput (rows rendered by the chosen row codec) and handed to two
serializers of the same settings, one serializing with the compiled envelope, one with the reference:
inserts, updates with and without the old row, key changes, deletes by key and by the whole old row,
unchanged TOASTed values, NULLs, snapshot reads, transaction blocks, several tables and transactions, with
the schema block and the position headers on and off; then hypothesis for values, positions and clocks.

The compiled module must be there: without it these tests fail (collection error), unless
``CDC_PURE_PYTHON`` is set, the run of the suite on the reference, where they are skipped as such.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.compiled import FORCE_REFERENCE_ENV
from cdc.decoder.changes import ChangeDecoder
from cdc.event import ChangeEvent, Event, TransactionBlock
from cdc.lsn import Lsn
from cdc.render.codec import TableRenderer
from cdc.sink import envelopes
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.records import EventSerializer
from cdc.sink.rendering import RenderedRow
from tests.support.envelope_workload import (
    TABLES,
    account,
    transactions,
    variants,
    workload,
)
from tests.support.pgoutput import begin, commit, insert, relation, tuple_data

try:
    from cdc.sink import _envelope
except ImportError as exc:  # pragma: no cover - the reference's run, or a broken build
    if os.environ.get(FORCE_REFERENCE_ENV, "") in ("", "0"):
        raise ImportError(
            f"the compiled JSON envelope is not built ({exc}): build it (pip install -e ., or python setup.py "
            "build_ext --inplace), or set CDC_PURE_PYTHON=1 to run the suite on the reference alone"
        ) from exc
    pytest.skip(f"{FORCE_REFERENCE_ENV} is set and the compiled envelope is not built", allow_module_level=True)

CLOCK = 1_700_000_000_123_456_789


def counter(start: int, step: int = 1_000_003) -> Callable[[], int]:
    """A clock that moves on each call: both sides must read it once per event, in the same order."""
    now = [start - step]

    def clock() -> int:
        now[0] += step
        return now[0]

    return clock


def new_serializer(schemas: bool, headers: bool, clock: Callable[[], int]) -> JsonSerializer:
    ser = JsonSerializer(
        JsonSettings(topic_prefix="p", database="db", schemas_enable=schemas), lambda topic: 2, clock_ns=clock
    )
    ser.position_headers = headers
    return ser


def decode(payloads: Sequence[tuple[bytes, int]], relation_ids: Sequence[int] = tuple(TABLES)) -> list[Event]:
    """The events of ``payloads`` (each with its WAL position) after the tables' Relation messages; rows
    rendered for the JSON format by the chosen row codec."""
    ser = new_serializer(False, True, lambda: CLOCK)
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


def compare(events: Sequence[Event], schemas: bool, headers: bool, clock_start: int = CLOCK) -> int:
    """Both over ``events``: the same records, byte for byte; how many events the compiled envelope wrote itself."""
    reference = new_serializer(schemas, headers, counter(clock_start))
    expected = serialize(lambda e: EventSerializer.reference_records(reference, e), events)
    clock = counter(clock_start)
    compiled_side = new_serializer(schemas, headers, clock)
    handed: list[Any] = []

    def fallback(event: Any) -> Any:
        handed.append(event)
        return EventSerializer.reference_records(compiled_side, event)

    records = envelopes.json_records(
        compiled_side, _envelope.JsonRecords, schemas=schemas, clock_ns=clock, reference=fallback
    )
    assert isinstance(records, _envelope.JsonRecords)
    got = serialize(records, events)
    assert got == expected
    for a, b in zip(got, expected, strict=True):  # the same bytes, and records of the same class
        if isinstance(b, list):
            assert [type(r) for r in a] == [type(r) for r in b]
    return sum(isinstance(e, ChangeEvent) for e in events) - len(handed)


@pytest.mark.parametrize("headers", [False, True])
@pytest.mark.parametrize("schemas", [False, True])
def test_every_op_of_several_tables_and_transactions_writes_the_same_records(schemas: bool, headers: bool) -> None:
    events = decode(workload())
    rows = [r for e in events if isinstance(e, ChangeEvent) for r in (e.before, e.after) if r is not None]
    assert sum(type(r) is RenderedRow for r in rows) >= 15  # mostly rendered, some typed (TOAST, NULLs)
    assert any(type(r) is not RenderedRow for r in rows)
    compiled = compare(events, schemas, headers)
    assert compiled >= 12  # the compiled envelope wrote most of them itself
    assert compare(list(variants(events)), schemas, headers) > compiled


def test_transaction_blocks_are_written_compiled_as_the_reference_writes_them() -> None:
    events = [e for e in decode(workload()[:8]) if isinstance(e, ChangeEvent)]
    blocks = [
        dataclasses.replace(e, transaction=TransactionBlock(f"700:{4096 + i}", i + 1, i)) for i, e in enumerate(events)
    ]
    for schemas in (False, True):
        assert compare(blocks, schemas, True) == len(events) == 6
    (record,) = EventSerializer.reference_records(new_serializer(False, False, lambda: CLOCK), blocks[1])
    assert (
        record.value is not None
        and b'"transaction":{"id":"700:4097","total_order":2,"data_collection_order":1},"op":"c"' in record.value
    )


def test_a_table_announced_again_and_tables_interleaved_in_one_transaction_keep_their_own_records() -> None:
    info, columns, identity = TABLES[16384]
    payloads = [
        (begin(final_lsn=0x3000, xid=702), 0x300),
        (insert(16384, account(1)), 0x301),
        (insert(16385, tuple_data(b"7", b"cup", b"1")), 0x302),
        (relation(16384, info.schema, info.name, identity, columns), 0x303),  # an equal schema, a new object
        (insert(16384, account(2)), 0x304),
        (relation(16384, info.schema, info.name, identity, columns[:-1]), 0x305),  # a column dropped
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
    for schemas in (False, True):
        for headers in (False, True):
            assert compare(events, schemas, headers) == 5


def test_the_chooser_gives_the_compiled_envelope_unless_the_reference_is_forced() -> None:
    ser = new_serializer(False, False, lambda: CLOCK)
    forced = os.environ.get(FORCE_REFERENCE_ENV, "") not in ("", "0")
    assert isinstance(ser.records, _envelope.JsonRecords) is not forced
    events = [e for e in decode(workload()[:3]) if isinstance(e, ChangeEvent)]
    assert ser.records(events[0]) == EventSerializer.reference_records(
        new_serializer(False, False, lambda: CLOCK), events[0]
    )


def test_the_position_headers_switched_after_the_serializer_was_made_are_followed() -> None:
    events = [e for e in decode(workload()[:3]) if isinstance(e, ChangeEvent)]
    ser = new_serializer(False, False, lambda: CLOCK)
    records = envelopes.json_records(ser, _envelope.JsonRecords, schemas=False, clock_ns=lambda: CLOCK)
    assert records(events[0])[0].headers == ()
    ser.position_headers = True
    assert [name for name, _ in records(events[0])[0].headers] == [
        "cdc.lsn",
        "cdc.commit_lsn",
        "cdc.txid",
        "cdc.ordinal",
    ]


def test_clocks_before_the_epoch_and_past_2262_write_the_same_times() -> None:
    """Readings outside 0..2^63 ns take Python's digits, as the reference writes any int (the clock is still
    read once an event: the rest of the run keeps its times)."""
    events = decode(workload()[:8])
    for start in (-1, -(10**18), 2**63 - 2_000_000, 2**64 + 7, -(2**70)):
        assert compare(events, True, False, clock_start=start) == 6


# -- hypothesis: values, positions, transactions and clocks ---------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    transactions(),
    st.booleans(),
    st.booleans(),
    st.integers(-(2**62), 2**63 - 2**40) | st.integers(-(2**64), 2**65),
    st.booleans(),
)
def test_random_transactions_write_the_same_records(
    payloads: list[tuple[bytes, int]], schemas: bool, headers: bool, clock: int, more: bool
) -> None:
    try:
        events = decode(payloads, (16384, 16385))
    except Exception:
        return
    compare(list(variants(events)) if more else events, schemas, headers, clock)
