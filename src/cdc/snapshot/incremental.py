"""Snapshots while streaming (DBLog): the watermark coordinator. No I/O.

A chunk of a table is read between two watermarks, transactional logical
messages ``pg_logical_emit_message(true, 'cdc.wm', '<slot>:<window>:low|high')``
written by the reader (``cdc.snapshot.reader``) on its own connection. The
pipeline hands every event to ``IncrementalCoordinator.on_event`` in commit
order and produces what it returns right away, before the next event:

1. The reader registers a ``Window`` and commits the low watermark (LW).
2. It reads the chunk (``WHERE key > last ORDER BY key LIMIT n``) in a
   REPEATABLE READ transaction that starts with ``pg_current_snapshot()``, and
   delivers the rows to the window (keyed by the event key) with that snapshot.
3. It commits the high watermark (HW).
4. Between LW and HW every change event of the table marks its key (old and new
   key of a key change) as touched; a truncate of the table marks the whole
   window; a change whose columns differ from the chunk's marks it for a retry.
5. At HW the untouched rows are returned as ``ChangeEvent(op=READ,
   snapshot=True)`` at HW's position: untouched in the window, each row's value
   at the read equals its value at HW, so emitting it there is exact. A touched
   row is stale; the newer event was already emitted. The window is finished at
   HW's Commit, whose end LSN the reader waits for before it records progress.

Postgres hazard (synchronous replication): a transaction T can be
decoded before LW (its commit record is in WAL) while it is still running in
the eyes of the chunk's snapshot (its backend waits for a synchronous standby
before it leaves the proc array). The chunk then misses T's changes, and T's
keys were not touched inside the window: the rows would be stale. So the
coordinator remembers, per table, the xids of transactions decoded recently,
and at HW retries the chunk when one decoded before LW is in progress (xid in
``xip``, or at or after ``xmax``) in the chunk's snapshot.
"""

from __future__ import annotations

import collections
import enum
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from cdc.event import (
    AnyRow,
    ChangeEvent,
    Event,
    MessageEvent,
    Op,
    Row,
    TableSchema,
    TruncateEvent,
    TxBegin,
    TxCommit,
    change_event,
)
from cdc.lsn import Lsn
from cdc.snapshot.config import WATERMARK_PREFIX
from cdc.snapshot.plan import same_columns

_NOTHING_UNCHANGED: frozenset[str] = frozenset()

log = structlog.get_logger("cdc.snapshot")

__all__ = [
    "WATERMARK_PREFIX",
    "IncrementalCoordinator",
    "Outcome",
    "Window",
    "XidSnapshot",
    "freeze",
    "is_watermark",
    "watermark_content",
]

Key = tuple[Any, ...]
_XID_MASK: Final = 0xFFFFFFFF


def is_watermark(event: Event) -> bool:
    return type(event) is MessageEvent and event.prefix == WATERMARK_PREFIX


def watermark_content(slot: str, window_id: str, kind: str) -> str:
    return f"{slot}:{window_id}:{kind}"


def freeze(value: Any) -> Any:
    """A hashable stand-in for a key value (arrays are lists, hstore a dict)."""
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    return value


@dataclass(frozen=True, slots=True)
class XidSnapshot:
    """``pg_current_snapshot()``: xids below xmin are finished, at or above xmax not yet, in xip running."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> XidSnapshot:
        xmin, xmax, xip = text.strip().split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def running(self, xid: int) -> bool:
        """Whether a transaction with this 32-bit xid (as pgoutput sends it) was in progress in the snapshot."""
        full = (self.xmax & ~_XID_MASK) | (xid & _XID_MASK)
        if full > self.xmax:
            full -= 1 << 32  # an xid of the previous epoch
        return full >= self.xmax or full in self.xip


class Outcome(enum.Enum):
    EMITTED = "emitted"  # HW reached: the surviving rows were handed to the pipeline
    RETRY = "retry"  # read the chunk again (new window)


class Window:
    """One chunk between its watermarks; made by the reader, settled by the coordinator."""

    def __init__(self, table: str, key_names: Iterable[str]) -> None:
        self.id = uuid.uuid4().hex
        self.table = table
        self.key_names = tuple(key_names)
        # set by the reader (deliver), under the coordinator's lock
        self.rows: dict[Key, Row] | None = None
        self.schema: TableSchema | None = None
        self.snapshot: XidSnapshot | None = None
        # exactly once: the job's record as it stands once this window's rows are emitted (their count
        # not yet in it), produced by the pipeline right after them (``IncrementalCoordinator.released``)
        self.job_after: Any = None
        # set by the coordinator on the pipeline's thread
        self.lw_seq = -1
        self.touched: set[Key] = set()
        self.truncated = False
        self.schemas: list[TableSchema] = []
        self.emitted = 0
        self.dropped = 0
        self.hw_lsn: Lsn | None = None
        self.hw_end_lsn: Lsn | None = None
        # the outcome, for the reader
        self.outcome: Outcome | None = None
        self.reason: str | None = None
        self.done = threading.Event()

    def key(self, row: AnyRow) -> Key:
        return tuple(freeze(row.get(name)) for name in self.key_names)

    def settle(self, outcome: Outcome, reason: str | None = None) -> None:
        self.outcome = outcome
        self.reason = reason
        self.done.set()


class IncrementalCoordinator:
    """Turns the stream plus delivered chunks into the snapshot rows to emit, at each high watermark.

    ``on_event``, ``on_row``, ``reset``: the pipeline's thread. ``register``, ``deliver``,
    ``abandon``: the reader's thread. Thread-safe between the two.
    """

    def __init__(self, slot: str, *, recent_commits: int = 10_000) -> None:
        self._slot = slot
        self._lock = threading.Lock()
        self._registered: dict[str, Window] = {}  # LW not seen yet
        self._open: dict[str, Window] = {}  # LW seen, HW not yet
        self._by_table: dict[str, list[Window]] = {}  # open windows per table (pipeline thread only)
        self._closing: list[Window] = []  # HW seen in the current transaction
        # (commit seq, xid, tables changed) of the last commits decoded, for _retry_reason. One ring for all
        # tables, so memory does not grow with their number. A commit decoded before a low watermark can
        # still be running in the chunk's snapshot only while it waits (for a synchronous standby); such
        # commits are released in WAL order, so they are the newest ones, and each holds a backend: no
        # more than max_connections of them.
        self._recent: collections.deque[tuple[int, int, set[str]]] = collections.deque(maxlen=recent_commits)
        self._seq = 0  # commits decoded
        self._xid: int | None = None
        self._tables: set[str] = set()  # tables changed by the current transaction
        self.retries = 0
        self._released: Window | None = None

    # -- the reader's side ----------------------------------------------------------------------

    def register(self, window: Window) -> None:
        """Before the reader commits LW."""
        with self._lock:
            self._registered[window.id] = window

    def deliver(self, window_id: str, schema: TableSchema, rows: Iterable[Row], snapshot: XidSnapshot | None) -> None:
        """The chunk's rows, read after LW committed and before HW is written."""
        with self._lock:
            window = self._registered.get(window_id) or self._open.get(window_id)
            if window is None:
                return
            keyed: dict[Key, Row] = {}
            for row in rows:
                keyed[window.key(row)] = row
            window.rows, window.schema, window.snapshot = keyed, schema, snapshot

    def abandon(self, window_id: str) -> None:
        """The reader gives up on a window (its read failed): its watermarks, if decoded, are ignored."""
        with self._lock:
            window = self._registered.pop(window_id, None) or self._open.pop(window_id, None)
        if window is not None and not window.done.is_set():
            window.settle(Outcome.RETRY, "abandoned by the reader")

    @property
    def open_windows(self) -> int:
        with self._lock:
            return len(self._registered) + len(self._open)

    # -- the pipeline's side --------------------------------------------------------------------

    def reset(self) -> None:
        """A new replication session: the stream restarts at the confirmed position; open windows retry."""
        with self._lock:
            windows = [*self._registered.values(), *self._open.values(), *self._closing]
            self._registered.clear()
            self._open.clear()
        self._by_table.clear()
        self._closing.clear()
        self._xid = None
        self._tables = set()
        self._released = None
        for window in windows:
            if not window.done.is_set():
                window.settle(Outcome.RETRY, "the replication session restarted")

    def released(self) -> Window | None:
        """The window whose rows the last ``on_event`` returned (a high watermark that emitted, possibly no
        rows at all), once; else None. The pipeline then produces its progress right after its rows."""
        window, self._released = self._released, None
        return window

    def on_row(self, event: ChangeEvent) -> ChangeEvent:
        """A row change: what ``on_event`` does with a ``ChangeEvent`` (it never returns rows for one),
        called directly per row by the pipeline's chain, which passes the row on."""
        name = event.table.qualified
        self._tables.add(name)
        windows = self._by_table.get(name)
        if windows:
            for window in windows:
                self._touch(window, event)
        return event

    def on_event(self, event: Event) -> list[ChangeEvent]:
        """Every event of the stream, in commit order; returns the snapshot rows to produce right after it."""
        kind = type(event)
        if kind is ChangeEvent:
            assert isinstance(event, ChangeEvent)
            self.on_row(event)
            return []
        if kind is TxBegin:
            assert isinstance(event, TxBegin)
            self._xid = event.xid
            self._tables = set()
            return []
        if kind is TxCommit:
            assert isinstance(event, TxCommit)
            self._commit(event)
            return []
        if kind is MessageEvent:
            assert isinstance(event, MessageEvent)
            if event.prefix == WATERMARK_PREFIX:
                return self._watermark(event)
            return []
        if kind is TruncateEvent:
            assert isinstance(event, TruncateEvent)
            for table in event.tables:
                self._tables.add(table.qualified)
                for window in self._by_table.get(table.qualified, ()):
                    window.truncated = True
        return []

    # -- internals ------------------------------------------------------------------------------

    @staticmethod
    def _touch(window: Window, event: ChangeEvent) -> None:
        if event.after is not None:
            window.touched.add(window.key(event.after))
        if event.before is not None:
            window.touched.add(window.key(event.before))
        if not window.schemas or window.schemas[-1] is not event.table:
            window.schemas.append(event.table)

    def _commit(self, commit: TxCommit) -> None:
        self._seq += 1
        if self._xid is not None and self._tables:
            self._recent.append((self._seq, self._xid, self._tables))  # a new set is made at every begin
        self._xid = None
        self._tables = set()
        if self._closing:
            closing, self._closing = self._closing, []
            for window in closing:
                window.hw_end_lsn = commit.end_lsn
                window.settle(Outcome.EMITTED)

    def _watermark(self, message: MessageEvent) -> list[ChangeEvent]:
        try:
            slot, window_id, mark = message.content.decode().rsplit(":", 2)
        except (UnicodeDecodeError, ValueError):
            log.warning("snapshot_watermark_malformed", content=message.content[:100].decode(errors="replace"))
            return []
        if slot != self._slot:
            return []  # another connector's window on the same database
        if mark == "low":
            with self._lock:
                window = self._registered.pop(window_id, None)
                if window is None:
                    return []  # replayed after a restart, or abandoned
                self._open[window_id] = window
            window.lw_seq = self._seq
            self._by_table.setdefault(window.table, []).append(window)
            return []
        if mark != "high":
            return []
        with self._lock:
            window = self._open.pop(window_id, None)
            if window is None:
                return []
            rows, schema, snapshot = window.rows, window.schema, window.snapshot
        windows = self._by_table.get(window.table, [])
        if window in windows:
            windows.remove(window)
        if not windows:
            self._by_table.pop(window.table, None)
        reason = self._retry_reason(window, rows, schema, snapshot)
        if reason is not None:
            self.retries += 1
            log.info("snapshot_window_retry", table=window.table, window=window.id, reason=reason)
            window.settle(Outcome.RETRY, reason)
            return []
        assert rows is not None and schema is not None
        out: list[ChangeEvent] = []
        if not window.truncated:
            touched = window.touched
            commit_lsn = message.commit_lsn if message.commit_lsn is not None else message.lsn
            ts = message.commit_ts_us if message.commit_ts_us is not None else 0
            ordinal = message.ordinal
            read = Op.READ
            for key, row in rows.items():
                if key in touched:
                    continue
                ordinal += 1
                out.append(
                    change_event(
                        read,
                        schema,
                        None,
                        row,
                        commit_lsn,
                        message.lsn,
                        message.xid,
                        ordinal,
                        ts,
                        True,
                        _NOTHING_UNCHANGED,
                    )
                )
        window.emitted = len(out)
        window.dropped = len(rows) - len(out)
        window.hw_lsn = message.commit_lsn or message.lsn
        self._closing.append(window)
        self._released = window
        return out

    def _retry_reason(
        self, window: Window, rows: Mapping[Key, Row] | None, schema: TableSchema | None, snapshot: XidSnapshot | None
    ) -> str | None:
        if rows is None or schema is None:
            return "the chunk was not read before its high watermark"
        for seen in window.schemas:
            if not same_columns(seen, schema):
                return "the table's columns changed inside the window"
        if snapshot is not None and not window.truncated:
            table = window.table
            for seq, xid, tables in reversed(self._recent):
                if seq > window.lw_seq or table not in tables:
                    continue
                if snapshot.running(xid):
                    return (
                        f"transaction {xid} was decoded before the low watermark but was still in progress in the "
                        "chunk's snapshot (a commit waiting for a synchronous standby)"
                    )
        return None
