"""cdc.sink.position: a record's bytes (and headers) in, its position out; and kafka.position_headers on the
serializers' records: every record kind with the headers on and off, the envelope saying the same."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.event import ChangeEvent, MessageEvent, Op, TruncateEvent
from cdc.lsn import Lsn
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.position import (
    PositionError,
    RecordPosition,
    from_headers,
    from_source,
    json_source,
    parse_sequence,
    record_position,
)
from tests.support.avro import avro, decode
from tests.support.customers import ALICE_AFTER, ALICE_BEFORE, COMMIT_US, CUSTOMERS

LSN, COMMIT, XID = 24023128, 24023200, 771


def change(op: Op, before: dict[str, Any] | None, after: dict[str, Any] | None, ordinal: int = 3) -> ChangeEvent:
    return ChangeEvent(op, CUSTOMERS, before, after, Lsn(COMMIT), Lsn(LSN), XID, ordinal, COMMIT_US)


def json_serializer(*, headers: bool, schemas: bool = False) -> JsonSerializer:
    s = JsonSerializer(JsonSettings(topic_prefix="shop", database="inventory", schemas_enable=schemas), lambda _: 2)
    s.position_headers = headers
    return s


# --- bytes in, values out ------------------------------------------------------------------------------


def test_the_sequence_gives_the_commit_lsn_and_the_lsn() -> None:
    assert parse_sequence('["24023200","24023128"]') == (24023200, 24023128)
    assert parse_sequence('[null,"650"]') == (None, 650)  # a message outside a transaction
    assert parse_sequence(None) == (None, None)


@pytest.mark.parametrize("text", ['["24023200"]', '[24023200,"1"]', '["0/16A2A90","1"]', "not json", '{"a":1}'])
def test_a_sequence_of_another_shape_is_a_clear_error(text: str) -> None:
    with pytest.raises(PositionError, match=r"source.sequence is .*not a JSON array of two decimal LSN strings"):
        parse_sequence(text)


def test_headers_give_every_field_and_ignore_other_headers() -> None:
    headers = [
        ("cdc.lsn", b"650"),
        ("cdc.commit_lsn", b"700"),
        ("cdc.txid", b"42"),
        ("cdc.ordinal", b"3"),
        ("id", b"e-1"),
    ]
    assert from_headers(headers) == RecordPosition(650, 700, 42, 3)
    assert from_headers(None) == RecordPosition()
    with pytest.raises(PositionError, match="header cdc.lsn is '0/28A', not a decimal"):
        from_headers([("cdc.lsn", b"0/28A")])


def test_a_source_block_gives_all_but_the_ordinal() -> None:
    source = {"lsn": 650, "txId": 42, "sequence": '["700","650"]'}
    assert from_source(source) == RecordPosition(650, 700, 42, None)
    assert from_source({"lsn": None, "txId": None, "sequence": '[null,"650"]'}) == RecordPosition(650, None, None, None)
    with pytest.raises(PositionError, match="source.lsn is '650', not an integer"):
        from_source({"lsn": "650", "sequence": None})


def test_a_value_that_is_not_an_envelope_is_a_clear_error() -> None:
    with pytest.raises(PositionError, match="no 'source' object"):
        json_source(b'{"id":"e-1","payload":{}}')
    with pytest.raises(PositionError, match="not JSON"):
        json_source(b"\x00\x00\x00\x00\x01")


@pytest.mark.parametrize("schemas", [False, True])
def test_a_json_record_without_headers_has_its_position_in_the_envelope(schemas: bool) -> None:
    [record] = json_serializer(headers=False, schemas=schemas).records(change(Op.CREATE, None, ALICE_AFTER))

    assert record.headers == ()
    assert record_position(record.headers, record.value) == RecordPosition(LSN, COMMIT, XID, None)


def test_with_headers_the_headers_and_the_envelope_agree() -> None:
    [record] = json_serializer(headers=True).records(change(Op.CREATE, None, ALICE_AFTER))

    assert record_position(record.headers, record.value) == RecordPosition(LSN, COMMIT, XID, 3)
    assert from_source(json_source(record.value or b"")) == RecordPosition(LSN, COMMIT, XID, None)


def test_an_avro_record_without_headers_has_its_position_in_the_decoded_source() -> None:
    s, registry = avro()
    s.position_headers = False
    [record] = s.records(change(Op.CREATE, None, ALICE_AFTER))

    value = decode(registry, record.value)
    assert record.headers == ()
    assert record_position(record.headers, None, source=value["source"]) == RecordPosition(LSN, COMMIT, XID, None)


# --- every record kind, headers off ---------------------------------------------------------------------


def test_without_headers_a_delete_is_an_envelope_with_the_position_then_a_bare_tombstone() -> None:
    delete, tombstone = json_serializer(headers=False).records(change(Op.DELETE, ALICE_BEFORE, None))

    assert delete.headers == () and tombstone.headers == () and tombstone.value is None
    assert record_position(delete.headers, delete.value) == RecordPosition(LSN, COMMIT, XID, None)
    assert record_position(tombstone.headers, tombstone.value) == RecordPosition()  # it follows its delete event


def test_without_headers_a_key_change_keeps_debeziums_key_headers_only() -> None:
    moved = {**ALICE_AFTER, "id": 2}
    records = json_serializer(headers=False).records(change(Op.UPDATE, ALICE_AFTER, moved))

    assert [[name for name, _ in r.headers] for r in records] == [
        ["__debezium.newkey"],
        ["__debezium.newkey"],
        ["__debezium.oldkey"],
    ]
    assert [record_position(r.headers, r.value).lsn for r in records] == [LSN, None, LSN]


def test_without_headers_truncate_markers_keep_their_marker_header() -> None:
    event = TruncateEvent((CUSTOMERS,), False, False, Lsn(COMMIT), Lsn(LSN), XID, 4, COMMIT_US)
    markers = json_serializer(headers=False).records(event)

    assert [r.headers for r in markers] == [(("cdc.truncate", b"1"),)] * 2
    assert {record_position(r.headers, r.value) for r in markers} == {RecordPosition(LSN, COMMIT, XID, None)}


def test_without_headers_a_logical_message_has_its_position_in_its_source() -> None:
    transactional = MessageEvent("p", b"x", True, Lsn(700), Lsn(650), 42, 3, COMMIT_US)
    bare = MessageEvent("p", b"x", False, None, Lsn(651), None, 0, None)
    s = json_serializer(headers=False)
    [a], [b] = s.records(transactional), s.records(bare)

    assert a.headers == b.headers == ()
    assert record_position(a.headers, a.value) == RecordPosition(650, 700, 42, None)
    assert record_position(b.headers, b.value) == RecordPosition(651, None, None, None)


def test_with_headers_every_record_of_a_transaction_shares_its_commit_headers() -> None:
    s = json_serializer(headers=True)
    first = s.records(change(Op.CREATE, None, ALICE_AFTER, ordinal=1))
    second = s.records(change(Op.CREATE, None, {**ALICE_AFTER, "id": 2}, ordinal=2))

    assert [from_headers(r.headers) for r in first + second] == [
        RecordPosition(LSN, COMMIT, XID, 1),
        RecordPosition(LSN, COMMIT, XID, 2),
    ]


def test_the_setting_reaches_the_serializer_the_daemon_and_its_snapshot_workers_build() -> None:
    from cdc.config import Config
    from cdc.pipeline.wiring import make_serializer

    base: dict[str, Any] = {
        "source": {"dsn": "host=db dbname=shop", "slot": "s", "publication": "p"},
        "tables": ["public.customers"],
        "topic_prefix": "shop",
    }
    for setting, expected in ((None, False), (True, True), (False, False)):
        kafka: dict[str, Any] = {"bootstrap_servers": "k:9092"}
        if setting is not None:
            kafka["position_headers"] = setting
        serializer = make_serializer(Config.model_validate({**base, "kafka": kafka}), lambda _: 1)
        [record] = serializer.records(change(Op.CREATE, None, ALICE_AFTER))
        assert bool(record.headers) is expected, setting
