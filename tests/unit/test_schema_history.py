"""Schema history: the version records' bytes, the look-up by position, the decoder's Relation
announcements and the stage that publishes a version only where the column types changed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.spool import Spool
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import (
    ChangeEvent,
    Column,
    Event,
    MessageEvent,
    RelationEvent,
    TableInfo,
    TableSchema,
    TruncateEvent,
    TxBegin,
    TxCommit,
)
from cdc.lsn import Lsn
from cdc.pipeline.history import SchemaHistory, SchemaHistoryStage
from cdc.pipeline.stages import Chain, Deliver, Stage
from cdc.schema_history import BEGINNING, History, SchemaHistoryError, SchemaVersion, decode, topic_for
from cdc.sink.record import Record
from tests.support.pgoutput import begin, commit, insert, relation, stream_commit, stream_start, tuple_data

ORDERS = 16390
C1, E1 = 0x1_0000_1000, 0x1_0000_1100
C2, E2 = 0x1_0000_2000, 0x1_0000_2100
TS = 777_000_000_000_000
NUMERIC, INT4, INT8, VARCHAR, TEXT = 1700, 23, 20, 1043, 25


def numeric_mod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


def orders_columns(total: tuple[int, int] = (12, 2)) -> tuple[tuple[int, str, int, int], ...]:
    return ((1, "id", INT4, -1), (0, "total", NUMERIC, numeric_mod(*total)), (0, "code", VARCHAR, 10 + 4))


def schema(total: tuple[int, int] = (12, 2), qty: int = INT4) -> TableSchema:
    return TableSchema(
        "public",
        "orders",
        (
            Column("id", BUILTIN_TYPES[INT4], -1, key=True, nullable=False),
            Column("total", BUILTIN_TYPES[NUMERIC], numeric_mod(*total)),
            Column("qty", BUILTIN_TYPES[qty], -1),
            Column("code", BUILTIN_TYPES[VARCHAR], 20 + 4),
            Column("note", BUILTIN_TYPES[TEXT], -1),
        ),
        ORDERS,
    )


TABLES = {
    "public.orders": TableInfo("public", "orders", ORDERS, "d", ("id",), ("id", "total", "code"), frozenset({"id"}))
}


# --- the records ---------------------------------------------------------------------------------


def test_a_version_record_is_keyed_by_table_and_position_and_states_each_columns_type_modifier() -> None:
    version = SchemaVersion.of(schema((14, 3)), (0x16A2A90, 4))

    assert version.key() == b'{"table":"public.orders","commit_lsn":23734928,"ordinal":4}'
    value = orjson.loads(version.value())
    assert value["format"] == 1 and value["position"] == "0/16A2A90:4" and value["relation_id"] == ORDERS
    assert (value["table"], value["schema"], value["name"]) == ("public.orders", "public", "orders")
    assert value["columns"][1] == {
        "name": "total",
        "type": "numeric",
        "type_schema": "pg_catalog",
        "type_oid": NUMERIC,
        "typmod": numeric_mod(14, 3),
        "precision": 14,
        "scale": 3,
        "length": None,
        "key": False,
        "nullable": True,
    }
    assert value["columns"][0]["key"] is True and value["columns"][0]["scale"] is None
    assert value["columns"][3]["length"] == 20 and value["columns"][4]["length"] is None
    assert version.scales() == {"total": 3}


def test_a_record_decodes_to_the_version_it_was_made_from_and_a_tombstone_to_none() -> None:
    version = SchemaVersion.of(schema((16, 4), qty=INT8), (C1, 2))

    assert decode(version.key(), version.value()) == version
    assert decode(version.key(), None) is None
    assert topic_for("shop") == "shop.__cdc_schema"


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        (None, b"[1]", "not a JSON object"),
        (None, b"{not json", "not a schema version"),
        (None, b'{"format": 2, "columns": []}', "format 2, this reader knows format 1: upgrade the reader"),
        (None, b'{"format": 1, "table": "public.orders"}', "not a schema version \\(KeyError"),
        (None, b'{"format": 1, "table": "t", "commit_lsn": "1", "ordinal": 0, "columns": []}', "'1' is not an integer"),
        (b'{"table":"public.other","commit_lsn":0,"ordinal":0}', None, "is not its value's table and position"),
    ],
)
def test_a_record_the_daemon_does_not_write_is_a_schema_history_error(
    key: bytes | None, value: bytes | None, error: str
) -> None:
    if value is None:
        value = SchemaVersion.of(schema(), BEGINNING).value()
    with pytest.raises(SchemaHistoryError, match=error):
        decode(key, value)


# --- the look-up ---------------------------------------------------------------------------------


def test_the_version_in_force_is_the_last_at_or_before_the_position() -> None:
    first = SchemaVersion.of(schema(), BEGINNING)
    wider = SchemaVersion.of(schema((14, 3)), (C1, 3))
    narrower = SchemaVersion.of(schema((12, 2)), (C2, 1))
    history = History.of([narrower, first, wider])  # in any order

    assert history.in_force("public.orders", (C1, 2)) is first
    assert history.in_force("public.orders", (C1, 3)) is wider  # from its own position on
    assert history.in_force("public.orders", (C1, 1 << 40)) is wider
    assert history.in_force("public.orders", (C2, 1)) is narrower
    assert history.in_force("public.other", (C2, 1)) is None
    assert History.of([wider]).in_force("public.orders", (C1, 2)) is None  # before the first: none
    assert [v.position for v in history.versions("public.orders")] == [BEGINNING, (C1, 3), (C2, 1)]


def test_a_version_published_again_at_its_position_replaces_the_one_there() -> None:
    history = History.of([SchemaVersion.of(schema(), (C1, 1))])
    again = SchemaVersion.of(schema((14, 3)), (C1, 1))
    history.add(again)

    assert history.versions("public.orders") == (again,)


# --- the decoder's announcements -----------------------------------------------------------------


def feed(decoder: ChangeDecoder, *payloads: bytes) -> list[Event]:
    events: list[Event] = []
    for n, payload in enumerate(payloads):
        events.extend(decoder.feed(payload, Lsn(0x100 + n)))
    return events


def test_a_relation_inside_a_transaction_is_announced_from_the_ordinal_of_the_next_change() -> None:
    decoder = ChangeDecoder(TABLES, {}, announce_relations=True)
    row = tuple_data(b"1", b"57.95", b"c1")

    events = feed(
        decoder,
        begin(C1, TS, 900),
        relation(ORDERS, "public", "orders", columns=orders_columns()),
        insert(ORDERS, row),
        relation(ORDERS, "public", "orders", columns=orders_columns((14, 3))),
        insert(ORDERS, row),
        commit(C1, E1, TS),
    )

    announced = [e for e in events if isinstance(e, RelationEvent)]
    assert [(e.commit_lsn, e.ordinal, e.xid) for e in announced] == [(C1, 1, 900), (C1, 2, 900)]
    assert [c.precision_scale for c in announced[1].table.columns if c.name == "total"] == [(14, 3)]
    changes = [e for e in events if isinstance(e, ChangeEvent)]
    assert [c.ordinal for c in changes] == [1, 2] and changes[1].table is announced[1].table
    # placed by LSN too (records written without cdc.ordinal): above the first change's, and the second's is
    # above it (the server sends the Relation message itself with LSN 0: only changes carry theirs)
    assert (announced[0].after_lsn, announced[1].after_lsn) == (0, changes[0].lsn) and changes[1].lsn > changes[0].lsn
    last = events[-1]
    assert isinstance(last, TxCommit)
    assert last == TxCommit(900, Lsn(C1), Lsn(E1), last.commit_ts_us, 2)  # announcements take no ordinal


def test_without_announce_relations_a_relation_only_updates_the_cache() -> None:
    events = feed(
        ChangeDecoder(TABLES, {}),
        begin(C1, TS, 900),
        relation(ORDERS, "public", "orders", columns=orders_columns()),
        insert(ORDERS, tuple_data(b"1", b"1.00", b"c")),
        commit(C1, E1, TS),
    )

    assert [type(e) for e in events] == [TxBegin, ChangeEvent, TxCommit]


def test_a_recreated_table_is_announced_after_its_truncate_marker() -> None:
    decoder = ChangeDecoder(TABLES, {}, announce_relations=True)

    events = feed(
        decoder,
        begin(C1, TS, 900),
        relation(ORDERS + 1, "public", "orders", columns=orders_columns()),
        insert(ORDERS + 1, tuple_data(b"1", b"1.00", b"c")),
        commit(C1, E1, TS),
    )

    assert [type(e) for e in events] == [TxBegin, TruncateEvent, RelationEvent, ChangeEvent, TxCommit]
    marker, announced, change = events[1], events[2], events[3]
    assert (
        isinstance(marker, TruncateEvent) and isinstance(announced, RelationEvent) and isinstance(change, ChangeEvent)
    )
    assert (marker.ordinal, announced.ordinal, change.ordinal) == (1, 2, 2)
    assert announced.after_lsn == 0  # no row change before it in its transaction: it holds for all of them


def test_a_streamed_transaction_announces_its_relations_at_its_commit(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool") as spool:
        decoder = ChangeDecoder(TABLES, {}, spool=spool, announce_relations=True)
        events = feed(
            decoder,
            stream_start(901, True),
            relation(ORDERS, "public", "orders", columns=orders_columns((14, 3)), xid=901),
            insert(ORDERS, tuple_data(b"1", b"1.000", b"c"), xid=901),
            b"E",
            stream_commit(901, C2, E2, TS),
        )

    assert [type(e) for e in events] == [TxBegin, RelationEvent, ChangeEvent, TxCommit]
    announced = events[1]
    assert isinstance(announced, RelationEvent) and (announced.commit_lsn, announced.ordinal, announced.xid) == (
        C2,
        1,
        901,
    )
    assert announced.after_lsn == 0


# --- the stage -----------------------------------------------------------------------------------


class Sent:
    def __init__(self) -> None:
        self.records: list[tuple[Record, str]] = []

    def send(self, record: Record, describe: str) -> None:
        self.records.append((record, describe))


def stage_with(*versions: SchemaVersion) -> tuple[SchemaHistoryStage, SchemaHistory, Sent]:
    sent = Sent()
    history = SchemaHistory(topic_for("shop"), History.of(versions))
    return SchemaHistoryStage(history, sent), history, sent  # type: ignore[arg-type]  # only send is used


def test_the_stage_publishes_a_version_only_where_the_types_differ_from_the_one_in_force() -> None:
    stage, history, sent = stage_with(SchemaVersion.of(schema(), BEGINNING))

    assert stage.process(RelationEvent(schema(), Lsn(C1), 1, 900)) is None  # the same types: nothing
    assert sent.records == []
    assert stage.process(RelationEvent(schema((14, 3)), Lsn(C1), 4, 900, C1 - 40)) is None
    assert stage.process(RelationEvent(schema((14, 3)), Lsn(C2), 1, 901, C2 - 80)) is None  # in force since C1:4

    [(record, describe)] = sent.records
    assert (record.topic, record.partition, describe) == ("shop.__cdc_schema", 0, "schema history")
    assert record.key == b'{"table":"public.orders","commit_lsn":%d,"ordinal":4}' % C1
    assert decode(record.key, record.value) == SchemaVersion.of(schema((14, 3)), (C1, 4), C1 - 40)
    assert orjson.loads(record.value or b"")["after_lsn"] == C1 - 40  # for records without cdc.ordinal: above it
    assert history.history.in_force("public.orders", (C2, 1)) == SchemaVersion.of(schema((14, 3)), (C1, 4), C1 - 40)


def test_a_replay_publishes_the_same_records_as_the_first_delivery() -> None:
    # A restart: the versions were loaded; the replay's Relation messages state the types in force at
    # their positions (the historic catalog), the older ones first. The transaction that changed the
    # types publishes its version again, the same record at the same key: a source transaction sent again
    # produces what it produced the first time, which exactly once counts on to resume inside one it had
    # committed to Kafka in parts. Unchanged types publish nothing.
    changed = SchemaVersion.of(schema((14, 3)), (C2, 2), C2 - 60)
    stage, _, sent = stage_with(SchemaVersion.of(schema(), BEGINNING), changed)

    stage.process(RelationEvent(schema(), Lsn(C1), 1, 900))
    stage.process(RelationEvent(schema((14, 3)), Lsn(C2), 2, 901, C2 - 60))
    stage.process(RelationEvent(schema((14, 3)), Lsn(C2 + 1), 1, 902, C2 - 30))

    [(record, _)] = sent.records
    assert (record.key, record.value) == (changed.key(), changed.value())


def test_a_table_without_any_version_gets_one_and_an_int_to_bigint_change_is_a_version() -> None:
    stage, _, sent = stage_with()

    stage.process(RelationEvent(schema(), Lsn(C1), 1, 900))
    stage.observe(schema(qty=INT8), (C2, 3), C2 - 10)  # a DBLog chunk read after ALTER ... TYPE bigint

    assert [orjson.loads(r.value or b"")["position"] for r, _ in sent.records] == ["1/1000:1", "1/2000:3"]


def test_a_record_without_an_ordinal_is_placed_by_its_lsn_within_a_versions_commit() -> None:
    old = SchemaVersion.of(schema(), BEGINNING, 0)
    inside = SchemaVersion.of(schema((14, 3)), (C1, 2), C1 - 50)  # an ALTER between two changes of commit C1
    legacy = SchemaVersion.of(schema((16, 4)), (C2, 3))  # written before versions recorded after_lsn
    history = History.of([old, inside, legacy])

    assert history.in_force_for("public.orders", C1, None, C1 - 50) == old  # the change before the ALTER
    assert history.in_force_for("public.orders", C1, None, C1 - 49) == inside
    assert history.in_force_for("public.orders", C1, 1, C1 - 10) == old  # an ordinal, when there is one, decides
    assert history.in_force_for("public.orders", C2, None, C2 - 100) == legacy  # taken as in force in its commit
    assert history.in_force_for("public.orders", C1 - 1, None, C1 - 2) == old


def test_the_stage_passes_every_other_event_on_and_sees_no_rows() -> None:
    stage, _, sent = stage_with()
    message = MessageEvent("p", b"x", True, Lsn(C1), Lsn(C1), 900, 1, TS)
    begin_event = TxBegin(900, Lsn(C1), TS)

    assert stage.process(message) is message and stage.process(begin_event) is begin_event
    assert stage.sees_rows("public.orders") is False and stage.typed_rows("public.orders") is False
    assert sent.records == []


class Spy(Stage):
    def __init__(self) -> None:
        self.seen: list[object] = []

    def process(self, event: Event) -> Event | None:
        self.seen.append(event)
        return event


def test_in_the_chain_an_announcement_stops_at_the_stage_and_rows_never_meet_it() -> None:
    stage, _, sent = stage_with()
    spy = Spy()
    serializer, stats = SimpleNamespace(records=lambda e: []), SimpleNamespace(events=Counter())
    deliver = Deliver(serializer, sent, stats)  # type: ignore[arg-type]  # stand-ins: the stage never reaches them
    chain = Chain([stage, spy], deliver)

    chain.other(RelationEvent(schema(), Lsn(C1), 1, 900))

    assert spy.seen == [] and len(sent.records) == 1
    assert chain.rows_of("public.orders") == (spy.process,)  # the row path holds the other stages only


def test_an_initial_snapshot_publishes_the_types_of_its_exported_snapshot_where_they_changed_since_start_up() -> None:
    # publish_catalog read numeric(12,2); an ALTER to (14,3) committed before the slot exported its
    # snapshot, so the snapshot's rows (at the consistent point, ordinals from 1) hold the new scale.
    written: list[Sequence[Record]] = []
    history = SchemaHistory(
        topic_for("shop"), History.of([SchemaVersion.of(schema(), BEGINNING)]), write_now=written.append
    )

    assert history.publish_snapshot([schema()], Lsn(C1)) == []  # unchanged: nothing is written
    assert written == []
    [version] = history.publish_snapshot([schema((14, 3))], Lsn(C1))

    assert version == SchemaVersion.of(schema((14, 3)), (C1, 0), 0)  # for every row of its commit
    assert [(r.key, r.value) for r in written[0]] == [(version.key(), version.value())]
    assert history.history.in_force("public.orders", (C1, 1)) == version
    older = history.history.in_force("public.orders", (C1 - 1, 7))
    assert older is not None and older.scales()["total"] == 2  # older records keep theirs
