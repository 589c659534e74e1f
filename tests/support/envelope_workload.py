"""What the compiled envelopes' byte-equality tests share (tests/unit/test_envelope_codec.py for JSON,
test_avro_envelope_codec.py for Avro): the accounts row, the two transactions every op and shape comes
from, and the variants of each event (snapshot read, transaction block, no known transaction)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from hypothesis import strategies as st

from cdc.decoder.pgoutput import UNCHANGED
from cdc.event import ChangeEvent, Event, Op, TableInfo, TransactionBlock
from tests.support.accounts import numeric_typmod
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


def workload() -> list[tuple[bytes, int]]:
    """Three transactions over three tables: every op, NULLs, unchanged TOAST, key changes."""
    third = [
        (begin(final_lsn=0xFFFFFFFFFFFFFF00, ts=0, xid=0xFFFFFFFF), 0xFFFFFFFFFFFFFE00),
        (insert(16384, account(4)), 0xFFFFFFFFFFFFFE01),
        (insert(16384, account(5, name=None)), 0xFFFFFFFFFFFFFE02),  # a NULL in a NOT NULL column: typed path
        (insert(16386, tuple_data(None, None, b"t")), 0xFFFFFFFFFFFFFE03),  # a NULL key: an error, the same one
        (delete(16384, key=tuple_data(b"4", None, None, None, None, None, None)), 0xFFFFFFFFFFFFFFFF),
        (commit(commit_lsn=0xFFFFFFFFFFFFFF00, end_lsn=0xFFFFFFFFFFFFFF10), 0xFFFFFFFFFFFFFF10),
    ]
    return two_transactions() + third


INTS = st.integers(-(2**63), 2**63 - 1).map(lambda n: str(n).encode())


TEXTS = st.text(max_size=10).map(str.encode)


AMOUNTS = st.integers(-(10**10), 10**10).map(lambda n: f"{n / 100:.2f}".encode()) | st.sampled_from(
    [b"NaN", b"1.5", b"-0.00"]
)


VALUE = st.one_of(st.none(), st.just(UNCHANGED))
ANY_LSN = st.integers(0, 2**64 - 40)


@st.composite
def transactions(draw: st.DrawFn, lsns: st.SearchStrategy[int] = ANY_LSN) -> list[tuple[bytes, int]]:
    """One to three random transactions over the two accounts tables; ``lsns`` draws each one's first LSN."""
    payloads: list[tuple[bytes, int]] = []
    for _ in range(draw(st.integers(1, 3))):
        lsn = draw(lsns)
        payloads.append(
            (
                begin(
                    final_lsn=draw(st.integers(0, 2**64 - 1)),
                    ts=draw(st.integers(0, 2**62)),
                    xid=draw(st.integers(1, 2**32 - 1)),
                ),
                lsn,
            )
        )
        for i in range(draw(st.integers(1, 6))):
            rel = draw(st.sampled_from([16384, 16385]))
            if rel == 16384:
                new = tuple_data(
                    draw(INTS),
                    draw(TEXTS | VALUE),
                    draw(AMOUNTS | VALUE),
                    b"2026-01-02 03:04:05+00",
                    b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                    b"{}",
                    draw(TEXTS | VALUE),
                )
                key = tuple_data(draw(INTS), None, None, None, None, None, None)
            else:
                new = tuple_data(draw(INTS), draw(TEXTS | VALUE), draw(INTS | VALUE))
                key = tuple_data(draw(INTS), draw(TEXTS | st.none()), draw(INTS | st.none()))
            kind = draw(st.sampled_from(["insert", "update", "update_old", "delete"]))
            if kind == "insert":
                payload = insert(rel, new)
            elif kind == "update":
                payload = update(rel, new)
            elif kind == "update_old":
                payload = (
                    update(rel, new, old=new if draw(st.booleans()) else key)
                    if rel == 16385
                    else update(rel, new, key=key)
                )
            else:
                payload = delete(rel, old=new) if rel == 16385 and draw(st.booleans()) else delete(rel, key=key)
            payloads.append((payload, lsn + 1 + i))
        payloads.append((commit(), lsn + 20))
    return payloads
