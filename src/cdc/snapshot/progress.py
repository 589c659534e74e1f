"""Snapshot progress: rows done per table against pg_class's estimate, rate, ETA.

``ProgressTracker`` is fed by the snapshot (thread-safe), logs ``snapshot_progress``
events on an interval, draws a one-line bar when stderr is a terminal, and hands
out ``SnapshotProgress`` values for a metrics endpoint.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import structlog

log = structlog.get_logger("cdc.snapshot")

__all__ = ["ProgressTracker", "SnapshotProgress", "TableProgress"]


@dataclass(frozen=True, slots=True)
class TableProgress:
    table: str
    state: str  # planned, copying, done, dropped, deferred, failed
    rows_done: int
    rows_estimated: int  # pg_class.reltuples at planning (0 when unknown)
    chunks_done: int
    chunks_total: int

    @property
    def fraction(self) -> float | None:
        if self.chunks_total and self.state == "done":
            return 1.0
        if self.rows_estimated <= 0:
            return None
        return min(1.0, self.rows_done / self.rows_estimated)


@dataclass(frozen=True, slots=True)
class SnapshotProgress:
    """One reading of a snapshot's progress (JSON-able with ``dataclasses.asdict``)."""

    kind: str  # initial, incremental
    running: bool
    elapsed_s: float
    rows_done: int
    rows_estimated: int
    rows_per_s: float  # over the last interval
    eta_s: float | None
    tables: tuple[TableProgress, ...]


@dataclass(slots=True)
class _Table:
    state: str
    rows_done: int
    rows_estimated: int
    chunks_done: int
    chunks_total: int


class ProgressTracker:
    def __init__(
        self,
        kind: str,
        *,
        log_interval_s: float = 10.0,
        bar: bool = False,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        continuous: bool = False,
    ) -> None:
        """``continuous``: the tracker of snapshots that come and go for the daemon's life (incremental
        ones), never finished: it is running while some table is planned or copying."""
        self.kind = kind
        self._continuous = continuous
        self._lock = threading.Lock()
        self._tables: dict[str, _Table] = {}
        self._clock = clock
        self._started = clock()
        self._finished: float | None = None
        self._log_interval = log_interval_s
        self._last_log = self._started
        self._rate_mark = (self._started, 0)
        self._rate = 0.0
        self._stream = stream if stream is not None else sys.stderr
        self._bar = bar and self._stream.isatty()
        self._bar_drawn = False

    # -- feeding --------------------------------------------------------------------------------

    def add_table(
        self, table: str, rows_estimated: int, chunks_total: int, *, chunks_done: int = 0, rows_done: int = 0
    ) -> None:
        with self._lock:
            self._tables[table] = _Table("planned", rows_done, max(rows_estimated, 0), chunks_done, chunks_total)

    def rows(self, table: str, n: int) -> None:
        with self._lock:
            t = self._tables.get(table)
            if t is not None:
                t.rows_done += n
                if t.state == "planned":
                    t.state = "copying"

    def chunk_done(self, table: str) -> None:
        with self._lock:
            t = self._tables.get(table)
            if t is not None:
                t.chunks_done += 1
                if t.chunks_total and t.chunks_done >= t.chunks_total:
                    t.state = "done"

    def set_state(self, table: str, state: str) -> None:
        with self._lock:
            t = self._tables.get(table)
            if t is not None:
                t.state = state

    def finish(self) -> None:
        with self._lock:
            self._finished = self._clock()
        self._log(final=True)
        if self._bar_drawn:
            self._stream.write("\n")
            self._stream.flush()

    # -- reading --------------------------------------------------------------------------------

    def read(self) -> SnapshotProgress:
        with self._lock:
            now = self._finished if self._finished is not None else self._clock()
            tables = tuple(
                TableProgress(name, t.state, t.rows_done, t.rows_estimated, t.chunks_done, t.chunks_total)
                for name, t in self._tables.items()
            )
            mark_time, mark_rows = self._rate_mark
            done = sum(t.rows_done for t in tables)
            if now - mark_time >= 1.0:
                # a table's progress started again (a new snapshot of it) can lower the sum
                self._rate = max(0.0, (done - mark_rows) / (now - mark_time))
                self._rate_mark = (now, done)
            elif self._rate == 0.0 and now > self._started:
                self._rate = done / (now - self._started)
            rate = self._rate
        estimated = sum(max(t.rows_estimated, t.rows_done) for t in tables if t.state not in ("dropped",))
        remaining = max(0, estimated - done)
        running = self._finished is None and (
            not self._continuous or any(t.state in ("planned", "copying") for t in tables)
        )
        eta = remaining / rate if rate > 0 and running else (0.0 if not running else None)
        return SnapshotProgress(
            kind=self.kind,
            running=running,
            elapsed_s=round(now - self._started, 3),
            rows_done=done,
            rows_estimated=estimated,
            rows_per_s=round(rate, 1),
            eta_s=round(eta, 1) if eta is not None else None,
            tables=tables,
        )

    def tick(self) -> None:
        """Log and redraw if due, while some table is being copied; cheap to call often."""
        with self._lock:
            active = any(t.state in ("planned", "copying") for t in self._tables.values())
        if not active:
            return
        now = self._clock()
        if now - self._last_log >= self._log_interval:
            self._last_log = now
            self._log(final=False)
        if self._bar:
            self._draw()

    def _log(self, *, final: bool) -> None:
        p = self.read()
        for t in p.tables:
            log.info(
                "snapshot_table_progress",
                kind=p.kind,
                table=t.table,
                state=t.state,
                rows_done=t.rows_done,
                rows_estimated=t.rows_estimated,
                chunks_done=t.chunks_done,
                chunks_total=t.chunks_total,
            )
        log.info(
            "snapshot_finished" if final else "snapshot_progress",
            kind=p.kind,
            rows_done=p.rows_done,
            rows_estimated=p.rows_estimated,
            rows_per_s=_average(p) if final else p.rows_per_s,
            eta_s=p.eta_s,
            elapsed_s=p.elapsed_s,
            tables=len(p.tables),
        )

    def _draw(self) -> None:
        p = self.read()
        fraction = p.rows_done / p.rows_estimated if p.rows_estimated else 0.0
        width = 30
        filled = int(min(1.0, fraction) * width)
        eta = f"{p.eta_s:.0f}s" if p.eta_s is not None else "?"
        self._stream.write(
            f"\rsnapshot [{'#' * filled}{'.' * (width - filled)}] {fraction * 100:5.1f}% "
            f"{p.rows_done:,}/{p.rows_estimated:,} rows {p.rows_per_s:,.0f} rows/s ETA {eta}   "
        )
        self._stream.flush()
        self._bar_drawn = True


def _average(p: SnapshotProgress) -> float:
    return round(p.rows_done / p.elapsed_s, 1) if p.elapsed_s > 0 else 0.0
