"""What the compiled envelopes' byte-equality tests share (tests/unit/test_envelope_codec.py for JSON,
test_avro_envelope_codec.py for Avro): the accounts row, the two transactions every op and shape comes
from, and the variants of each event (snapshot read, transaction block, no known transaction)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from cdc.decoder.pgoutput import UNCHANGED
from cdc.event import ChangeEvent, Event, Op, TransactionBlock
from tests.support.pgoutput import begin, commit, delete, insert, tuple_data, update


def account(i: int, name: bytes | None = b"ann", amount: bytes | None = b"12.50", note: Any = b"n") -> bytes:
    return tuple_data(
        str(i).encode(),
        name,
        amount,
        b"2026-11-27 10:11:12.345678+00",
        b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        b'{"k": [1, "x"]}',
        note,
    )


def two_transactions() -> list[tuple[bytes, int]]:
    """Two transactions over three tables (16384 accounts, 16385 and 16386): every op, NULLs, unchanged TOAST,
    key changes, a key-only and a whole old row."""
    first = [
        (begin(final_lsn=0x1000, xid=700), 0x100),
        (insert(16384, account(1)), 0x101),
        (insert(16385, tuple_data(b"10", b"pen", b"3")), 0x102),
        (insert(16384, account(2, amount=None, note=None)), 0x103),
        (insert(16386, tuple_data(b"1", b"x", b"t")), 0x104),
        (insert(16386, tuple_data(b"2", b"y", None)), 0x105),
        (insert(16384, account(3, name=b'quote " and \\ back \xc3\xa9 \xf0\x9f\x98\x80')), 0x106),
        (commit(commit_lsn=0x1000, end_lsn=0x1010), 0x107),
    ]
    second = [
        (begin(final_lsn=0x2000, xid=701), 0x200),
        (update(16384, account(1, amount=b"-0.01")), 0x201),  # no old row
        (update(16384, account(1, note=UNCHANGED)), 0x202),  # an unchanged TOASTed value
        (update(16384, account(9), key=tuple_data(b"1", None, None, None, None, None, None)), 0x203),  # key change
        (
            update(16385, tuple_data(b"10", b"pen", b"4"), old=tuple_data(b"10", b"pen", b"3")),
            0x204,
        ),  # old row, same key
        (
            update(16385, tuple_data(b"11", b"pen", b"4"), old=tuple_data(b"10", b"pen", b"4")),
            0x205,
        ),  # old row, key change
        (update(16385, tuple_data(b"11", b"ink", b"5"), old=tuple_data(b"11", None, b"4")), 0x206),
        (update(16386, tuple_data(b"1", b"x", b"f")), 0x207),
        (delete(16384, key=tuple_data(b"2", None, None, None, None, None, None)), 0x208),  # key only
        (delete(16385, old=tuple_data(b"11", b"ink", b"5")), 0x209),  # the whole old row
        (delete(16386, key=tuple_data(b"2", b"y", None)), 0x20A),
        (commit(commit_lsn=0x2000, end_lsn=0x2010), 0x20B),
    ]
    return first + second


def variants(events: Sequence[Event]) -> Iterator[Event]:
    """Each event as it is, then as a snapshot read, with a transaction block, outside a known transaction, and
    an update as a read or delete that still holds its other row."""
    for event in events:
        yield event
        if not isinstance(event, ChangeEvent):
            continue
        if event.op is Op.CREATE:
            yield dataclasses.replace(event, op=Op.READ, snapshot=True)
            yield dataclasses.replace(event, op=Op.READ, snapshot=True, xid=None)
        yield dataclasses.replace(event, transaction=TransactionBlock("701:8192", 3, 1))
        if event.op is Op.UPDATE:  # shapes no stage makes, but the reference has an answer for: the same one
            yield dataclasses.replace(event, op=Op.READ)
            yield dataclasses.replace(event, op=Op.DELETE, before=event.after)
        yield dataclasses.replace(event, xid=None)
