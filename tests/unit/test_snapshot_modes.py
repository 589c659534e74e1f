"""cdc.snapshot.modes: what each snapshot mode does at start-up, for each state of the slot and the progress topic."""

from __future__ import annotations

import pytest

from cdc.catalog import StartupError
from cdc.snapshot.config import SnapshotMode
from cdc.snapshot.modes import SlotState, StartupPlan, decide
from cdc.snapshot.state import InitialStatus

TABLES = {"public.a": 1, "public.b": 2}


def plan(
    mode: SnapshotMode, slot: SlotState, status: str | None = None, covered: dict[str, int] | None = None
) -> StartupPlan:
    return decide(mode, slot, status, covered if covered is not None else {}, TABLES, slot_name="s")


@pytest.mark.parametrize("mode", [SnapshotMode.INITIAL, SnapshotMode.WHEN_NEEDED, SnapshotMode.ALWAYS])
def test_a_missing_slot_means_an_initial_snapshot_in_every_mode_that_copies(mode: SnapshotMode) -> None:
    p = plan(mode, SlotState.MISSING)
    assert p.initial and p.stream and not p.drop_slot and not p.create_slot


def test_no_data_creates_the_slot_without_copying_and_covers_the_tables() -> None:
    p = plan(SnapshotMode.NO_DATA, SlotState.MISSING)
    assert p.create_slot and p.baseline and not p.initial and p.stream


@pytest.mark.parametrize("status", [InitialStatus.PENDING, InitialStatus.COPYING])
def test_an_interrupted_initial_snapshot_resumes_while_streaming(status: str) -> None:
    p = plan(SnapshotMode.INITIAL, SlotState.PRESENT, status, {"public.a": 1, "public.b": 2})
    assert p.resume and p.stream and not p.initial and not p.drop_slot


def test_tables_added_to_the_configuration_get_a_snapshot_while_streaming() -> None:
    p = plan(SnapshotMode.INITIAL, SlotState.PRESENT, InitialStatus.DONE, {"public.a": 1})
    assert p.new_tables == ("public.b",) and not p.initial and not p.resume


def test_a_table_dropped_and_recreated_counts_as_a_new_table() -> None:
    p = plan(SnapshotMode.WHEN_NEEDED, SlotState.PRESENT, InitialStatus.DONE, {"public.a": 1, "public.b": 99})
    assert p.new_tables == ("public.b",)


def test_a_slot_the_progress_topic_knows_nothing_about_is_taken_as_it_is() -> None:
    p = plan(SnapshotMode.INITIAL, SlotState.PRESENT)
    assert p.baseline and not p.initial and not p.new_tables and not p.resume


def test_always_drops_an_existing_slot_and_snapshots_again() -> None:
    p = plan(SnapshotMode.ALWAYS, SlotState.PRESENT, InitialStatus.DONE, TABLES)
    assert p.drop_slot and p.initial


def test_when_needed_replaces_an_invalidated_slot_with_a_new_snapshot() -> None:
    p = plan(SnapshotMode.WHEN_NEEDED, SlotState.LOST, InitialStatus.DONE, TABLES)
    assert p.drop_slot and p.initial


@pytest.mark.parametrize("mode", [SnapshotMode.INITIAL, SnapshotMode.NO_DATA])
def test_an_invalidated_slot_stops_the_other_modes_with_the_fix(mode: SnapshotMode) -> None:
    with pytest.raises(StartupError, match="when_needed"):
        plan(mode, SlotState.LOST)


def test_initial_only_copies_without_a_slot_and_does_not_stream() -> None:
    for slot in SlotState:
        p = plan(SnapshotMode.INITIAL_ONLY, slot)
        assert p.without_slot and not p.stream and not p.drop_slot and not p.create_slot


def test_no_data_never_resumes_or_copies_new_tables() -> None:
    p = plan(SnapshotMode.NO_DATA, SlotState.PRESENT, InitialStatus.COPYING, {"public.a": 1})
    assert not p.resume and not p.new_tables and not p.initial


@pytest.mark.parametrize("mode", [SnapshotMode.INITIAL, SnapshotMode.NO_DATA])
def test_a_slot_that_existed_and_is_gone_stops_with_what_may_be_missing(mode: SnapshotMode) -> None:
    with pytest.raises(StartupError, match=r"slot s is gone, but it existed.*snapshot.on_slot_missing: snapshot"):
        plan(mode, SlotState.MISSING, InitialStatus.DONE, {"public.a": 1})


def test_on_slot_missing_snapshot_copies_again_a_slot_that_existed() -> None:
    p = decide(
        SnapshotMode.INITIAL,
        SlotState.MISSING,
        InitialStatus.DONE,
        {"public.a": 1},
        TABLES,
        slot_name="s",
        on_slot_missing="snapshot",
    )
    assert p.initial and p.stream and p.reason == "slot_lost_snapshot"


def test_when_needed_snapshots_a_slot_that_existed_without_being_asked() -> None:
    p = plan(SnapshotMode.WHEN_NEEDED, SlotState.MISSING, InitialStatus.DONE, {"public.a": 1})
    assert p.initial and p.reason == "slot_missing"


def test_a_snapshot_stopped_before_its_slot_was_created_starts_over() -> None:
    p = plan(SnapshotMode.INITIAL, SlotState.MISSING, InitialStatus.PENDING)
    assert p.initial and p.reason == "slot_missing"
