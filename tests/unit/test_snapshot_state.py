"""cdc.snapshot.state and progress: what survives a restart, and how progress reads."""

from __future__ import annotations

import io

from cdc.snapshot.plan import Chunking, TablePlan
from cdc.snapshot.progress import ProgressTracker
from cdc.snapshot.state import InitialStatus, Job, JobRange, JobReason, MemoryStore, SnapshotState


def test_a_new_initial_snapshot_forgets_the_previous_ones_records() -> None:
    store = MemoryStore()
    state = SnapshotState(store)
    state.save_plan(TablePlan("public.t", 1, Chunking.KEY, (), 0, 1, 10))
    state.chunk_done("public.t", 0, 10)
    state.save_job(Job("j", "public.t", 1, JobReason.SIGNAL, [JobRange(None, None)]))
    state.cover({"public.t": 1})
    state.begin_initial()
    reloaded = SnapshotState(store)
    assert reloaded.plans() == {} and reloaded.done_chunks("public.t") == {} and reloaded.jobs() == []
    assert reloaded.covered() == {}
    initial = reloaded.initial()
    assert initial is not None and initial["status"] == InitialStatus.PENDING


def test_plans_chunks_coverage_jobs_and_signals_read_back_after_a_restart() -> None:
    store = MemoryStore()
    state = SnapshotState(store)
    plan = TablePlan("public.t", 1, Chunking.KEY, (("5",),), 0, 2, 10)
    state.save_plan(plan)
    state.chunk_done("public.t", 1, 4)
    state.cover({"public.t": 1})
    job = Job("j", "public.t", 1, JobReason.RESUME_INITIAL, [JobRange(("5",), None, last=("7",), resolved=True)])
    state.save_job(job)
    state.handle_signal("sig", "rejected", "unknown table")
    state.set_initial(InitialStatus.COPYING, consistent_point="0/10")
    again = SnapshotState(store)
    assert again.plans() == {"public.t": plan}
    assert again.done_chunks("public.t") == {1: 4}
    assert again.covered() == {"public.t": 1}
    assert [j.to_json() for j in again.jobs()] == [job.to_json()]
    assert again.jobs()[0].ranges[0].remaining().lower == ("7",)
    assert again.signal_handled("sig") and not again.signal_handled("other")
    assert (again.initial() or {})["consistent_point"] == "0/10"


def test_a_continuous_tracker_runs_while_a_table_is_copied_and_a_new_snapshot_of_it_counts_from_zero() -> None:
    now = [0.0]
    tracker = ProgressTracker("incremental", clock=lambda: now[0], stream=io.StringIO(), continuous=True)
    assert tracker.read().running is False  # no snapshot requested yet
    tracker.add_table("public.t", 1000, 2)
    now[0] = 2.0
    tracker.rows("public.t", 1000)
    tracker.chunk_done("public.t")
    assert tracker.read().running is True
    tracker.set_state("public.t", "done")
    now[0] = 4.0
    p = tracker.read()
    assert p.running is False and p.eta_s == 0.0
    tracker.add_table("public.t", 1000, 2)  # the same table snapshotted again, weeks later
    now[0] = 6.0
    tracker.rows("public.t", 300)
    p = tracker.read()
    assert p.running is True and p.rows_done == 300 and p.tables[0].chunks_done == 0
    assert p.rows_per_s >= 0.0


def test_progress_reports_rows_rate_and_eta_per_table() -> None:
    now = [0.0]
    tracker = ProgressTracker("initial", clock=lambda: now[0], stream=io.StringIO())
    tracker.add_table("public.t", 1000, 4)
    tracker.add_table("public.u", 0, 1)
    now[0] = 2.0
    tracker.rows("public.t", 400)
    tracker.chunk_done("public.t")
    p = tracker.read()
    assert p.rows_done == 400 and p.rows_estimated == 1000 and p.rows_per_s == 200.0
    assert p.eta_s == 3.0 and p.running
    t = p.tables[0]
    assert (t.table, t.state, t.chunks_done, t.chunks_total, t.fraction) == ("public.t", "copying", 1, 4, 0.4)
    tracker.finish()
    assert tracker.read().running is False and tracker.read().eta_s == 0.0
