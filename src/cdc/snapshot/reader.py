"""The DBLog reader: a thread with its own connection that runs snapshot jobs while the pipeline streams.

For each chunk of a job's key range: register a window with the coordinator,
commit the low watermark, read the chunk (REPEATABLE READ, ``pg_current_snapshot()``
first, ``COPY (SELECT ... ORDER BY key LIMIT n)`` through the same row parser as
the initial snapshot), deliver it, commit the high watermark, and wait for the
coordinator to settle the window at HW's Commit. Emitted: the range advances
to the chunk's last key. Retry: the chunk is read again in a new window.

Progress of a job is written to the progress topic only once the slot's
``confirmed_flush_lsn`` (read from ``pg_replication_slots``) passed the chunk's
HW Commit end LSN. Before that, a crash would restart the stream before HW and
replay changes older than the emitted rows after them; the chunk must then be
read again, and it will be, since its progress was not recorded.

With ``delivery.mode: exactly_once`` (``in_transactions``) the reader records no
chunk progress itself: it hands the job as it stands after the chunk to the
window (``Window.job_after``), and the pipeline produces that record right after
the chunk's rows, in the same Kafka transaction (``Snapshots.released_progress``).
A crash then either keeps both or neither: a chunk is never emitted twice, nor
recorded without its rows. Its job's ``done`` travels the same way, with its last
chunk (an empty table is read as one empty chunk, so that it has one).

Also here: the signal table. Every ``signal_poll_s`` the reader reads it;
a row ``(id, 'execute-snapshot', '{"data-collections": ["public.t"]}')`` not
handled before becomes a job per table (refused, with the reason logged and
recorded, for unknown tables and tables without a key).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
import structlog
from psycopg import sql

from cdc.catalog import TableInfo
from cdc.event import PgType, TableSchema
from cdc.lsn import Lsn
from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.copytext import CopyFormatError, RowParser, row_parser, split_line
from cdc.snapshot.errors import SnapshotError, SnapshotRefused
from cdc.snapshot.incremental import (
    WATERMARK_PREFIX,
    IncrementalCoordinator,
    Outcome,
    Window,
    XidSnapshot,
    watermark_content,
)
from cdc.snapshot.plan import Chunk, SnapshotTable, chunk_select, describe_table, max_key, session_setup
from cdc.snapshot.progress import ProgressTracker
from cdc.snapshot.state import Job, JobRange, JobReason, JobStatus, SnapshotState, StoreError

log = structlog.get_logger("cdc.snapshot")

__all__ = ["IncrementalReader", "new_job"]

_RECONNECT_S = 2.0


def new_job(
    table: SnapshotTable | TableInfo,
    reason: JobReason,
    ranges: list[JobRange] | None = None,
    *,
    job_id: str | None = None,
) -> Job:
    name = table.name if isinstance(table, SnapshotTable) else table.qualified
    return Job(
        id=job_id or uuid.uuid4().hex[:16],
        table=name,
        oid=table.oid,
        reason=reason,
        ranges=ranges if ranges is not None else [JobRange(None, None)],
        key=table.chunk_key if isinstance(table, SnapshotTable) else (),
    )


class _Rekeyed(Exception):
    """The table's chunk key changed since the job's ranges were cut."""

    def __init__(self, key: tuple[str, ...]) -> None:
        super().__init__(f"chunk key is now {key}")
        self.key = key


@dataclass(slots=True)
class _Unconfirmed:
    end_lsn: Lsn
    job: Job


def _advanced(job: Job, current: JobRange, last: tuple[str, ...] | None, complete: bool) -> Job:
    """The job as ``_chunk`` leaves it once this chunk is emitted (its rows not yet counted): the range
    advanced to the chunk's last key, done when the chunk was its last; the job done with its last range."""
    after = job.copy()
    position = next(i for i, r in enumerate(job.ranges) if r is current)
    moved = after.ranges[position]
    if last is not None:
        moved.last = last
    if complete:
        moved.done = True
    if all(r.done for r in after.ranges):
        after.status = JobStatus.DONE
    return after


class IncrementalReader:
    """Runs the DBLog jobs of ``state`` one chunk at a time; start() it once the pipeline streams."""

    def __init__(
        self,
        *,
        conninfo: str,
        slot: str,
        coordinator: IncrementalCoordinator,
        state: SnapshotState,
        tables: Mapping[str, TableInfo],
        settings: SnapshotConfig,
        types: Mapping[int, PgType] | None = None,
        progress: ProgressTracker | None = None,
        in_transactions: bool = False,
    ) -> None:
        """``in_transactions``: chunk progress is produced by the pipeline inside its Kafka transactions
        (exactly once), not recorded here once Postgres confirmed it."""
        self._conninfo = conninfo
        self._in_transactions = in_transactions
        self._slot = slot
        self._coordinator = coordinator
        self._state = state
        self._tables = dict(tables)
        self._settings = settings
        self._types = dict(types or {})
        self._progress = progress or ProgressTracker(
            "incremental", log_interval_s=settings.progress_log_s, bar=False, continuous=True
        )
        self._progress_job: dict[str, str] = {}  # table -> the job its progress counts
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._unconfirmed: list[_Unconfirmed] = []
        # What to do next: the stored jobs, then requests; ahead of the progress topic, which records only
        # what Postgres confirmed.
        self._jobs: dict[str, Job] = {job.id: job for job in state.jobs()}
        self._jobs_lock = threading.Lock()
        self._last_signal_poll = 0.0
        self._parsers: dict[str, tuple[TableSchema, RowParser]] = {}
        self.failure: str | None = None  # a problem that must stop the pipeline
        self.chunks = 0

    @property
    def progress(self) -> ProgressTracker:
        return self._progress

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="cdc-snapshot-reader", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._close()

    def set_tables(self, tables: Mapping[str, TableInfo], types: Mapping[int, PgType] | None = None) -> None:
        self._types = {**self._types, **(types or {})}
        self._tables = dict(tables)

    def wake(self) -> None:
        self._wake.set()

    @property
    def busy(self) -> bool:
        """Jobs to run, or progress not yet recorded."""
        with self._jobs_lock:
            pending = any(not j.finished for j in self._jobs.values())
        return pending or bool(self._unconfirmed)

    def jobs(self) -> list[Job]:
        """Every job as the reader knows it now (copies)."""
        with self._jobs_lock:
            return [j.copy() for j in sorted(self._jobs.values(), key=lambda j: (j.created_us, j.id))]

    def _next_job(self) -> Job | None:
        with self._jobs_lock:
            pending = [j for j in self._jobs.values() if not j.finished]
        return min(pending, key=lambda j: (j.created_us, j.id)) if pending else None

    # -- requests -------------------------------------------------------------------------------

    def replace_jobs(self, jobs: list[Job]) -> None:
        with self._jobs_lock:
            self._jobs = {job.id: job.copy() for job in jobs}

    def add(self, job: Job) -> None:
        """A job stored by someone else (the start-up's resume)."""
        with self._jobs_lock:
            self._jobs[job.id] = job.copy()
        self._wake.set()

    def request(self, table: str, reason: JobReason) -> Job:
        """A whole-table DBLog pass; SnapshotRefused for unknown tables and tables without a key."""
        info = self._tables.get(table)
        if info is None:
            raise SnapshotRefused(
                f"table {table} is not captured by this connector (captured: {', '.join(sorted(self._tables))})"
            )
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            session_setup(conn, "cdc-snapshot-request")
            try:
                snapshot_table = describe_table(conn, info, self._types)
            except LookupError:
                raise SnapshotRefused(f"table {table} does not exist") from None
        if not snapshot_table.keyed:
            raise SnapshotRefused(
                f"table {table} has no primary key (nor a unique index over NOT NULL columns): a snapshot while "
                "streaming reads it in key order and needs one. Fix: add a primary key."
            )
        job = new_job(snapshot_table, reason)
        self._state.save_job(job)
        with self._jobs_lock:
            self._jobs[job.id] = job.copy()
        self._state.cover({table: info.oid})
        self._state.flush()
        log.info("snapshot_requested", table=table, job=job.id, reason=reason)
        self._wake.set()
        return job

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._loop()
                except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                    log.warning("snapshot_reader_reconnecting", error=str(e).strip())
                    self._close()
                    self._stop.wait(_RECONNECT_S)
                except (SnapshotError, StoreError) as e:
                    if self._stop.is_set():
                        # Stopping: the pipeline no longer waits for this job; it resumes from its record.
                        log.info("snapshot_reader_stopped_mid_job", error=str(e))
                        return
                    self.failure = str(e)
                    log.error("snapshot_reader_failed", error=str(e))
                    return
        finally:
            if not self._stop.is_set() and self.failure is None:
                # An exception nobody expected (its traceback is printed by the thread): stop the pipeline.
                self.failure = "the snapshot reader stopped unexpectedly; see the error logged before this one"

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self._conninfo, autocommit=True)
            session_setup(conn, "cdc-snapshot-dblog")
            self._conn = conn
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _loop(self) -> None:
        conn = self._connection()
        while not self._stop.is_set():
            self._poll_signals(conn)
            self._persist_confirmed(conn)
            job = self._next_job()
            if job is None:
                self._progress.tick()
                self._wake.wait(min(self._settings.signal_poll_s, 1.0))
                self._wake.clear()
                continue
            self._run_job(conn, job)

    def _run_job(self, conn: psycopg.Connection[Any], job: Job) -> None:
        info = self._tables.get(job.table)
        if info is None or info.oid != job.oid:
            self._finish(job, JobStatus.FAILED, f"table {job.table} is no longer captured (or was recreated)")
            return
        if self._progress_job.get(job.table) != job.id:  # a new snapshot of the table counts from its start
            self._progress_job[job.table] = job.id
            self._progress.add_table(
                job.table,
                _estimate(conn, job.oid),
                len(job.ranges),
                chunks_done=sum(r.done for r in job.ranges),
                rows_done=job.rows,
            )
        log.info("snapshot_job_running", job=job.id, table=job.table, reason=job.reason, ranges=len(job.ranges))
        while not self._stop.is_set():
            current = next((r for r in job.ranges if not r.done), None)
            if current is None:
                self._finish(job, JobStatus.DONE, None)
                return
            try:
                self._chunk(conn, job, current)
            except _Rekeyed as e:
                log.warning(
                    "snapshot_job_rekeyed",
                    job=job.id,
                    table=job.table,
                    old_key=list(job.key),
                    new_key=list(e.key),
                    then="the table is read again from its first key",
                )
                job.ranges = [JobRange(None, None)]
                job.key = e.key
            except psycopg.errors.UndefinedTable:
                self._finish(job, JobStatus.FAILED, f"table {job.table} was dropped")
                return
            except LookupError as e:
                self._finish(job, JobStatus.FAILED, str(e))
                return
            except CopyFormatError as e:
                raise SnapshotError(f"snapshot of {job.table} while streaming: {e}") from None
            self._poll_signals(conn)

    def _finish(self, job: Job, status: JobStatus, error: str | None) -> None:
        job.status, job.error = status, error
        if status == JobStatus.DONE and self._in_transactions:
            # "done" went out with the last chunk's rows (Window.job_after), in their transaction.
            self._progress.set_state(job.table, "done")
            log.info("snapshot_job_done", job=job.id, table=job.table, rows=job.rows)
        elif status == JobStatus.DONE:
            # Its last chunk may still wait for confirmation: record "done" with it.
            self._unconfirmed.append(
                _Unconfirmed(self._unconfirmed[-1].end_lsn if self._unconfirmed else Lsn(0), job.copy())
            )
            self._progress.set_state(job.table, "done")
            log.info("snapshot_job_done", job=job.id, table=job.table, rows=job.rows)
        else:
            self._state.save_job(job)
            self._state.flush()
            self._progress.set_state(job.table, "failed")
            log.error("snapshot_job_failed", job=job.id, table=job.table, error=error)

    def _chunk(self, conn: psycopg.Connection[Any], job: Job, current: JobRange) -> None:
        info = self._tables[job.table]
        if not current.resolved:
            table = describe_table(conn, info, self._types)
            current.upper = current.upper if current.upper is not None else max_key(conn, table)
            current.resolved = True
            if (
                current.upper is None and not self._in_transactions
            ):  # the table is empty: later rows come through the stream
                current.done = True
                return
        limit = self._settings.incremental_chunk_rows
        while True:
            window_rows, last, complete, window = self._read_window(conn, job, current, limit)
            if window.outcome is Outcome.EMITTED:
                break
            if self._stop.is_set():
                return
            log.info("snapshot_chunk_retry", job=job.id, table=job.table, reason=window.reason)
        self.chunks += 1
        job.rows += window.emitted
        if last is not None:
            current.last = last
        if complete:
            current.done = True
            self._progress.chunk_done(job.table)
        self._progress.rows(job.table, window_rows)
        self._progress.tick()
        assert window.hw_end_lsn is not None
        if not self._in_transactions:
            self._unconfirmed.append(_Unconfirmed(window.hw_end_lsn, job.copy()))

    def _read_window(
        self, conn: psycopg.Connection[Any], job: Job, current: JobRange, limit: int
    ) -> tuple[int, tuple[str, ...] | None, bool, Window]:
        info = self._tables[job.table]
        window: Window | None = None
        emit = sql.SQL("SELECT pg_logical_emit_message(true, {}, %s)").format(sql.Literal(WATERMARK_PREFIX))
        try:
            window = Window(job.table, info.key)
            self._coordinator.register(window)
            conn.execute(emit, (watermark_content(self._slot, window.id, "low"),))
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
            snapshot = XidSnapshot.parse(str(row[0])) if row else None
            table = describe_table(conn, info, self._types)
            if not table.keyed:
                raise LookupError(f"table {job.table} no longer has a key to read it in order")
            if not job.key:
                job.key = table.chunk_key
            elif job.key != table.chunk_key:
                raise _Rekeyed(table.chunk_key)  # the ranges' values are of another key
            parse = self._parser(table)
            positions = table.chunk_key_positions
            rows = []
            last_line = b""
            with conn.cursor().copy(chunk_select(table, Chunk(job.table, 0, current.remaining()), limit=limit)) as copy:
                for data in copy:
                    line = bytes(data[:-1])
                    rows.append(parse(line))
                    last_line = line
            conn.execute("COMMIT")
            last: tuple[str, ...] | None = None
            if last_line:
                fields = split_line(last_line)
                last = tuple((fields[i] or b"").decode() for i in positions)
            complete = len(rows) < limit
            if self._in_transactions:
                window.job_after = _advanced(job, current, last, complete)
            self._coordinator.deliver(window.id, table.schema, rows, snapshot)
            conn.execute(emit, (watermark_content(self._slot, window.id, "high"),))
        except BaseException:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not conn.closed:
                conn.execute("ROLLBACK")
            if window is not None:
                self._coordinator.abandon(window.id)
            raise
        self._await(conn, window)
        return len(rows), last, complete, window

    def _parser(self, table: SnapshotTable) -> RowParser:
        cached = self._parsers.get(table.name)
        if cached is None or cached[0] != table.schema:
            cached = (table.schema, row_parser(table.schema.columns, where=table.name))
            self._parsers[table.name] = cached
        return cached[1]

    def _await(self, conn: psycopg.Connection[Any], window: Window) -> None:
        waited = 0.0
        while not window.done.wait(0.5):
            if self._stop.is_set():
                self._coordinator.abandon(window.id)
                return
            waited += 0.5
            self._persist_confirmed(conn)
            if waited % 30 == 0:
                log.warning(
                    "snapshot_window_waiting",
                    table=window.table,
                    window=window.id,
                    waited_s=waited,
                    hint="the pipeline must stream with messages enabled and pass every event to the snapshot",
                )

    # -- progress and signals -------------------------------------------------------------------

    def _persist_confirmed(self, conn: psycopg.Connection[Any]) -> None:
        if not self._unconfirmed:
            return
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (self._slot,)
        ).fetchone()
        if row is None or row[0] is None:
            return
        confirmed = Lsn.parse(str(row[0]))
        latest: dict[str, Job] = {}
        while self._unconfirmed and self._unconfirmed[0].end_lsn <= confirmed:
            item = self._unconfirmed.pop(0)
            latest[item.job.id] = item.job
        for job in latest.values():
            self._state.save_job(job)
        if latest:
            self._state.flush()

    def _poll_signals(self, conn: psycopg.Connection[Any]) -> None:
        now = time.monotonic()
        if now - self._last_signal_poll < self._settings.signal_poll_s:
            return
        self._last_signal_poll = now
        schema, _, name = self._settings.signal_table.partition(".")
        row = conn.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, name).as_string(conn),)).fetchone()
        if row is None or row[0] is None:
            return
        try:
            signals = conn.execute(
                sql.SQL("SELECT id::text, type::text, data::text FROM {}").format(sql.Identifier(schema, name))
            ).fetchall()
        except (
            psycopg.errors.UndefinedColumn,
            psycopg.errors.InsufficientPrivilege,
            psycopg.errors.UndefinedTable,
        ) as e:
            log.error(
                "snapshot_signal_table_unreadable",
                table=self._settings.signal_table,
                error=str(e).strip(),
                fix="the signal table needs columns id, type, data (see cdc.snapshot.signals) and SELECT for this role",
            )
            return
        for signal_id, kind, data in signals:
            if self._state.signal_handled(str(signal_id)):
                continue
            self._handle_signal(str(signal_id), str(kind), data)

    def ignore_existing_signals(self) -> int:
        """The slot is being created: the rows already in the signal table are older than its snapshot and
        not for it. Recorded as handled, so that a daemon started later does not act on old signals."""
        schema, _, name = self._settings.signal_table.partition(".")
        try:
            with psycopg.connect(self._conninfo, autocommit=True) as conn:
                row = conn.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, name).as_string(conn),)).fetchone()
                if row is None or row[0] is None:
                    return 0
                ids = [
                    str(r[0])
                    for r in conn.execute(sql.SQL("SELECT id::text FROM {}").format(sql.Identifier(schema, name)))
                ]
        except psycopg.Error as e:
            log.warning("snapshot_signal_table_unreadable", table=self._settings.signal_table, error=str(e).strip())
            return 0
        for signal_id in ids:
            self._state.handle_signal(signal_id, "before_slot", "in the signal table before this slot was created")
        if ids:
            self._state.flush()
            log.info("snapshot_signals_before_slot", count=len(ids), table=self._settings.signal_table)
        return len(ids)

    def _handle_signal(self, signal_id: str, kind: str, data: str | None) -> None:
        if kind != "execute-snapshot":
            self._reject(signal_id, f"signal type {kind!r} is not supported (only 'execute-snapshot')")
            return
        try:
            payload = orjson.loads(data or "{}")
            tables = payload["data-collections"]
            if not isinstance(tables, list) or not tables or not all(isinstance(t, str) for t in tables):
                raise ValueError("data-collections must be a non-empty list of table names")
            snapshot_type = str(payload.get("type", "incremental")).lower()
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            self._reject(
                signal_id,
                f"malformed execute-snapshot data ({e}): expected "
                '{"data-collections": ["schema.table", ...], "type": "incremental"}',
            )
            return
        target = payload.get("connector")
        if target is not None and target != self._slot:
            # Another connector's: handled here means "seen", so it is not read again.
            self._state.handle_signal(signal_id, "ignored", f"for connector {target}")
            self._state.flush()
            log.info("snapshot_signal_ignored", signal=signal_id, connector=target, slot=self._slot)
            return
        if snapshot_type != "incremental":
            self._reject(signal_id, f"snapshot type {snapshot_type!r} is not supported (only 'incremental')")
            return
        names = [t if "." in t else f"public.{t}" for t in tables]
        problems = []
        for name in names:
            if name not in self._tables:
                problems.append(f"table {name} is not captured by this connector")
        if problems:
            self._reject(signal_id, "; ".join(problems) + f" (captured: {', '.join(sorted(self._tables))})")
            return
        accepted = []
        for name in names:
            try:
                accepted.append(self.request(name, JobReason.SIGNAL).id)
            except SnapshotRefused as e:
                problems.append(str(e))
        if problems:
            self._reject(signal_id, "; ".join(problems))
            if not accepted:
                return
        self._state.handle_signal(signal_id, "accepted", None)
        self._state.flush()
        log.info("snapshot_signal_accepted", signal=signal_id, tables=names, jobs=accepted)

    def _reject(self, signal_id: str, reason: str) -> None:
        self._state.handle_signal(signal_id, "rejected", reason)
        self._state.flush()
        log.error("snapshot_signal_rejected", signal=signal_id, reason=reason)


def _estimate(conn: psycopg.Connection[Any], oid: int) -> int:
    row = conn.execute("SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = %s", (oid,)).fetchone()
    return int(row[0]) if row else 0
