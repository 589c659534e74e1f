"""The change decoder: pgoutput bytes in, events in commit order out, streamed transactions included.

Payloads are built with the encoder of ``tests/unit/test_pgoutput.py``, or read
from the payloads captured from a real server (``tests/data/pgoutput``). The
relation-cache cases around streamed transactions follow what a PostgreSQL 15
server was seen to send (see the comments at each).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import tracemalloc
from collections.abc import Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.catalog import TableInfo
from cdc.decoder import pgoutput as pg
from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.errors import ChangeError
from cdc.decoder.pgoutput import UNCHANGED
from cdc.decoder.spool import Spool
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import AnyRow, ChangeEvent, Event, MessageEvent, Op, PgType, TruncateEvent, TxBegin, TxCommit, TypeKind
from cdc.lsn import Lsn
from cdc.values import UNCHANGED_TOAST
from tests.support.pgoutput import (
    begin,
    commit,
    delete,
    insert,
    logical_message,
    relation,
    stream_abort,
    stream_commit,
    stream_start,
    truncate,
    tuple_data,
    type_message,
    update,
)

ACCOUNTS = 16384
ORDERS = 16390
C1, E1 = 0x1000_0000, 0x1000_0100  # commit and end LSN of a first transaction
C2, E2 = 0x2000_0000, 0x2000_0100
C3, E3 = 0x3000_0000, 0x3000_0100
C4, E4 = 0x4000_0000, 0x4000_0100
TS = 777_000_000_000_000
STOP = b"E"

TWO_COLUMNS = ((1, "id", 23, -1), (0, "name", 25, -1))
THREE_COLUMNS = ((1, "id", 23, -1), (0, "name", 25, -1), (0, "extra", 23, -1))


def table(name: str, oid: int, columns: Sequence[str] = ("id", "name", "extra")) -> TableInfo:
    return TableInfo("public", name, oid, "d", ("id",), tuple(columns), frozenset({"id"}))


TABLES = {"public.accounts": table("accounts", ACCOUNTS), "public.orders": table("orders", ORDERS)}


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    with Spool(tmp_path / "spool") as spool:
        yield spool


@pytest.fixture
def decoder(spool: Spool) -> ChangeDecoder:
    return ChangeDecoder(TABLES, {}, spool=spool)


def feed(decoder: ChangeDecoder, *payloads: bytes, lsn: int = 0x100) -> list[Event]:
    """Feed payloads (the n-th at LSN ``lsn + n``) and collect every event, consuming replays fully."""
    events: list[Event] = []
    for n, payload in enumerate(payloads):
        events.extend(decoder.feed(payload, Lsn(lsn + n)))
    return events


def block(xid: int, *payloads: bytes, first: bool = False) -> list[bytes]:
    return [stream_start(xid, first), *payloads, STOP]


def rows(events: Iterable[Event]) -> list[tuple[str, AnyRow | None]]:
    return [(str(e.op), e.after if e.after is not None else e.before) for e in events if isinstance(e, ChangeEvent)]


def accounts(columns: tuple[tuple[int, str, int, int], ...] = TWO_COLUMNS, xid: int | None = None) -> bytes:
    return relation(ACCOUNTS, "public", "accounts", columns=columns, xid=xid)


def orders(xid: int | None = None) -> bytes:
    return relation(ORDERS, "public", "orders", columns=TWO_COLUMNS, xid=xid)


# --- ordinary transactions --------------------------------------------------------------------------


def test_an_ordinary_transaction_becomes_begin_changes_with_ordinals_and_commit(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        begin(C1, TS, 700),
        accounts(),
        insert(ACCOUNTS, tuple_data(b"1", b"ada")),
        update(ACCOUNTS, tuple_data(b"1", b"ada l.")),
        delete(ACCOUNTS, key=tuple_data(b"1", None)),
        commit(C1, E1, TS),
    )

    assert events[0] == TxBegin(700, Lsn(C1), TS + pg.POSTGRES_EPOCH_US)
    changes = [e for e in events if isinstance(e, ChangeEvent)]
    assert [(c.op, c.ordinal, c.xid, c.commit_lsn) for c in changes] == [
        (Op.CREATE, 1, 700, C1),
        (Op.UPDATE, 2, 700, C1),
        (Op.DELETE, 3, 700, C1),
    ]
    assert changes[2].before == {"id": 1}
    assert events[-1] == TxCommit(700, Lsn(C1), Lsn(E1), TS + pg.POSTGRES_EPOCH_US, 3)


def test_an_update_leaving_a_toasted_column_alone_marks_it_unchanged_without_a_value(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        begin(C1, TS, 700),
        accounts(),
        update(ACCOUNTS, tuple_data(b"1", UNCHANGED)),
        commit(C1, E1, TS),
    )

    (change,) = [e for e in events if isinstance(e, ChangeEvent)]
    assert change.after == {"id": 1, "name": UNCHANGED_TOAST}
    assert change.unchanged == frozenset({"name"})


def test_under_replica_identity_full_an_unchanged_toasted_column_is_filled_from_the_old_row(
    decoder: ChangeDecoder,
) -> None:
    events = feed(
        decoder,
        begin(C1, TS, 700),
        relation(ACCOUNTS, "public", "accounts", identity=b"f", columns=((1, "id", 23, -1), (1, "name", 25, -1))),
        update(ACCOUNTS, tuple_data(b"2", UNCHANGED), old=tuple_data(b"1", b"a long text")),
        commit(C1, E1, TS),
    )

    (change,) = [e for e in events if isinstance(e, ChangeEvent)]
    assert change.before == {"id": 1, "name": "a long text"}
    assert change.after == {"id": 2, "name": "a long text"}
    assert change.unchanged == frozenset()


def test_a_truncate_carries_its_cascade_and_restart_identity_flags(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder, begin(C1, TS, 700), accounts(), orders(), truncate((ACCOUNTS, ORDERS), options=3), commit(C1, E1, TS)
    )

    (event,) = [e for e in events if isinstance(e, TruncateEvent)]
    assert [t.name for t in event.tables] == ["accounts", "orders"]
    assert (event.cascade, event.restart_identity, event.ordinal, event.xid) == (True, True, 1, 700)


def test_a_type_created_after_start_up_travels_as_text_with_its_name(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        begin(C1, TS, 700),
        type_message(90001, "public", "mood"),
        type_message(90002, "public", "_mood"),
        relation(
            ACCOUNTS, "public", "accounts", columns=((1, "id", 23, -1), (0, "name", 90001, -1), (0, "extra", 90002, -1))
        ),
        insert(ACCOUNTS, tuple_data(b"1", b"happy", b"{sad,ok}")),
        commit(C1, E1, TS),
    )

    (change,) = [e for e in events if isinstance(e, ChangeEvent)]
    assert change.after == {"id": 1, "name": "happy", "extra": "{sad,ok}"}
    mood, moods = change.table.columns[1].type, change.table.columns[2].type
    assert (mood.name, mood.schema, mood.kind) == ("mood", "public", TypeKind.UNKNOWN)
    assert (moods.name, moods.kind) == ("_mood", TypeKind.UNKNOWN)


def test_a_domain_over_a_built_in_type_created_after_start_up_is_read_as_its_base_type(
    decoder: ChangeDecoder,
) -> None:
    # The server's Type message for a domain: the domain's OID, the base type's name, an empty namespace.
    events = feed(
        decoder,
        begin(C1, TS, 700),
        type_message(90004, "", "numeric"),
        relation(ACCOUNTS, "public", "accounts", columns=((1, "id", 23, -1), (0, "name", 90004, -1))),
        insert(ACCOUNTS, tuple_data(b"1", b"9.90")),
        commit(C1, E1, TS),
    )

    (change,) = [e for e in events if isinstance(e, ChangeEvent)]
    assert change.after == {"id": 1, "name": Decimal("9.90")}
    domain = change.table.columns[1].type
    assert (domain.kind, domain.schema, domain.element) == (TypeKind.DOMAIN, "pg_catalog", BUILTIN_TYPES[1700])


def test_hstore_announced_after_start_up_is_still_read_as_a_mapping(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        begin(C1, TS, 700),
        type_message(90003, "public", "hstore"),
        relation(ACCOUNTS, "public", "accounts", columns=((1, "id", 23, -1), (0, "name", 90003, -1))),
        insert(ACCOUNTS, tuple_data(b"1", b'"a"=>"1", "b"=>NULL')),
        commit(C1, E1, TS),
    )

    (change,) = [e for e in events if isinstance(e, ChangeEvent)]
    assert change.after == {"id": 1, "name": {"a": "1", "b": None}}


def test_a_catalog_type_without_a_converter_travels_as_text_under_its_own_name(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        begin(C1, TS, 700),
        relation(ACCOUNTS, "public", "accounts", columns=((1, "id", 23, -1), (0, "name", 3614, -1))),  # tsvector
        insert(ACCOUNTS, tuple_data(b"1", b"'cat':2 'fat':1")),
        commit(C1, E1, TS),
    )

    (change,) = [e for e in events if isinstance(e, ChangeEvent)]
    assert change.after == {"id": 1, "name": "'cat':2 'fat':1"}
    assert change.table.columns[1].type.name == "tsvector"


def test_a_type_unknown_even_by_oid_travels_as_text(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        begin(C1, TS, 700),
        relation(ACCOUNTS, "public", "accounts", columns=((1, "id", 23, -1), (0, "name", 99999, -1))),
        insert(ACCOUNTS, tuple_data(b"1", b"(1,2)")),
        commit(C1, E1, TS),
    )

    (change,) = [e for e in events if isinstance(e, ChangeEvent)]
    assert change.after == {"id": 1, "name": "(1,2)"}
    assert change.table.columns[1].type == PgType(99999, "oid:99999", TypeKind.UNKNOWN)


def test_a_relation_with_more_columns_than_its_rows_is_an_error_not_a_guess(decoder: ChangeDecoder) -> None:
    with pytest.raises(ChangeError, match="has 2 columns, its Relation message 3"):
        feed(decoder, begin(C1, TS, 700), accounts(THREE_COLUMNS), insert(ACCOUNTS, tuple_data(b"1", b"x")))


def test_corrupted_protocol_data_raises_decode_error(decoder: ChangeDecoder) -> None:
    with pytest.raises(pg.DecodeError):
        feed(decoder, begin(C1, TS, 700), accounts(), insert(ACCOUNTS, tuple_data(b"1", b"x"))[:-3])


# --- streamed transactions -----------------------------------------------------------------------


def ordinary_and_streamed(xid: int) -> tuple[list[tuple[bytes, int]], list[tuple[bytes, int]]]:
    """One transaction's changes, sent whole and sent streamed, each change at the same LSN."""
    changes: list[tuple[Callable[[int | None], bytes], int]] = [
        (lambda x: accounts(xid=x), 0),
        (lambda x: orders(xid=x), 0),
        (lambda x: insert(ACCOUNTS, tuple_data(b"1", b"ada"), xid=x), 0x10),
        (lambda x: insert(ORDERS, tuple_data(b"7", b"book"), xid=x), 0x20),
        (lambda x: update(ACCOUNTS, tuple_data(b"1", b"ada l."), xid=x), 0x30),
        (lambda x: delete(ORDERS, key=tuple_data(b"7", None), xid=x), 0x40),
        (lambda x: truncate((ORDERS,), options=1, xid=x), 0x50),
        (lambda x: logical_message("outbox", b"hello", lsn=0x60, xid=x), 0x60),
        (lambda x: update(ACCOUNTS, tuple_data(b"2", b"bob"), key=tuple_data(b"1", None), xid=x), 0x70),
    ]
    whole = [(begin(C1, TS, xid), C1)] + [(make(None), lsn) for make, lsn in changes] + [(commit(C1, E1, TS), E1)]
    streamed_changes = [(make(xid), lsn) for make, lsn in changes]
    streamed = (
        [(stream_start(xid, True), 0)]
        + streamed_changes[:4]
        + [(STOP, 0), (stream_start(xid, False), 0)]
        + streamed_changes[4:]
        + [(STOP, 0), (stream_commit(xid, C1, E1, TS), E1)]
    )
    return whole, streamed


def feed_at(decoder: ChangeDecoder, payloads: Iterable[tuple[bytes, int]]) -> list[Event]:
    events: list[Event] = []
    for payload, lsn in payloads:
        events.extend(decoder.feed(payload, Lsn(lsn)))
    return events


def test_a_streamed_transaction_comes_out_at_its_commit_exactly_as_if_it_had_not_been_streamed(
    tmp_path: Path,
) -> None:
    whole, streamed = ordinary_and_streamed(900)

    expected = feed_at(ChangeDecoder(TABLES, {}), whole)
    with Spool(tmp_path / "s") as spool:
        got = feed_at(ChangeDecoder(TABLES, {}, spool=spool), streamed)

    assert got == expected
    assert [type(e).__name__ for e in got] == [
        "TxBegin",
        "ChangeEvent",
        "ChangeEvent",
        "ChangeEvent",
        "ChangeEvent",
        "TruncateEvent",
        "MessageEvent",
        "ChangeEvent",
        "TxCommit",
    ]
    assert got[-1] == TxCommit(900, Lsn(C1), Lsn(E1), TS + pg.POSTGRES_EPOCH_US, 7)


def test_nothing_of_a_streamed_transaction_comes_out_before_its_commit(decoder: ChangeDecoder) -> None:
    _, streamed = ordinary_and_streamed(900)

    before_commit = feed_at(decoder, streamed[:-1])

    assert before_commit == []


def test_transactions_committing_between_stream_blocks_pass_through_at_once(decoder: ChangeDecoder) -> None:
    first_block = feed(
        decoder, *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"s"), xid=900), first=True)
    )
    between = feed(
        decoder, begin(C1, TS, 901), accounts(), insert(ACCOUNTS, tuple_data(b"2", b"n")), commit(C1, E1, TS)
    )
    second_block = feed(decoder, *block(900, insert(ACCOUNTS, tuple_data(b"3", b"s"), xid=900)))
    at_commit = feed(decoder, stream_commit(900, C2, E2, TS))

    assert first_block == second_block == []
    assert rows(between) == [("c", {"id": 2, "name": "n"})]
    assert rows(at_commit) == [("c", {"id": 1, "name": "s"}), ("c", {"id": 3, "name": "s"})]
    assert [e.xid for e in at_commit if isinstance(e, ChangeEvent)] == [900, 900]


def test_interleaved_streamed_transactions_come_out_in_commit_order(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"started first"), xid=900), first=True),
        *block(901, accounts(xid=901), insert(ACCOUNTS, tuple_data(b"2", b"started second"), xid=901), first=True),
        *block(900, insert(ACCOUNTS, tuple_data(b"3", b"started first"), xid=900)),
        stream_commit(901, C1, E1, TS),
        stream_commit(900, C2, E2, TS),
    )

    assert [(e.xid, e.commit_lsn) for e in events if isinstance(e, TxBegin)] == [(901, C1), (900, C2)]
    assert [r[1]["id"] for r in rows(events) if r[1]] == [2, 1, 3]


def test_changes_of_a_rolled_back_subtransaction_are_left_out(decoder: ChangeDecoder) -> None:
    # BEGIN; INSERT 1; SAVEPOINT s; INSERT 2; ROLLBACK TO s; INSERT 3; COMMIT, streamed: the
    # changes after the savepoint carry the subtransaction's xid.
    events = feed(
        decoder,
        *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"kept"), xid=900), first=True),
        *block(900, insert(ACCOUNTS, tuple_data(b"2", b"rolled back"), xid=901)),
        stream_abort(900, 901),
        *block(900, insert(ACCOUNTS, tuple_data(b"3", b"kept"), xid=902)),
        stream_commit(900, C1, E1, TS),
    )

    assert rows(events) == [("c", {"id": 1, "name": "kept"}), ("c", {"id": 3, "name": "kept"})]
    assert [e.ordinal for e in events if isinstance(e, ChangeEvent)] == [1, 2]
    assert events[-1] == TxCommit(900, Lsn(C1), Lsn(E1), TS + pg.POSTGRES_EPOCH_US, 2)


def test_a_stream_abort_of_a_subtransaction_never_seen_changes_nothing(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"kept"), xid=900), first=True),
        stream_abort(900, 12345),
        stream_commit(900, C1, E1, TS),
    )

    assert rows(events) == [("c", {"id": 1, "name": "kept"})]


def test_a_rolled_back_streamed_transaction_releases_nothing_and_leaves_no_file(
    decoder: ChangeDecoder, spool: Spool
) -> None:
    events = feed(
        decoder,
        *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"x"), xid=900), first=True),
        *block(900, insert(ACCOUNTS, tuple_data(b"2", b"x"), xid=900)),
    )
    assert list(spool.directory.glob("*.spool")) != []

    events += feed(decoder, stream_abort(900, 900))

    assert events == []
    assert list(spool.directory.glob("*.spool")) == []
    assert spool.open_transactions == 0


def test_a_replayed_transaction_leaves_no_file(decoder: ChangeDecoder, spool: Spool) -> None:
    feed(decoder, *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"x"), xid=900), first=True))

    feed(decoder, stream_commit(900, C1, E1, TS))

    assert list(spool.directory.glob("*.spool")) == []


def test_a_non_transactional_message_inside_a_stream_block_goes_out_at_once(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        *block(900, logical_message("heartbeat", b"", transactional=False, lsn=0x77, xid=900), first=True),
    )

    assert events == [MessageEvent("heartbeat", b"", False, None, Lsn(0x77), None, 0, None)]


# --- the relation cache around streamed transactions ----------------------------------------------


def test_a_relation_sent_inside_a_streamed_transaction_describes_the_table_for_later_transactions(
    decoder: ChangeDecoder,
) -> None:
    # Seen on PostgreSQL 15: the table gained a column (DDL committed, no row changed since), a
    # streamed transaction wrote to it and got the new Relation inside its stream; after it
    # committed, the next transaction's insert came without any Relation message.
    feed(decoder, begin(C1, TS, 700), accounts(), insert(ACCOUNTS, tuple_data(b"-1", b"old")), commit(C1, E1, TS))
    feed(
        decoder,
        *block(
            900, accounts(THREE_COLUMNS, xid=902), insert(ACCOUNTS, tuple_data(b"1", b"s", b"2"), xid=902), first=True
        ),
        stream_commit(900, C2, E2, TS),
    )

    later = feed(decoder, begin(C3, TS, 903), insert(ACCOUNTS, tuple_data(b"-3", b"n2", b"3")), commit(C3, E3, TS))

    assert rows(later) == [("c", {"id": -3, "name": "n2", "extra": 3})]


def test_a_relation_sent_inside_a_stream_block_is_not_used_before_its_transaction_commits(
    decoder: ChangeDecoder,
) -> None:
    feed(decoder, begin(C1, TS, 700), accounts(), insert(ACCOUNTS, tuple_data(b"1", b"a")), commit(C1, E1, TS))
    feed(
        decoder,
        *block(
            900, accounts(THREE_COLUMNS, xid=900), insert(ACCOUNTS, tuple_data(b"2", b"s", b"7"), xid=900), first=True
        ),
    )

    between = feed(decoder, begin(C2, TS, 901), insert(ACCOUNTS, tuple_data(b"3", b"n")), commit(C2, E2, TS))
    streamed = feed(decoder, stream_commit(900, C3, E3, TS))

    assert rows(between) == [("c", {"id": 3, "name": "n"})]
    assert rows(streamed) == [("c", {"id": 2, "name": "s", "extra": 7})]


def test_a_relation_that_arrived_after_one_inside_a_stream_wins_when_the_stream_commits(
    decoder: ChangeDecoder,
) -> None:
    # Seen on PostgreSQL 15: a streamed transaction wrote to the table in a savepoint and rolled it
    # back (releasing its lock); another transaction added a column and committed, with the new
    # Relation; the streamed transaction then committed. The table's schema is the later one.
    feed(decoder, begin(C1, TS, 700), accounts(), insert(ACCOUNTS, tuple_data(b"-1", b"old")), commit(C1, E1, TS))
    streamed = feed(
        decoder,
        *block(900, orders(xid=900), insert(ORDERS, tuple_data(b"0", b"start"), xid=900), first=True),
        *block(900, accounts(xid=901), insert(ACCOUNTS, tuple_data(b"1", b"x"), xid=901)),
        stream_abort(900, 901),
    )
    altered = feed(
        decoder,
        begin(C2, TS, 902),
        accounts(THREE_COLUMNS),
        insert(ACCOUNTS, tuple_data(b"-2", b"n", b"2")),
        commit(C2, E2, TS),
    )
    streamed += feed(
        decoder, *block(900, insert(ORDERS, tuple_data(b"1", b"y"), xid=900)), stream_commit(900, C3, E3, TS)
    )

    later = feed(decoder, begin(C4, TS, 903), insert(ACCOUNTS, tuple_data(b"-3", b"n2", b"3")), commit(C4, E4, TS))

    assert rows(altered) == [("c", {"id": -2, "name": "n", "extra": 2})]
    assert rows(streamed) == [("c", {"id": 0, "name": "start"}), ("c", {"id": 1, "name": "y"})]
    assert rows(later) == [("c", {"id": -3, "name": "n2", "extra": 3})]


def test_a_relation_sent_in_a_rolled_back_subtransaction_still_describes_the_table_to_the_rest_of_it(
    decoder: ChangeDecoder,
) -> None:
    # The server tracks what it sent per streamed transaction, savepoints or not: after the
    # rollback to the savepoint, the next change of the table comes without a Relation.
    events = feed(
        decoder,
        *block(900, accounts(xid=901), insert(ACCOUNTS, tuple_data(b"1", b"rolled back"), xid=901), first=True),
        stream_abort(900, 901),
        *block(900, insert(ACCOUNTS, tuple_data(b"2", b"kept"), xid=902)),
        stream_commit(900, C1, E1, TS),
    )

    assert rows(events) == [("c", {"id": 2, "name": "kept"})]


def test_a_rolled_back_streamed_transaction_leaves_the_relation_cache_as_it_was(decoder: ChangeDecoder) -> None:
    feed(decoder, begin(C1, TS, 700), accounts(), insert(ACCOUNTS, tuple_data(b"1", b"a")), commit(C1, E1, TS))
    feed(
        decoder,
        *block(
            900, accounts(THREE_COLUMNS, xid=900), insert(ACCOUNTS, tuple_data(b"2", b"s", b"7"), xid=900), first=True
        ),
        stream_abort(900, 900),
    )

    later = feed(decoder, begin(C2, TS, 901), insert(ACCOUNTS, tuple_data(b"3", b"n")), commit(C2, E2, TS))

    assert rows(later) == [("c", {"id": 3, "name": "n"})]


# --- misuse and protocol violations ---------------------------------------------------------------


def test_feeding_the_next_payload_before_a_replay_is_read_to_the_end_is_an_error(decoder: ChangeDecoder) -> None:
    feed(decoder, *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"x"), xid=900), first=True))
    replay = iter(decoder.feed(stream_commit(900, C1, E1, TS), Lsn(E1)))
    next(replay)

    with pytest.raises(ChangeError, match="iterate the result of feed"):
        decoder.feed(begin(C2, TS, 901), Lsn(C2))


def test_a_stream_block_without_the_first_block_is_an_error(decoder: ChangeDecoder) -> None:
    with pytest.raises(ChangeError, match="without its first block"):
        feed(decoder, stream_start(900, first=False))


def test_a_stream_commit_without_any_block_is_an_error(decoder: ChangeDecoder) -> None:
    with pytest.raises(ChangeError, match="none of its stream blocks"):
        feed(decoder, stream_commit(900, C1, E1, TS))


def test_a_stream_start_inside_an_ordinary_transaction_is_an_error(decoder: ChangeDecoder) -> None:
    with pytest.raises(ChangeError, match="inside transaction 700"):
        feed(decoder, begin(C1, TS, 700), stream_start(900, first=True))


def test_a_begin_inside_a_stream_block_is_an_error(decoder: ChangeDecoder) -> None:
    with pytest.raises(ChangeError, match="Begin message arrived inside the stream block"):
        feed(decoder, stream_start(900, first=True), begin(C1, TS, 700))


def test_streaming_without_a_spool_is_an_error() -> None:
    with pytest.raises(ChangeError, match="no spool"):
        feed(ChangeDecoder(TABLES, {}), stream_start(900, first=True))


def test_handle_refuses_stream_messages_and_points_to_feed(decoder: ChangeDecoder) -> None:
    with pytest.raises(ChangeError, match="feed"):
        decoder.handle(pg.StreamStart(900, True), Lsn(0))


def test_prepared_transaction_messages_are_refused_as_two_phase_is_not_enabled(decoder: ChangeDecoder) -> None:
    with pytest.raises(ChangeError, match="two-phase"):
        decoder.handle(pg.BeginPrepare(Lsn(1), Lsn(2), 0, 900, "gid"), Lsn(0))


def test_reset_forgets_streamed_transactions_and_deletes_their_files(decoder: ChangeDecoder, spool: Spool) -> None:
    feed(decoder, *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"x"), xid=900), first=True))
    feed(decoder, stream_start(900, first=False))  # the connection drops inside a block

    decoder.reset()

    assert list(spool.directory.glob("*.spool")) == []
    # The server streams the transaction again from its first block on the new connection.
    events = feed(
        decoder,
        *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"1", b"x"), xid=900), first=True),
        stream_commit(900, C1, E1, TS),
    )
    assert rows(events) == [("c", {"id": 1, "name": "x"})]


def test_a_replay_left_unfinished_by_a_lost_connection_does_not_come_back_to_haunt_the_next_one(
    decoder: ChangeDecoder,
) -> None:
    feed(decoder, begin(C1, TS, 700), accounts(), insert(ACCOUNTS, tuple_data(b"1", b"old")), commit(C1, E1, TS))
    feed(decoder, *block(900, accounts(xid=900), insert(ACCOUNTS, tuple_data(b"2", b"s"), xid=900), first=True))
    replay = iter(decoder.feed(stream_commit(900, C2, E2, TS), Lsn(E2)))
    next(replay)  # TxBegin went out, then the connection failed

    decoder.reset()
    # The new connection describes the table anew (it gained a column meanwhile) and goes on.
    feed(decoder, begin(C3, TS, 901), accounts(THREE_COLUMNS), insert(ACCOUNTS, tuple_data(b"3", b"n", b"3")))
    del replay
    gc.collect()
    later = feed(decoder, insert(ACCOUNTS, tuple_data(b"4", b"n", b"4")), commit(C3, E3, TS))

    assert rows(later) == [("c", {"id": 4, "name": "n", "extra": 4})]
    assert later[-1] == TxCommit(901, Lsn(C3), Lsn(E3), TS + pg.POSTGRES_EPOCH_US, 2)


# --- bounded memory -------------------------------------------------------------------------------


def test_a_large_streamed_transaction_is_spooled_and_replayed_in_bounded_memory(decoder: ChangeDecoder) -> None:
    filler = b"x" * 200
    n = 20_000  # about 4.5 MB of payloads: held whole, they alone would pass the bound below
    tracemalloc.start()
    try:
        decoder.feed(stream_start(900, True), Lsn(0))
        decoder.feed(accounts(xid=900), Lsn(0))
        for i in range(n):
            decoder.feed(insert(ACCOUNTS, tuple_data(str(i).encode(), filler), xid=900), Lsn(i))
        decoder.feed(STOP, Lsn(0))
        count = 0
        for event in decoder.feed(stream_commit(900, C1, E1, TS), Lsn(E1)):
            count += isinstance(event, ChangeEvent)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert count == n
    assert peak < 1_500_000, f"peak {peak} bytes while spooling and replaying {n} rows"


# --- payloads captured from a real server ---------------------------------------------------------

DATA = Path(__file__).resolve().parent.parent / "data" / "pgoutput"


def captured_files() -> dict[str, bytes]:
    manifest = json.loads((DATA / "manifest.json").read_text())
    return {entry["file"]: (DATA / entry["file"]).read_bytes() for entry in manifest["files"]}


def test_a_captured_streamed_transaction_replays_as_one_transaction_in_commit_order(spool: Spool) -> None:
    files = captured_files()
    capture = {
        f"capture.{name}": TableInfo("capture", name, 0, "d", ("id",), (), frozenset())
        for name in ("accounts", "moods", "parent", "child", "bulk")
    }
    decoder = ChangeDecoder(capture, {}, spool=spool)
    # The tables as the server described them to this connection before the streamed transaction.
    for name in ("02_relation.bin", "16_relation.bin"):
        decoder.handle(pg.decode(files[name]), Lsn(0))
    child = relation(16742, "capture", "child", columns=((1, "id", 23, -1), (0, "parent_id", 23, -1)))
    decoder.handle(pg.decode(child), Lsn(0))
    streamed = [
        "39_stream_start_first_segment.bin",
        "40_in_stream_type.bin",
        "41_in_stream_relation.bin",
        "42_in_stream_insert.bin",
        "43_in_stream_update_new_only.bin",
        "44_in_stream_delete_old_key.bin",
        "45_in_stream_truncate_plain.bin",
        "46_stream_stop.bin",
        "47_stream_abort_subtransaction.bin",
        "48_stream_start_next_segment.bin",
        "49_in_stream_relation_subtransaction.bin",
        "50_in_stream_insert_subtransaction.bin",
        "51_in_stream_logical_message_transactional.bin",
    ]

    events = feed(decoder, *(files[name] for name in streamed), STOP)
    assert events == []
    events = feed(decoder, files["52_stream_commit.bin"])

    commit_message = pg.decode(files["52_stream_commit.bin"])
    assert isinstance(commit_message, pg.StreamCommit)
    assert events[0] == TxBegin(869, commit_message.commit_lsn, commit_message.commit_ts_us)
    body = events[1:-1]
    assert [(e.table.name, e.op) if isinstance(e, ChangeEvent) else type(e).__name__ for e in body] == [
        ("moods", Op.CREATE),
        ("accounts", Op.UPDATE),
        ("accounts", Op.DELETE),
        "TruncateEvent",
        ("bulk", Op.CREATE),
        "MessageEvent",
    ]
    assert [e.ordinal for e in body if not isinstance(e, TxBegin | TxCommit)] == [1, 2, 3, 4, 5, 6]
    assert {e.xid for e in body} == {869}
    moods = body[0]
    assert isinstance(moods, ChangeEvent) and moods.after == {"id": 2, "mood": "ok"}
    assert moods.table.columns[1].type.name == "mood"
    assert events[-1] == TxCommit(
        869, commit_message.commit_lsn, commit_message.end_lsn, commit_message.commit_ts_us, 6
    )


# --- the fast path of row changes agrees with the general path ------------------------------------

MIXED = (
    (1, "id", 23, -1),
    (0, "name", 25, -1),
    (0, "amount", 1700, -1),
    (0, "flag", 16, -1),
    (0, "at", 1184, -1),
    (0, "ref", 2950, -1),
)
MIXED_TABLES = {"public.accounts": table("accounts", ACCOUNTS, [c[1] for c in MIXED])}
VALID_VALUES: dict[str, list[bytes | None]] = {
    "id": [b"1", b"-2147483648", None],
    "name": [b"", b"ada", "é😀".encode(), None],
    "amount": [b"1.50", b"NaN", b"-Infinity", None],
    "flag": [b"t", b"f", None],
    "at": [b"2024-01-31 12:34:56.5+02", b"infinity", b"0044-03-15 12:00:00+00 BC", None],
    "ref": [b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", None],
}
INVALID_VALUES: list[bytes | pg.Unchanged] = [b"x", b"1.5.5", b" 1", UNCHANGED, b"\xff"]


def outcome(fn: Callable[[], list[Event]]) -> tuple[str, object]:
    try:
        return "events", fn()
    except (ChangeError, pg.DecodeError) as error:
        return type(error).__name__, str(error)


def general_path(payloads: list[bytes]) -> list[Event]:
    """Every message through pg.decode and handle: the reference the fast path must match."""
    decoder = ChangeDecoder(MIXED_TABLES, {})
    events: list[Event] = []
    for n, payload in enumerate(payloads):
        event = decoder.handle(pg.decode(payload), Lsn(0x100 + n))
        if event is not None:
            events.append(event)
    return events


def row_strategy() -> st.SearchStrategy[tuple[bytes | None | pg.Unchanged, ...]]:
    column = {
        name: st.one_of(st.sampled_from(values), st.sampled_from(INVALID_VALUES))
        for name, values in VALID_VALUES.items()
    }
    valid = {name: st.sampled_from(values) for name, values in VALID_VALUES.items()}
    pick = st.one_of(st.fixed_dictionaries(valid), st.fixed_dictionaries(column))
    return pick.map(lambda row: tuple(row[c[1]] for c in MIXED))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    new=row_strategy(),
    old=row_strategy(),
    shape=st.sampled_from(["insert", "update", "update_key", "update_full", "delete_key", "delete_full"]),
    mutation=st.one_of(st.none(), st.tuples(st.integers(0, 400), st.integers(0, 255)), st.integers(0, 400)),
)
def test_the_fast_path_of_row_changes_gives_exactly_what_the_general_path_gives(
    new: tuple[bytes | None | pg.Unchanged, ...],
    old: tuple[bytes | None | pg.Unchanged, ...],
    shape: str,
    mutation: tuple[int, int] | int | None,
) -> None:
    payload = {
        "insert": lambda: insert(ACCOUNTS, tuple_data(*new)),
        "update": lambda: update(ACCOUNTS, tuple_data(*new)),
        "update_key": lambda: update(ACCOUNTS, tuple_data(*new), key=tuple_data(old[0], *[None] * 5)),
        "update_full": lambda: update(ACCOUNTS, tuple_data(*new), old=tuple_data(*old)),
        "delete_key": lambda: delete(ACCOUNTS, key=tuple_data(old[0], *[None] * 5)),
        "delete_full": lambda: delete(ACCOUNTS, old=tuple_data(*old)),
    }[shape]()
    if isinstance(mutation, tuple):  # one byte changed
        at, value = mutation[0] % len(payload), mutation[1]
        payload = payload[:at] + bytes([value]) + payload[at + 1 :]
    elif isinstance(mutation, int):  # cut short
        payload = payload[: mutation % len(payload)]
    payloads = [
        begin(C1, TS, 700),
        relation(ACCOUNTS, "public", "accounts", columns=MIXED),
        payload,
        commit(C1, E1, TS),
    ]

    fast = outcome(lambda: feed(ChangeDecoder(MIXED_TABLES, {}), *payloads))
    general = outcome(lambda: general_path(payloads))

    assert repr(fast) == repr(general)  # repr: Decimal('NaN') equals nothing, itself included


# --- relations that are announced but not captured ------------------------------------------------

PARTITION = 16400


def test_a_partition_announced_beside_its_captured_partitioned_table_is_not_an_error(decoder: ChangeDecoder) -> None:
    # publish_via_partition_root: PostgreSQL 15 sends the Relation of the partitioned table and of the
    # partition, then the change under the partitioned table's id.
    events = feed(
        decoder,
        begin(C1, TS, 700),
        accounts(),
        relation(PARTITION, name="accounts_2024", columns=TWO_COLUMNS),
        insert(ACCOUNTS, tuple_data(b"1", b"ada")),
        commit(C1, E1, TS),
    )
    changes = [e for e in events if isinstance(e, ChangeEvent)]
    assert [(c.table.qualified, c.after) for c in changes] == [("public.accounts", {"id": 1, "name": "ada"})]


def test_a_change_of_a_table_that_is_not_captured_is_skipped_and_counted(decoder: ChangeDecoder) -> None:
    events = feed(
        decoder,
        begin(C1, TS, 700),
        relation(PARTITION, name="promo_banners", columns=TWO_COLUMNS),
        insert(PARTITION, tuple_data(b"1", b"ada")),
        accounts(),
        insert(ACCOUNTS, tuple_data(b"2", b"bob")),
        commit(C1, E1, TS),
    )
    changes = [e for e in events if isinstance(e, ChangeEvent)]
    assert [(c.table.qualified, c.after, c.ordinal) for c in changes] == [
        ("public.accounts", {"id": 2, "name": "bob"}, 1)
    ]
    assert decoder.uncaptured == {"public.promo_banners": 1}


def test_a_table_adopted_later_is_decoded_from_the_relation_message_it_already_sent(decoder: ChangeDecoder) -> None:
    feed(
        decoder, begin(C1, TS, 700), relation(PARTITION, name="promo_banners", columns=TWO_COLUMNS), commit(C1, E1, TS)
    )
    decoder.update_tables({**TABLES, "public.promo_banners": table("promo_banners", PARTITION)}, {})
    events = feed(decoder, begin(C1, TS, 701), insert(PARTITION, tuple_data(b"1", b"ada")), commit(C1, E1, TS))
    changes = [e for e in events if isinstance(e, ChangeEvent)]
    assert [(c.table.qualified, c.after) for c in changes] == [("public.promo_banners", {"id": 1, "name": "ada"})]
    assert decoder.uncaptured == {}


def test_a_change_of_a_partition_of_a_captured_table_sent_as_its_own_stops_with_the_fix(spool: Spool) -> None:
    partitioned = dataclasses.replace(table("accounts", ACCOUNTS), partitions=frozenset({"public.accounts_2024"}))
    decoder = ChangeDecoder({**TABLES, "public.accounts": partitioned}, {}, spool=spool)
    with pytest.raises(
        ChangeError, match=r"accounts_2024 as its own, but it is a partition.*publish_via_partition_root = true"
    ):
        feed(
            decoder,
            begin(C1, TS, 700),
            relation(PARTITION, name="accounts_2024", columns=TWO_COLUMNS),
            insert(PARTITION, tuple_data(b"1", b"ada")),
            commit(C1, E1, TS),
        )
