"""The fill of unchanged TOASTed values (cdc.pipeline.toast): pgoutput bytes in, through the real decoder,
then the fill with an in-memory table, and what reaches the chain out, in order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from cdc.config import Config
from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.pgoutput import UNCHANGED
from cdc.event import ChangeEvent, Event, MessageEvent, TableInfo, TableSchema, TruncateEvent, TxCommit
from cdc.lsn import Lsn
from cdc.pipeline.toast import Key, ToastCounts, ToastExposure, ToastFill, toast_mode
from cdc.values import UNCHANGED_TOAST
from tests.support.pgoutput import begin, commit, delete, logical_message, relation, truncate, tuple_data, update

DOCS = 16500
C1, E1 = 0x1000_0000, 0x1000_0100
C2, E2 = 0x2000_0000, 0x2000_0100
TS = 777_000_000_000_000
COLUMNS = ((1, "id", 23, -1), (0, "n", 23, -1), (0, "body", 25, -1), (0, "doc", 3802, -1))


class Table:
    """The source table as the fill reads it: current rows by key, and the queries it was asked."""

    def __init__(self, rows: dict[Key, dict[str, Any]]) -> None:
        self.rows = rows
        self.queries: list[tuple[str, tuple[str, ...], list[Key]]] = []

    def read(
        self, table: TableSchema, columns: Sequence[str], keys: Sequence[Key], at_least: int, xids: Sequence[int]
    ) -> dict[Key, dict[str, Any]]:
        assert at_least == C1 and list(xids) == [700]  # the events' commit and transaction: the read must see them
        self.queries.append((table.qualified, tuple(columns), list(keys)))
        return {k: {c: self.rows[k][c] for c in columns} for k in keys if k in self.rows}

    def close(self) -> None:
        pass


def decoded(*payloads: bytes, identity: bytes = b"d") -> list[Event]:
    decoder = ChangeDecoder(
        {"public.docs": TableInfo("public", "docs", DOCS, "d", ("id",), ("id", "n", "body", "doc"), frozenset({"id"}))},
        {},
    )
    rel = relation(DOCS, "public", "docs", identity=identity, columns=COLUMNS)
    events: list[Event] = []
    for n, payload in enumerate((begin(C1, TS, 700), rel, *payloads, commit(C1, E1, TS))):
        events.extend(decoder.feed(payload, Lsn(0x100 + n)))
    return events


def run(events: list[Event], table: Table, *, fills: bool = True, batch: int = 1000) -> tuple[list[Event], ToastCounts]:
    """What the loop does with a stream that has nothing more waiting after ``events``: a row change with
    unchanged values, and everything while holding, to the fill; the rest dispatched; then the release."""
    out: list[Event] = []
    counts = ToastCounts.new()
    fill = ToastFill(table, lambda t: fills, batch, counts)
    fill.start(out.append)
    for event in events:
        if fill.holding or (type(event) is ChangeEvent and event.unchanged):
            fill.take(event)
        else:
            out.append(event)
    fill.flush()
    return out, counts


def changes(events: list[Event]) -> list[ChangeEvent]:
    return [e for e in events if isinstance(e, ChangeEvent)]


def body(event: ChangeEvent) -> Any:
    assert event.after is not None, event
    return event.after["body"]


BIG = "x" * 9000


def test_an_unchanged_toasted_value_is_filled_from_the_table_with_one_query_per_transaction() -> None:
    table = Table({(1,): {"body": BIG, "doc": '{"a": 1}'}, (2,): {"body": "two", "doc": '{"b": 2}'}})
    events = decoded(
        update(DOCS, tuple_data(b"1", b"5", UNCHANGED, UNCHANGED)),
        update(DOCS, tuple_data(b"2", b"6", UNCHANGED, b'{"b": 3}')),
    )

    out, counts = run(events, table)

    first, second = changes(out)
    assert first.after == {"id": 1, "n": 5, "body": BIG, "doc": '{"a": 1}'}
    assert second.after == {"id": 2, "n": 6, "body": "two", "doc": '{"b": 3}'}  # the sent value is kept
    assert first.unchanged == second.unchanged == frozenset()
    assert table.queries == [("public.docs", ("body", "doc"), [(1,), (2,)])]
    assert (counts.filled["public.docs"], counts.unresolved["public.docs"], counts.queries["public.docs"]) == (3, 0, 1)


def test_events_leave_in_commit_order_and_the_commit_only_after_them() -> None:
    table = Table({(1,): {"body": BIG, "doc": "{}"}})
    events = decoded(
        update(DOCS, tuple_data(b"3", b"0", b"small", b"{}")),
        update(DOCS, tuple_data(b"1", b"1", UNCHANGED, b"{}")),
        logical_message("app", b"between"),
        truncate((DOCS,)),
        update(DOCS, tuple_data(b"3", b"2", b"small", b"{}")),
    )

    out, _ = run(events, table)

    kinds = [type(e).__name__ for e in out]
    assert kinds == [
        "TxBegin",
        "ChangeEvent",
        "ChangeEvent",
        "MessageEvent",
        "TruncateEvent",
        "ChangeEvent",
        "TxCommit",
    ]
    ordinals = [e.ordinal for e in out if isinstance(e, ChangeEvent | MessageEvent | TruncateEvent)]
    assert ordinals == sorted(ordinals)
    assert body(changes(out)[1]) == BIG


def test_a_row_gone_before_the_read_keeps_the_placeholder_and_is_counted() -> None:
    table = Table({})  # deleted (or re-keyed) after the update and before the read
    events = decoded(
        update(DOCS, tuple_data(b"1", b"5", UNCHANGED, b"{}")), delete(DOCS, key=tuple_data(b"1", None, None, None))
    )

    out, counts = run(events, table)

    upd, dele = changes(out)
    assert upd.after == {"id": 1, "n": 5, "body": UNCHANGED_TOAST, "doc": "{}"}
    assert upd.unchanged == frozenset({"body"})  # the serializer writes toast.placeholder here
    assert dele.op == "d"
    assert counts.unresolved["public.docs"] == 1 and counts.filled["public.docs"] == 0


def test_the_value_read_may_be_newer_than_the_event() -> None:
    """A later transaction changed the column before the read: the event carries that value; the later
    transaction's own record follows with the same value, so the key's last record is exact."""
    table = Table({(1,): {"body": "changed later", "doc": "{}"}})
    out, _ = run(decoded(update(DOCS, tuple_data(b"1", b"5", UNCHANGED, b"{}"))), table)
    assert body(changes(out)[0]) == "changed later"


def test_a_full_batch_is_released_at_once_and_the_commit_waits_behind_its_rows() -> None:
    table = Table({(i,): {"body": f"b{i}", "doc": "{}"} for i in range(5)})
    events = decoded(*(update(DOCS, tuple_data(str(i).encode(), b"0", UNCHANGED, b"{}")) for i in range(5)))
    out: list[Event] = []
    fill = ToastFill(table, lambda t: True, 2, ToastCounts.new())
    fill.start(out.append)
    out.append(events[0])  # the BEGIN, dispatched by the loop before anything was held
    for event in events[1:-1]:
        fill.take(event)
    assert [body(e) for e in changes(out)] == ["b0", "b1", "b2", "b3"]
    assert fill.holding and type(out[-1]) is not TxCommit  # the fifth row waits
    fill.take(events[-1])  # its commit: two held, a full batch
    assert [body(e) for e in changes(out)] == ["b0", "b1", "b2", "b3", "b4"]
    assert type(out[-1]) is TxCommit and not fill.holding
    assert [len(q[2]) for q in table.queries] == [2, 2, 1]


def test_a_backlog_of_small_transactions_is_filled_by_one_query_with_every_commit_after_its_own_rows() -> None:
    table = Table({(1,): {"body": "one", "doc": "{}"}, (2,): {"body": "two", "doc": "{}"}})
    first = decoded(update(DOCS, tuple_data(b"1", b"5", UNCHANGED, b"{}")))
    second = decoded(update(DOCS, tuple_data(b"2", b"6", UNCHANGED, b"{}")))
    out, counts = run([*first, *second], table)
    assert [type(e).__name__ for e in out] == ["TxBegin", "ChangeEvent", "TxCommit"] * 2
    assert [body(e) for e in changes(out)] == ["one", "two"]
    assert len(table.queries) == 1 and counts.queries["public.docs"] == 1


def test_placeholder_mode_passes_events_through_untouched() -> None:
    table = Table({(1,): {"body": BIG, "doc": "{}"}})
    events = decoded(update(DOCS, tuple_data(b"1", b"5", UNCHANGED, b"{}")))
    out, counts = run(events, table, fills=False)
    assert out == events
    assert table.queries == [] and not counts.filled


def test_under_full_identity_the_old_row_fills_and_no_query_is_made() -> None:
    table = Table({(1,): {"body": "should not be read", "doc": "{}"}})
    events = decoded(
        update(DOCS, tuple_data(b"1", b"5", UNCHANGED, b"{}"), old=tuple_data(b"1", b"4", BIG.encode(), b"{}")),
        identity=b"f",
    )
    out, _ = run(events, table)
    assert body(changes(out)[0]) == BIG
    assert table.queries == []


def test_a_new_session_drops_what_a_lost_session_held() -> None:
    table = Table({(1,): {"body": BIG, "doc": "{}"}})
    events = decoded(update(DOCS, tuple_data(b"1", b"5", UNCHANGED, b"{}")))
    out: list[Event] = []
    fill = ToastFill(table, lambda t: True, 1000, ToastCounts.new())
    fill.start(out.append)
    fill.take(events[1])
    assert fill.holding
    fill.start(out.append)  # the next session: the server sends the transaction again from the slot
    fill.flush()
    assert not fill.holding and out == [] and table.queries == []


CONFIG: dict[str, Any] = {
    "source": {"dsn": "postgresql://cdc@localhost/db", "slot": "s", "publication": "p"},
    "kafka": {"bootstrap_servers": "localhost:9092"},
    "topic_prefix": "shop",
}


def test_the_mode_is_fill_by_default_and_a_table_entry_overrides_it() -> None:
    cfg = Config.model_validate({**CONFIG, "tables": ["public.a", {"name": "public.b", "toast": "placeholder"}]})
    assert (toast_mode(cfg, "public.a"), toast_mode(cfg, "public.b")) == ("fill", "placeholder")
    assert cfg.toast.placeholder == "__debezium_unavailable_value"
    off = Config.model_validate(
        {**CONFIG, "toast": {"mode": "placeholder", "placeholder": "?"}, "tables": ["public.a"]}
    )
    assert toast_mode(off, "public.a") == "placeholder"
    assert off.toast.placeholder == "?"


def test_a_bad_toast_setting_names_the_key() -> None:
    with pytest.raises(ValueError, match="toast"):
        Config.model_validate({**CONFIG, "tables": [{"name": "public.a", "toast": "reselect"}]})


def test_the_exposure_names_the_table_the_mode_and_the_full_identity_alternative() -> None:
    text = ToastExposure("public.docs", "d", ("body", "doc"), "fill").describe()
    assert "public.docs: REPLICA IDENTITY DEFAULT" in text and "body, doc" in text and "toast: fill" in text
    assert "ALTER TABLE public.docs REPLICA IDENTITY FULL;" in text and "WAL" in text
