"""The initial snapshot: every captured table copied under the slot's exported snapshot, in parallel.

The order of things (each step's record is durable before the next step starts):

1. ``initial`` = pending in the progress topic, and the previous snapshot's
   records of the slot are deleted.
2. ``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')`` gives the consistent
   point C and a snapshot name. From here until step 4 the replication
   connection runs no other command: its next command would end the snapshot.
3. A planning connection imports the snapshot, reads the tables' columns as of
   C, estimates and cuts every table into chunks; plans are stored, with C, and
   ``initial`` = copying. Then the worker processes start and import the same
   snapshot (``BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT``).
4. Once every worker imported it (or failed to), the replication connection is
   closed: the importers keep the snapshot for as long as their transactions live.
5. Workers copy chunks (``cdc.snapshot.worker``); a chunk is recorded as copied
   after Kafka acknowledged all its rows. A worker that dies leaves its chunk to
   another worker, which still holds the same snapshot.
6. When every chunk is copied, ``initial`` = done; the pipeline then streams
   from the slot, which starts at C: every change after the snapshot, none
   before it.

A crash anywhere in 2-5 leaves the slot at C (nothing streamed, nothing
confirmed) and ``initial`` pending or copying: the next start streams from C at
once and finishes the chunks not recorded as copied with DBLog, over the same
key ranges (``cdc.snapshot.service``). A table rewritten or dropped while the
copy runs is handled the same way (rewritten: DBLog after the copy) or left out
(dropped: its topic keeps what was copied, and the start-up checks then ask to
remove it from the configuration).
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import multiprocessing.process
import multiprocessing.queues
import os
import queue
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from cdc.catalog import TableInfo
from cdc.event import PgType, TableSchema, TruncateEvent, TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.replication import ReplicationStream
from cdc.sink.kafka import SinkError
from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.errors import SnapshotError, SnapshotImportError, SnapshotInterrupted
from cdc.snapshot.messages import ChunkDone, ChunkSkipped, ChunkTask, Failed, Ready, Report, Rows
from cdc.snapshot.output import COORDINATOR, OutputFactory
from cdc.snapshot.plan import Chunk, Chunking, SnapshotTable, TablePlan, describe_table, plan_table, session_setup
from cdc.snapshot.progress import ProgressTracker
from cdc.snapshot.state import InitialStatus, SnapshotState, chunk_key
from cdc.snapshot.worker import WorkerSpec, import_snapshot, run_worker

log = structlog.get_logger("cdc.snapshot")

__all__ = ["InitialResult", "InitialSnapshot"]

_Worker = tuple[multiprocessing.process.BaseProcess, "multiprocessing.queues.Queue[ChunkTask | None]"]
_ORDINAL_STRIDE = 1 << 32
_QUEUE_DEPTH = 2  # chunk n's events have ordinals n * 2**32 + 1, + 2, ...


@dataclass(frozen=True, slots=True)
class InitialResult:
    consistent_point: Lsn
    rows: int
    tables: tuple[str, ...]
    complete: bool  # every chunk copied; False: some are left for DBLog (tables rewritten meanwhile)
    dropped: tuple[str, ...]  # tables dropped while the snapshot ran
    elapsed_s: float
    server_json_rows: int = 0  # rows of chunks read with server-built JSON (cdc.snapshot.sqljson)
    rendered_rows: int = 0  # rows of chunks read through the row codec (cdc.render.codec.copy_parser)


@dataclass
class _Copying:
    """The initial copy while chunks are handed out (``InitialSnapshot._copy``)."""

    pending: collections.deque[ChunkTask]  # not yet handed to a worker
    assigned: dict[int, list[ChunkTask]]  # in each worker's queue, in order
    dropped: set[str] = dataclasses.field(default_factory=set)  # tables dropped meanwhile
    deferred: set[str] = dataclasses.field(default_factory=set)  # tables left to DBLog
    rows: int = 0
    server_json_rows: int = 0  # rows read with server-built JSON
    rendered_rows: int = 0  # rows read through the row codec


@dataclass(frozen=True, slots=True)
class _Copied:
    """How the initial copy ended."""

    rows: int
    complete: bool  # False: some tables are left for DBLog
    dropped: tuple[str, ...]  # sorted
    server_json_rows: int
    rendered_rows: int


class _Exporter:
    """Holds an exported snapshot until every reader imported it: a slot's replication connection, or
    (initial_only) a plain connection's open transaction."""

    def __init__(self, conninfo: str, slot: str | None, slot_failover: bool | None = None) -> None:
        self._stream: ReplicationStream | None = None
        self._conn: psycopg.Connection[Any] | None = None
        if slot is not None:
            self._stream = ReplicationStream(conninfo, slot_failover=slot_failover)
            self._stream.connect()
            info = self._stream.create_slot(slot, export_snapshot=True)
            if info.snapshot_name is None:
                raise SnapshotError(f"the server created slot {slot} without exporting a snapshot")
            self.point, self.name = info.consistent_point, info.snapshot_name
        else:
            self._conn = psycopg.connect(conninfo, autocommit=True)
            session_setup(self._conn, "cdc-snapshot-export")
            self._conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = self._conn.execute("SELECT pg_export_snapshot(), pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            self.name, self.point = str(row[0]), Lsn.parse(str(row[1]))

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class InitialSnapshot:
    """Copies every table under one exported snapshot with parallel worker processes."""

    def __init__(
        self,
        *,
        conninfo: str,
        slot: str,
        tables: Mapping[str, TableInfo],
        output: OutputFactory,
        state: SnapshotState,
        settings: SnapshotConfig,
        types: Mapping[int, PgType] | None = None,
        progress: ProgressTracker | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        alive: Callable[[], None] | None = None,
        truncate_first: Collection[str] = (),
        with_slot: bool = True,
        slot_failover: bool | None = None,
        log_format: str = "json",
        log_level: str = "info",
        described: Callable[[Sequence[TableSchema], Lsn], object] | None = None,
    ) -> None:
        """``described(tables, point)``: called with the columns as the exported snapshot's catalog gives
        them, before any row is read (the schema history publishes them where they are not the version in
        force at the rows' position: an ALTER may have committed since the daemon read the catalog)."""
        self._conninfo = conninfo
        self._slot = slot
        self._tables = dict(tables)
        self._output = output
        self._state = state
        self._settings = settings
        self._types = dict(types or {})
        self._progress = progress or ProgressTracker(
            "initial", log_interval_s=settings.progress_log_s, bar=settings.progress_bar
        )
        self._should_stop = should_stop
        self._alive = alive
        self._truncate_first = set(truncate_first)
        self._with_slot = with_slot
        self._slot_failover = slot_failover
        self._log_format = log_format
        self._log_level = log_level
        self._described = described
        self._context = multiprocessing.get_context("spawn")

    @property
    def progress(self) -> ProgressTracker:
        return self._progress

    def run(self) -> InitialResult:
        started = time.monotonic()
        self._state.begin_initial()
        log.info("snapshot_starting", slot=self._slot if self._with_slot else None, tables=sorted(self._tables))
        exporter = _Exporter(self._conninfo, self._slot if self._with_slot else None, self._slot_failover)
        point, name = exporter.point, exporter.name
        planner: psycopg.Connection[Any] | None = None
        workers: dict[int, _Worker] = {}
        reports: multiprocessing.queues.Queue[Report] = self._context.Queue()
        try:
            try:
                planner = self._import(name)
                row = planner.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
                xid = int(row[0]) & 0xFFFFFFFF if row else None
                tables, plans = self._plan(planner, point)
                if self._described is not None:
                    self._described([t.schema for t in tables.values()], point)
                chunks = [(tables[p.table], c) for p in plans.values() for c in p.chunks()]
                count = max(1, min(self._settings.workers, len(chunks)))
                spec = WorkerSpec(
                    0,
                    self._conninfo,
                    name,
                    self._output,
                    point,
                    xid,
                    time.time_ns() // 1000,
                    self._log_format,
                    self._log_level,
                    self._settings.server_json,
                    record_chunks=self._with_slot,
                )
                workers = self._start_workers(spec, count, reports)
            finally:
                exporter.close()  # every reader imported the snapshot (or never will)
            self._mark_truncated(tables, point, spec.commit_ts_us)
            result = self._copy(tables, plans, chunks, workers, reports, point)
        except BaseException:
            started_workers = [*workers, COORDINATOR]
            self._kill(workers)
            self._fence(started_workers)
            raise
        finally:
            if planner is not None:
                planner.close()
        self._stop_workers(workers)
        elapsed = time.monotonic() - started
        self._progress.finish()
        log.info(
            "snapshot_copied",
            consistent_point=str(point),
            rows=result.rows,
            server_json_rows=result.server_json_rows,
            rendered_rows=result.rendered_rows,
            complete=result.complete,
            dropped=list(result.dropped),
            elapsed_s=round(elapsed, 3),
            rows_per_s=round(result.rows / elapsed, 1) if elapsed > 0 else None,
        )
        return InitialResult(
            point,
            result.rows,
            tuple(sorted(tables)),
            result.complete,
            result.dropped,
            elapsed,
            result.server_json_rows,
            result.rendered_rows,
        )

    # -- steps ----------------------------------------------------------------------------------

    def _import(self, snapshot_name: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self._conninfo, autocommit=True)
        try:
            session_setup(conn, "cdc-snapshot-plan")
            import_snapshot(conn, snapshot_name)
        except psycopg.Error as e:
            conn.close()
            raise SnapshotImportError(
                f"the exported snapshot {snapshot_name} can no longer be imported ({str(e).strip()}): its "
                "replication connection ran another command or closed. Nothing was read; the slot is kept at its "
                "consistent point, and the next start streams from there and snapshots every table while streaming."
            ) from None
        return conn

    def _plan(self, conn: psycopg.Connection[Any], point: Lsn) -> tuple[dict[str, SnapshotTable], dict[str, TablePlan]]:
        tables: dict[str, SnapshotTable] = {}
        plans: dict[str, TablePlan] = {}
        for name, info in self._tables.items():
            try:
                table = describe_table(conn, info, self._types)
            except LookupError:
                raise SnapshotError(
                    f"table {name} was dropped before the snapshot started. Fix: remove it from 'tables' and restart."
                ) from None
            conn.execute("SAVEPOINT cdc_plan")  # the sampling's table lock goes at the rollback
            try:
                plan = plan_table(conn, table, self._settings.chunk_rows)
            finally:
                conn.execute("ROLLBACK TO SAVEPOINT cdc_plan")
                conn.execute("RELEASE SAVEPOINT cdc_plan")
            tables[name], plans[name] = table, plan
            self._state.save_plan(plan)
            self._progress.add_table(name, plan.estimated_rows, plan.chunk_count)
            log.info(
                "snapshot_table_planned",
                table=name,
                chunking=plan.chunking.value,
                chunk_key=list(table.chunk_key),
                chunks=plan.chunk_count,
                rows_estimated=plan.estimated_rows,
            )
        self._state.cover({name: t.oid for name, t in tables.items()})
        # workers: how many transactional ids a restart fences (exactly once), at most this many
        self._state.set_initial(InitialStatus.COPYING, consistent_point=str(point), workers=self._settings.workers)
        self._state.flush()
        return tables, plans

    def _start_workers(
        self, spec: WorkerSpec, count: int, reports: multiprocessing.queues.Queue[Report]
    ) -> dict[int, _Worker]:
        workers: dict[int, _Worker] = {}
        for wid in range(count):
            tasks: multiprocessing.queues.Queue[ChunkTask | None] = self._context.Queue()
            worker_spec = dataclasses.replace(spec, worker_id=wid)
            process = self._context.Process(
                target=run_worker,
                args=(worker_spec, os.getpid(), tasks, reports),
                name=f"cdc-snapshot-{wid}",
                daemon=True,
            )
            process.start()
            workers[wid] = (process, tasks)
        deadline = time.monotonic() + self._settings.import_timeout_s
        waiting = set(workers)
        errors: list[str] = []
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                report = reports.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                for wid in list(waiting):
                    if not workers[wid][0].is_alive():
                        waiting.discard(wid)
                        errors.append(f"worker {wid} exited with {workers[wid][0].exitcode} before importing")
                continue
            if isinstance(report, Ready):
                waiting.discard(report.worker)
                if report.error is not None:
                    errors.append(f"worker {report.worker}: {report.error}")
                    workers.pop(report.worker)[0].join(5)
        for wid in waiting:
            errors.append(f"worker {wid} did not import the snapshot within {self._settings.import_timeout_s:.0f}s")
            stuck, _ = workers.pop(wid)
            stuck.kill()
        if errors:
            log.warning("snapshot_workers_not_started", errors=errors, started=len(workers))
        if not workers:
            raise SnapshotImportError(
                "no snapshot worker could import the exported snapshot: " + "; ".join(errors) + ". The slot is kept at "
                "its consistent point; the next start streams from there and snapshots every table while streaming."
            )
        log.info("snapshot_workers_started", workers=len(workers))
        return workers

    def _mark_truncated(self, tables: Mapping[str, SnapshotTable], point: Lsn, ts_us: int) -> None:
        """Tables whose topics hold records of an earlier slot: a truncate marker first, acknowledged."""
        marked = [t.schema for name, t in tables.items() if name in self._truncate_first]
        if not marked:
            return
        output = self._output(COORDINATOR)  # exactly once: not a worker's transactional id
        output.delivery.begin(TxBegin(0, point, ts_us))
        event = TruncateEvent(tuple(marked), False, False, point, point, None, 0, ts_us)
        for record in output.serializer.records(event):
            output.delivery.send(record, "truncate marker")
        output.delivery.commit(TxCommit(0, point, point, ts_us, 1))
        while output.delivery.drain(60.0):
            log.warning("snapshot_waiting_for_kafka", what="truncate markers")
        log.info("snapshot_topics_marked_truncated", tables=sorted(t.qualified for t in marked))

    def _copy(
        self,
        tables: Mapping[str, SnapshotTable],
        plans: Mapping[str, TablePlan],
        chunks: list[tuple[SnapshotTable, Chunk]],
        workers: dict[int, _Worker],
        reports: multiprocessing.queues.Queue[Report],
        point: Lsn,
    ) -> _Copied:
        """Hand out chunks, record finished ones, replace what dead workers held; then record the end."""
        copying = _Copying(
            collections.deque(ChunkTask(table, chunk, n * _ORDINAL_STRIDE) for n, (table, chunk) in enumerate(chunks)),
            {wid: [] for wid in workers},
        )
        while copying.pending or any(copying.assigned.values()):
            if self._should_stop():
                raise SnapshotInterrupted(
                    "the initial snapshot was stopped before every chunk was copied; the next start streams from the "
                    "slot's consistent point and copies the remaining chunks while streaming"
                )
            _hand_out(workers, copying)
            try:
                report = reports.get(timeout=0.2)
            except queue.Empty:
                report = None
            if not self._take(report, copying, plans):
                continue  # a chunk that was already queued when the table was given up
            self._replace_dead(workers, copying)
            self._progress.tick()
            if self._alive is not None:
                self._alive()
        return self._copy_ended(copying, point)

    def _take(self, report: Report | None, copying: _Copying, plans: Mapping[str, TablePlan]) -> bool:
        """One worker report recorded; False for the skip of a chunk of a table already given up."""
        if isinstance(report, Rows):
            self._progress.rows(report.table, report.rows)
        elif isinstance(report, ChunkDone):
            _settled(copying.assigned, report.worker, report.table, report.index)
            copying.rows += report.rows
            copying.server_json_rows += report.rows if report.server_json else 0
            copying.rendered_rows += report.rows if report.rendered else 0
            self._state.chunk_done(report.table, report.index, report.rows)
            self._progress.chunk_done(report.table)
        elif isinstance(report, ChunkSkipped):
            _settled(copying.assigned, report.worker, report.table, report.index)
            if report.table in copying.dropped or report.table in copying.deferred:
                return False
            self._give_up(report, copying, plans)
        elif isinstance(report, Failed):
            where = f" ({report.table}, chunk {report.index})" if report.table is not None else ""
            raise SnapshotError(
                f"snapshot worker {report.worker} failed{where}: {report.message}. The slot is kept at its "
                "consistent point; fix the cause and restart: the chunks not yet copied are then read while streaming."
            )
        return True

    def _give_up(self, report: ChunkSkipped, copying: _Copying, plans: Mapping[str, TablePlan]) -> None:
        """A table the copy cannot finish: dropped meanwhile (left out), or rewritten (left to DBLog)."""
        kept = collections.deque(t for t in copying.pending if t.table.name != report.table)
        copying.pending.clear()
        copying.pending.extend(kept)
        if report.reason == "dropped":
            copying.dropped.add(report.table)
            self._progress.set_state(report.table, "dropped")
            log.error(
                "snapshot_table_dropped",
                table=report.table,
                error=report.message,
                fix="remove the table from 'tables'; the start-up checks refuse it until then",
            )
            return
        if plans[report.table].chunking is Chunking.CTID:
            raise SnapshotError(
                f"{report.message}. {report.table} has no primary key or unique NOT NULL index, so its "
                "copy cannot be finished while streaming. Fix: add a primary key and restart, or drop the "
                f"slot {self._slot} to take a new snapshot."
            )
        copying.deferred.add(report.table)
        self._progress.set_state(report.table, "deferred")
        log.warning(
            "snapshot_table_deferred",
            table=report.table,
            reason=report.message,
            then="finished with DBLog while streaming",
        )

    def _replace_dead(self, workers: dict[int, _Worker], copying: _Copying) -> None:
        """A dead worker's chunks go back to the front of the queue (less what its transaction committed)."""
        for wid in list(workers):
            process, _ = workers[wid]
            if process.is_alive():
                continue
            del workers[wid]
            lost = copying.assigned.pop(wid, [])
            log.error(
                "snapshot_worker_died",
                worker=wid,
                exitcode=process.exitcode,
                chunks=[t.chunk.id for t in lost],
                workers_left=len(workers),
            )
            for task, copied in self._committed_by(wid, lost):
                lost.remove(task)
                copying.rows += copied
                self._state.chunk_done(task.table.name, task.chunk.index, copied)
                self._progress.chunk_done(task.table.name)
            copying.pending.extendleft(reversed(lost))  # another worker holds the same snapshot
            if not workers:
                raise SnapshotInterrupted(
                    "every snapshot worker died; the next start streams from the slot's consistent point and "
                    "copies the remaining chunks while streaming"
                )

    def _copy_ended(self, copying: _Copying, point: Lsn) -> _Copied:
        """The snapshot state says how the copy ended: done, or copying with tables left to DBLog."""
        complete = not copying.deferred
        dropped = sorted(copying.dropped)
        if complete:
            self._state.set_initial(InitialStatus.DONE, consistent_point=str(point), rows=copying.rows, dropped=dropped)
        else:
            self._state.set_initial(
                InitialStatus.COPYING,
                consistent_point=str(point),
                rows=copying.rows,
                dropped=dropped,
                deferred=sorted(copying.deferred),
            )
        self._state.flush()
        return _Copied(copying.rows, complete, tuple(dropped), copying.server_json_rows, copying.rendered_rows)

    # -- workers --------------------------------------------------------------------------------

    def _committed_by(self, worker: int, lost: list[ChunkTask]) -> list[tuple[ChunkTask, int]]:
        """Exactly once: of a dead worker's chunks, those its transaction committed after all (it died
        inside ``commit_transaction``), with their rows. Its transactional id is fenced first, which ends
        its open transaction either way; the progress topic then says which."""
        if not lost or not self._output.transactional:
            return []
        self._output.fence(worker)
        stored = self._state.store.load()
        found = [(task, stored.get(chunk_key(task.table.name, task.chunk.index))) for task in lost]
        return [(task, int(value["rows"])) for task, value in found if value is not None]

    def _fence(self, worker_ids: Collection[int]) -> None:
        """Exactly once, on the way out of a failed or stopped copy: end the killed workers' open
        transactions now, so that read_committed consumers are not held up until the next start."""
        if not self._output.transactional:
            return
        for wid in worker_ids:
            try:
                self._output.fence(wid)
            except SinkError as e:
                log.warning("snapshot_fence_failed", worker=wid, error=str(e), then="the next start fences it")

    @staticmethod
    def _stop_workers(
        workers: Mapping[int, _Worker],
    ) -> None:
        for _, tasks in workers.values():
            tasks.put(None)
        for process, _ in workers.values():
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(5)

    @staticmethod
    def _kill(
        workers: Mapping[int, _Worker],
    ) -> None:
        for process, _ in workers.values():
            if process.is_alive():
                process.kill()
        for process, _ in workers.values():
            process.join(5)


def _hand_out(workers: Mapping[int, _Worker], copying: _Copying) -> None:
    """Two chunks per worker: the next waits in its queue while it drains the current one."""
    for wid, (_, tasks) in workers.items():
        while len(copying.assigned[wid]) < _QUEUE_DEPTH and copying.pending:
            task = copying.pending.popleft()
            copying.assigned[wid].append(task)
            tasks.put(task)


def _settled(assigned: dict[int, list[ChunkTask]], worker: int, table: str, index: int) -> None:
    queue_ = assigned.get(worker, [])
    for i, task in enumerate(queue_):
        if task.table.name == table and task.chunk.index == index:
            del queue_[i]
            return
