"""What the pipeline talks to: the start-up decision, the initial snapshot, and DBLog while streaming.

The pipeline's part, in order:

1. ``prepare(slot_state)`` after the checks, the topics and the publication, in
   place of creating the slot: it drops, creates, snapshots and resumes as the
   mode says (``cdc.snapshot.modes``) and returns the ``StartupPlan``; when
   ``plan.stream`` is False (``initial_only``) the daemon stops there.
2. ``start()`` right after START_REPLICATION (with ``messages 'true'``), and
   ``reset()`` at the start of every new replication session.
3. ``on_event(event)`` for every event in commit order (TxBegin, changes,
   truncates, messages, TxCommit); what it returns is produced right away,
   inside the current transaction. Watermark messages (``is_watermark``) are
   not published. For a row change the pipeline calls
   ``coordinator.on_row(event)`` instead, the same work without the
   dispatch (it is per row; a row change never returns rows).
4. ``stop()`` when the pipeline stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence

import psycopg
import structlog

from cdc.catalog import TableInfo
from cdc.event import ChangeEvent, Event, PgType, TableSchema
from cdc.lsn import Lsn
from cdc.replication import ReplicationStream
from cdc.sink.record import Record
from cdc.snapshot.config import SnapshotConfig, SnapshotMode
from cdc.snapshot.errors import SnapshotError, SnapshotRefused
from cdc.snapshot.incremental import IncrementalCoordinator
from cdc.snapshot.initial import InitialResult, InitialSnapshot
from cdc.snapshot.modes import SlotState, StartupPlan, decide
from cdc.snapshot.output import COORDINATOR, OutputFactory
from cdc.snapshot.plan import Chunking, describe_table
from cdc.snapshot.progress import ProgressTracker, SnapshotProgress
from cdc.snapshot.reader import IncrementalReader, new_job
from cdc.snapshot.state import InitialStatus, Job, JobRange, JobReason, MemoryStore, ProgressStore, SnapshotState

log = structlog.get_logger("cdc.snapshot")

__all__ = ["Snapshots"]


class Snapshots:
    def __init__(
        self,
        settings: SnapshotConfig,
        *,
        conninfo: str,
        slot: str,
        tables: Mapping[str, TableInfo],
        output: OutputFactory,
        store: ProgressStore,
        types: Mapping[int, PgType] | None = None,
        topics_holding_records: Callable[[Collection[str]], Collection[str]] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        alive: Callable[[], None] | None = None,
        log_format: str = "json",
        log_level: str = "info",
        slot_failover: bool | None = None,
        in_transactions: bool = False,
        described: Callable[[Sequence[TableSchema], Lsn], object] | None = None,
    ) -> None:
        """``topics_holding_records(table names) -> table names`` says which tables' topics already hold
        records (a new initial snapshot marks those truncated first); None: assume none do.
        ``should_stop`` is polled while the initial snapshot runs; ``alive`` is called there several
        times a second (the health endpoint's heartbeat). ``in_transactions`` (exactly once): a DBLog
        chunk's progress is produced with its rows, in the same Kafka transaction (``released_progress``).
        ``described``: the initial snapshot's (``InitialSnapshot``)."""
        self.settings = settings
        self._conninfo = conninfo
        self._slot = slot
        self._slot_failover = slot_failover  # the slot this creates: ReplicationStream's slot_failover
        self._tables = dict(tables)
        self._output = output
        self._types = dict(types or {})
        self._described = described
        self._holding = topics_holding_records
        self._should_stop = should_stop
        self._alive = alive
        self._log_format = log_format
        self._log_level = log_level
        self.state = SnapshotState(store)
        if self._fence_interrupted_copy():
            self.state = SnapshotState(store)  # read again: what the fenced transactions left is final now
        self.coordinator = IncrementalCoordinator(slot)
        self.reader = IncrementalReader(
            conninfo=conninfo,
            slot=slot,
            coordinator=self.coordinator,
            state=self.state,
            tables=self._tables,
            settings=settings,
            types=self._types,
            in_transactions=in_transactions,
        )
        self._in_transactions = in_transactions
        self.initial_result: InitialResult | None = None
        self._initial_progress: ProgressTracker | None = None

    # -- start-up -------------------------------------------------------------------------------

    def _fence_interrupted_copy(self) -> bool:
        """Exactly once: an initial copy that did not finish may have left chunk transactions open (workers
        killed with the daemon). Fencing each worker's transactional id ends them: aborted, or committed if
        they were committing, with their chunk records. Until then read_committed consumers would wait on
        them, and the chunks' records would not be known."""
        initial = self.state.initial()
        if not self._output.transactional or initial is None:
            return False
        if initial.get("status") not in (InitialStatus.PENDING, InitialStatus.COPYING):
            return False
        count = max(int(initial.get("workers") or 0), self.settings.workers)
        for worker in (*range(count), COORDINATOR):
            self._output.fence(worker)
        log.info("snapshot_interrupted_copy_fenced", workers=count)
        return True

    def prepare(self, slot_state: SlotState) -> StartupPlan:
        initial = self.state.initial()
        plan = decide(
            self.settings.snapshot_mode,
            slot_state,
            initial.get("status") if initial else None,
            self.state.covered(),
            {name: info.oid for name, info in self._tables.items()},
            slot_name=self._slot,
            on_slot_missing=self.settings.on_slot_missing,
        )
        log.info(
            "snapshot_startup",
            mode=self.settings.mode,
            slot=slot_state.value,
            reason=plan.reason,
            initial=plan.initial or plan.without_slot,
            resume=plan.resume,
            new_tables=list(plan.new_tables),
        )
        if plan.initial or plan.create_slot:  # a new slot: signals already written are not for it
            self.reader.ignore_existing_signals()
        if plan.drop_slot:
            self._drop_slot()
        if plan.initial or plan.without_slot:
            result = self._initial(with_slot=not plan.without_slot)
            if not result.complete:
                self._resume()
            if result.dropped:
                raise SnapshotError(
                    f"{', '.join(result.dropped)} dropped while the initial snapshot ran; the snapshot of the other "
                    "tables is complete and recorded. Fix: remove the dropped tables from 'tables' and restart: "
                    "streaming starts from the snapshot's consistent point."
                )
        elif plan.create_slot:
            stream = ReplicationStream(self._conninfo, slot_failover=self._slot_failover)
            stream.connect()
            try:
                stream.create_slot(self._slot)
            finally:
                stream.close()
        if plan.resume:
            self._resume()
        for table in plan.new_tables:
            try:
                self.reader.request(table, JobReason.NEW_TABLE)
            except SnapshotRefused as e:
                raise SnapshotRefused(
                    f"{e}. The table was added to the configuration, so its existing rows must be copied while "
                    "streaming. Alternatively take a new initial snapshot of everything: run once with "
                    "snapshot.mode: always."
                ) from None
        if plan.baseline:
            self.state.cover({name: info.oid for name, info in self._tables.items()})
            self.state.flush()
        return plan

    def _initial(self, *, with_slot: bool) -> InitialResult:
        holding: Collection[str] = ()
        if self._holding is not None:
            holding = self._holding(list(self._tables))
        snapshot = InitialSnapshot(
            conninfo=self._conninfo,
            slot=self._slot,
            tables=self._tables,
            output=self._output,
            # Without a slot (initial_only) nothing can resume: the slot's records are left alone.
            state=self.state if with_slot else SnapshotState(MemoryStore()),
            settings=self.settings,
            types=self._types,
            should_stop=self._should_stop,
            alive=self._alive,
            truncate_first=holding,
            with_slot=with_slot,
            slot_failover=self._slot_failover,
            log_format=self._log_format,
            log_level=self._log_level,
            described=self._described,
        )
        self._initial_progress = snapshot.progress
        self.initial_result = snapshot.run()
        if with_slot:
            self.reader.replace_jobs(self.state.jobs())  # the new snapshot forgot the previous slot's jobs
        return self.initial_result

    def _resume(self) -> None:
        """An interrupted initial snapshot: its chunks not recorded as copied become DBLog jobs, same bounds."""
        initial = self.state.initial() or {}
        dropped = set(initial.get("dropped") or ())
        plans = self.state.plans()
        covered: dict[str, int] = {}
        if not plans:  # interrupted before planning: every table, whole
            for name, whole in self._tables.items():
                self._require_key(name, "it was not copied before the snapshot was interrupted")
                self._add_job(new_job(whole, JobReason.RESUME_INITIAL, job_id=f"resume-{whole.oid}"))
                covered[name] = whole.oid
        for name, table_plan in plans.items():
            info = self._tables.get(name)
            if info is None or info.oid != table_plan.oid or name in dropped:
                continue  # no longer captured, or recreated (a new table then)
            done = self.state.done_chunks(name)
            undone = [c for c in table_plan.chunks() if c.index not in done]
            if not undone:
                continue
            if table_plan.chunking is Chunking.CTID:
                raise SnapshotError(
                    f"the initial snapshot of {name} was interrupted, and {name} has no primary key (nor a unique "
                    "index "
                    "over NOT NULL columns), so it cannot be finished while streaming. Fix: add a primary key and "
                    f"restart, or drop the slot (SELECT pg_drop_replication_slot('{self._slot}')) to take a new "
                    "snapshot."
                )
            ranges = [
                JobRange(c.keys.lower, c.keys.upper, resolved=c.keys.upper is not None)
                for c in undone
                if c.keys is not None
            ]
            job = new_job(info, JobReason.RESUME_INITIAL, ranges, job_id=f"resume-{info.oid}")
            job.key = table_plan.chunk_key
            self._add_job(job)
            covered[name] = info.oid
            log.info("snapshot_resume_planned", table=name, chunks_left=len(undone), chunks_done=len(done))
        if covered:
            self.state.cover(covered)
        self.state.set_initial(InitialStatus.RESUMED)
        self.state.flush()

    def _add_job(self, job: Job) -> None:
        self.state.save_job(job)
        self.reader.add(job)

    def _require_key(self, name: str, why: str) -> None:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            table = describe_table(conn, self._tables[name], self._types)
        if not table.keyed:
            raise SnapshotError(
                f"{name} must be copied while streaming ({why}) but has no primary key (nor a unique index over NOT "
                f"NULL columns). Fix: add a primary key and restart, or drop the slot "
                f"(SELECT pg_drop_replication_slot('{self._slot}')) to take a new snapshot."
            )

    def _drop_slot(self) -> None:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            for attempt in range(50):
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (self._slot,))
                    log.info("slot_dropped", slot=self._slot, reason="snapshot mode")
                    return
                except psycopg.errors.UndefinedObject:
                    return
                except psycopg.errors.ObjectInUse:  # a walsender of ours still exiting
                    if attempt == 49:
                        raise
                    time.sleep(0.2)

    def tables_changed(self, tables: Mapping[str, TableInfo], types: Mapping[int, PgType] | None = None) -> list[str]:
        """The table list changed while streaming (SIGHUP reload): tables the topics do not cover yet get a
        snapshot while streaming (none with ``no_data``). Returns them; a refused one is logged as an error."""
        self._tables = dict(tables)
        self._types.update(types or {})
        self.reader.set_tables(self._tables, self._types)
        covered = self.state.covered()
        added = sorted(name for name, info in self._tables.items() if covered.get(name) != info.oid)
        if self.settings.snapshot_mode is SnapshotMode.NO_DATA:
            self.state.cover({name: self._tables[name].oid for name in added})
            self.state.flush()
            return []
        for name in added:
            try:
                self.reader.request(name, JobReason.NEW_TABLE)
            except SnapshotRefused as e:
                log.error("snapshot_refused", table=name, error=str(e))
        return added

    # -- streaming ------------------------------------------------------------------------------

    def start(self) -> None:
        """The pipeline streams (with messages): run DBLog jobs and watch the signal table."""
        self.reader.start()

    def reset(self) -> None:
        """A new replication session begins."""
        self.coordinator.reset()

    def on_event(self, event: Event) -> list[ChangeEvent]:
        if self.reader.failure is not None:
            raise SnapshotError(self.reader.failure)
        return self.coordinator.on_event(event)

    def released_progress(self) -> Record | None:
        """After ``on_event`` of a watermark: with ``in_transactions``, the progress record of the chunk its
        high watermark released, to be produced right after the chunk's rows (in their transaction); else
        None."""
        window = self.coordinator.released()
        if window is None or not self._in_transactions or window.job_after is None:
            return None
        job: Job = window.job_after
        job.rows += window.emitted
        return self.state.job_record(job)

    def request(self, table: str) -> str:
        """A snapshot of ``table`` while streaming; returns the job id. SnapshotRefused says why not."""
        return self.reader.request(table, JobReason.REQUEST).id

    def stop(self) -> None:
        self.reader.stop()

    def progress(self) -> list[SnapshotProgress]:
        out = []
        if self._initial_progress is not None:
            out.append(self._initial_progress.read())
        out.append(self.reader.progress.read())
        return out
