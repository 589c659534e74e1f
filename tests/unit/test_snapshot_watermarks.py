"""cdc.snapshot.incremental: the DBLog watermark coordinator, driven with hand-made events (no services)."""

from __future__ import annotations

import itertools
from typing import Any

from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import (
    ChangeEvent,
    Column,
    Event,
    MessageEvent,
    Op,
    TableSchema,
    TruncateEvent,
    TxBegin,
    TxCommit,
)
from cdc.lsn import Lsn
from cdc.snapshot.incremental import (
    WATERMARK_PREFIX,
    IncrementalCoordinator,
    Outcome,
    Window,
    XidSnapshot,
    is_watermark,
    watermark_content,
)

BY_NAME = {t.name: t for t in BUILTIN_TYPES.values()}
T = TableSchema(
    "public", "t", (Column("id", BY_NAME["int4"], key=True, nullable=False), Column("v", BY_NAME["text"])), 16384
)
OTHER = TableSchema("public", "o", (Column("id", BY_NAME["int4"], key=True),), 16385)
SLOT = "s1"


class Stream:
    """Feeds whole transactions to a coordinator, with increasing LSNs; collects what it emits."""

    def __init__(self, coordinator: IncrementalCoordinator) -> None:
        self.coordinator = coordinator
        self.lsn = itertools.count(1000, 100)
        self.xid = itertools.count(500)
        self.emitted: list[ChangeEvent] = []

    def tx(self, *parts: Any, xid: int | None = None) -> list[ChangeEvent]:
        xid = next(self.xid) if xid is None else xid
        commit = Lsn(next(self.lsn) + 10_000)
        out: list[ChangeEvent] = []
        out += self.coordinator.on_event(TxBegin(xid, commit, 1_000))
        for ordinal, part in enumerate(parts, 1):
            event: Event
            if isinstance(part, tuple) and part[0] in ("low", "high", "other-slot"):
                slot = "s2" if part[0] == "other-slot" else SLOT
                kind = "low" if part[0] == "other-slot" else part[0]
                content = watermark_content(slot, part[1], kind).encode()
                event = MessageEvent(WATERMARK_PREFIX, content, True, commit, Lsn(next(self.lsn)), xid, ordinal, 1_000)
            elif isinstance(part, tuple) and part[0] == "truncate":
                event = TruncateEvent((T,), False, False, commit, Lsn(next(self.lsn)), xid, ordinal, 1_000)
            else:
                op, before, after, table = part
                event = ChangeEvent(op, table, before, after, commit, Lsn(next(self.lsn)), xid, ordinal, 1_000)
            out += self.coordinator.on_event(event)
        out += self.coordinator.on_event(TxCommit(xid, commit, Lsn(commit + 50), 1_000, len(parts)))
        self.emitted += out
        return out


def ins(i: int, v: str = "new", table: TableSchema = T) -> tuple[Any, ...]:
    return (Op.CREATE, None, {"id": i, "v": v}, table)


def upd(i: int, v: str, old: int | None = None) -> tuple[Any, ...]:
    return (Op.UPDATE, {"id": old} if old is not None else None, {"id": i, "v": v}, T)


def dele(i: int) -> tuple[Any, ...]:
    return (Op.DELETE, {"id": i}, None, T)


def chunk(*ids: int) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"read{i}"} for i in ids]


def open_window(c: IncrementalCoordinator, s: Stream) -> Window:
    w = Window("public.t", ["id"])
    c.register(w)
    s.tx(("low", w.id))
    return w


def test_rows_untouched_inside_the_window_are_emitted_as_snapshot_reads_at_the_high_watermark() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = open_window(c, s)
    c.deliver(w.id, T, chunk(1, 2, 3), None)
    out = s.tx(("high", w.id), xid=900)
    assert [e.after for e in out] == chunk(1, 2, 3)
    assert all(e.op is Op.READ and e.snapshot and e.xid == 900 and e.table is T for e in out)
    assert [e.ordinal for e in out] == [2, 3, 4]  # after the high watermark's own ordinal
    assert w.outcome is Outcome.EMITTED and w.done.is_set() and w.emitted == 3
    assert w.hw_end_lsn is not None and out[0].commit_lsn + 50 == w.hw_end_lsn


def test_a_row_inserted_updated_or_deleted_inside_the_window_is_not_emitted() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = open_window(c, s)
    s.tx(upd(1, "changed"), dele(2))
    c.deliver(w.id, T, chunk(1, 2, 3, 4), None)
    s.tx(ins(4))
    out = s.tx(("high", w.id))
    assert [e.after["id"] for e in out if e.after] == [3]
    assert w.dropped == 3


def test_a_key_change_inside_the_window_drops_both_the_old_and_the_new_key() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = open_window(c, s)
    c.deliver(w.id, T, chunk(1, 2, 3), None)
    s.tx(upd(3, "moved", old=1))
    out = s.tx(("high", w.id))
    assert [e.after["id"] for e in out if e.after] == [2]


def test_changes_before_the_low_or_after_the_high_watermark_do_not_drop_rows() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    s.tx(upd(1, "before"))
    w = open_window(c, s)
    c.deliver(w.id, T, chunk(1, 2), None)
    out = s.tx(("high", w.id))
    s.tx(upd(2, "after"))
    assert [e.after["id"] for e in out if e.after] == [1, 2]


def test_changes_of_another_table_with_the_same_key_do_not_drop_rows() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = open_window(c, s)
    s.tx(ins(1, table=OTHER))
    c.deliver(w.id, T, chunk(1), None)
    assert len(s.tx(("high", w.id))) == 1


def test_a_truncate_inside_the_window_drops_the_whole_chunk_but_still_finishes_it() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = open_window(c, s)
    c.deliver(w.id, T, chunk(1, 2), None)
    s.tx(("truncate",))
    assert s.tx(("high", w.id)) == []
    assert w.outcome is Outcome.EMITTED


def test_watermarks_of_another_slot_and_of_unknown_windows_are_ignored() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = Window("public.t", ["id"])
    c.register(w)
    s.tx(("other-slot", w.id))  # the same id under another slot's name: not ours
    s.tx(("high", "0" * 32))  # a replayed high watermark of a window long gone
    assert not w.done.is_set() and c.open_windows == 1
    s.tx(("low", w.id))
    c.deliver(w.id, T, chunk(1), None)
    assert len(s.tx(("high", w.id))) == 1


def test_the_chunk_is_read_again_when_the_tables_columns_changed_inside_the_window() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = open_window(c, s)
    c.deliver(w.id, T, chunk(1), None)
    wider = TableSchema("public", "t", (*T.columns, Column("extra", BY_NAME["int4"])), 16384)
    s.tx((Op.CREATE, None, {"id": 9, "v": "x", "extra": 1}, wider))
    assert s.tx(("high", w.id)) == []
    assert w.outcome is Outcome.RETRY and "columns changed" in (w.reason or "")


def test_a_transaction_decoded_before_the_low_watermark_but_running_in_the_chunk_snapshot_forces_a_retry() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    s.tx(upd(1, "committed, still waiting for a synchronous standby"), xid=700)
    w = open_window(c, s)
    c.deliver(w.id, T, chunk(1, 2), XidSnapshot(690, 705, frozenset({700})))
    assert s.tx(("high", w.id)) == []
    assert w.outcome is Outcome.RETRY and "700" in (w.reason or "")


def test_transactions_visible_to_the_chunk_snapshot_do_not_force_a_retry() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    s.tx(upd(1, "x"), xid=700)
    s.tx(ins(5, table=OTHER), xid=701)  # running, but it did not touch the table
    w = open_window(c, s)
    c.deliver(w.id, T, chunk(1, 2), XidSnapshot(701, 705, frozenset({701})))
    assert len(s.tx(("high", w.id))) == 2


def test_the_commit_history_is_bounded_by_commits_not_by_tables_and_still_finds_a_waiting_commit() -> None:
    c = IncrementalCoordinator(SLOT, recent_commits=50)
    s = Stream(c)
    s.tx(upd(1, "committed, still waiting for a synchronous standby"), xid=700)
    tables = [TableSchema("public", f"t{n}", (Column("id", BY_NAME["int4"], key=True),), 20000 + n) for n in range(30)]
    for n, table in enumerate(tables):  # commits of other tables after it (each holding a backend, waiting too)
        s.tx(ins(n, table=table), xid=710 + n)
    assert len(c._recent) == 31
    w = open_window(c, s)
    c.deliver(w.id, T, chunk(1, 2), XidSnapshot(690, 800, frozenset({700})))
    assert s.tx(("high", w.id)) == []
    assert w.outcome is Outcome.RETRY and "700" in (w.reason or "")
    for n in range(1_000):  # however many tables are captured, the history keeps the last 50 commits
        s.tx(ins(n, table=tables[n % 30]))
    assert len(c._recent) == 50


def test_a_new_replication_session_sends_open_windows_back_to_the_reader() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = open_window(c, s)
    pending = Window("public.t", ["id"])
    c.register(pending)
    c.reset()
    assert w.outcome is Outcome.RETRY and pending.outcome is Outcome.RETRY
    assert s.tx(("high", w.id)) == [] and c.open_windows == 0


def test_a_high_watermark_before_the_rows_were_delivered_retries_the_chunk() -> None:
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = open_window(c, s)
    assert s.tx(("high", w.id)) == []
    assert w.outcome is Outcome.RETRY


def test_rows_are_keyed_by_value_so_array_keys_match_the_stream() -> None:
    table = TableSchema("public", "a", (Column("k", BY_NAME["_int4"], key=True), Column("v", BY_NAME["text"])), 1)
    c = IncrementalCoordinator(SLOT)
    s = Stream(c)
    w = Window("public.a", ["k"])
    c.register(w)
    s.tx(("low", w.id))
    s.tx((Op.UPDATE, None, {"k": [1, 2], "v": "x"}, table))
    c.deliver(w.id, table, [{"k": [1, 2], "v": "old"}, {"k": [3], "v": "y"}], None)
    assert [e.after for e in s.tx(("high", w.id))] == [{"k": [3], "v": "y"}]


def test_watermark_messages_are_recognised_and_other_messages_are_not() -> None:
    wm = MessageEvent(WATERMARK_PREFIX, b"s1:x:low", True, Lsn(1), Lsn(1), 1, 1, 0)
    other = MessageEvent("app", b"hello", True, Lsn(1), Lsn(1), 1, 1, 0)
    assert is_watermark(wm) and not is_watermark(other)
    assert IncrementalCoordinator(SLOT).on_event(other) == []


def test_xid_snapshots_parse_and_tell_running_transactions_across_the_epoch_boundary() -> None:
    snap = XidSnapshot.parse("4294967290:4294967300:4294967295")
    assert snap.running(4294967295)  # in xip
    assert snap.running(4)  # 2**32 + 4 >= xmax: started after the snapshot
    assert not snap.running(2)  # 2**32 + 2: finished
    assert not snap.running(4294967291)
    assert XidSnapshot.parse("10:10:") == XidSnapshot(10, 10, frozenset())
