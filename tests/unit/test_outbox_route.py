"""The outbox without services: configuration, rows and messages in, records (or reasons) out, the helper's SQL."""

from __future__ import annotations

import textwrap
import uuid
from typing import Any

import fastavro
import orjson
import psycopg
import pytest

from cdc.config import ConfigError, load_config
from cdc.event import ChangeEvent, Column, MessageEvent, Op, PgType, TableSchema
from cdc.lsn import Lsn
from cdc.outbox.config import OutboxConfig, OutboxExtra, OutboxTable
from cdc.outbox.publish import MESSAGE_STATEMENT, PublishError, insert_statement, message_content, publish
from cdc.outbox.route import Malformed, OutboxEvent, OutboxRouter, avro_event_schema
from cdc.sink.avro import decode_wire

BASE = """
source:
  dsn: postgresql://cdc@127.0.0.1:5432/shop
  slot: shop_cdc
  publication: shop_cdc
tables:
  - public.customers
kafka:
  bootstrap_servers: 127.0.0.1:9092
topic_prefix: shop
"""


def load(tmp_path: Any, extra: str) -> Any:
    p = tmp_path / "cdc.yaml"
    p.write_text(textwrap.dedent(BASE) + textwrap.dedent(extra))
    return load_config(p)


# -- configuration -------------------------------------------------------------------------------


def test_an_outbox_section_with_defaults_loads(tmp_path):
    c = load(tmp_path, "outbox:\n  tables: [public.outbox]\n  message_prefix: app.events\n")
    box = c.outbox.tables[0]
    assert box.name == "public.outbox" and not box.produce_change_topic
    assert box.columns.required() == {
        "id": "id",
        "aggregate_type": "aggregatetype",
        "aggregate_id": "aggregateid",
        "type": "type",
        "payload": "payload",
    }
    assert c.outbox.topic_for("order", "shop") == "shop.outbox.event.order"  # two daemons' events never share a topic
    assert (
        c.outbox.on_error == "dead_letter" and c.outbox.enabled
    )  # one poison row must not stop the database's capture
    assert c.outbox_dead_letter_topic == f"{c.topic_prefix}.outbox.dead_letter"


def test_no_outbox_section_means_the_outbox_is_off(tmp_path):
    assert not load(tmp_path, "").outbox.enabled


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("outbox:\n  tabels: []\n", r"outbox\.tabels: unknown key"),
        ("outbox:\n  message_prefix: cdc.wm\n", r"outbox\.message_prefix: .*watermarks"),
        ("outbox:\n  topic: events\n", r"outbox\.topic: .*must contain \{aggregate_type\}"),
        ("outbox:\n  topic: '{prefix}.{aggregate_type}'\n", r"outbox\.topic: .*unknown placeholder \{prefix\}"),
        ("outbox:\n  topic: 'a b.{aggregate_type}'\n", r"outbox\.topic: .*may hold only"),
        ("outbox:\n  aggregate_types: []\n", r"outbox\.aggregate_types: .*empty list"),
        ("outbox:\n  aggregate_types: ['bad type']\n", r"outbox\.aggregate_types: .*bad type"),
        ("outbox:\n  on_error: drop\n", r"outbox\.on_error: Input should be 'fail' or 'dead_letter'"),
        ("outbox:\n  tables: [public.customers]\n", r"public\.customers is also under 'tables'"),
        ("outbox:\n  tables: [public.o, public.o]\n", r"outbox: .*tables: listed more than once: public\.o"),
        (
            "outbox:\n  tables: [{name: o, columns: {payload: type}}]\n",
            r"outbox\.tables\.0\.columns: .*two roles: type",
        ),
        (
            "outbox:\n  tables: [{name: o, columns: {payload_column: p}}]\n",
            r"outbox\.tables\.0\.columns\.payload_column: unknown key",
        ),
        (
            "outbox:\n  tables: [{name: o, extra: [{column: tenant, placement: header, name: id}]}]\n",
            r"outbox\.tables\.0: .*header name id is reserved",
        ),
        (
            "outbox:\n  tables: [{name: o, extra: [{column: aggregateid, placement: envelope}]}]\n",
            r"outbox\.tables\.0: .*aggregateid already plays a role",
        ),
        (
            "outbox:\n  tables: [{name: o, extra: [{column: tenant, placement: body}]}]\n",
            r"outbox\.tables\.0\.extra\.0\.placement: Input should be 'header' or 'envelope'",
        ),
    ],
)
def test_outbox_mistakes_are_explained_with_their_key_path(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, extra)


def test_dead_letter_mode_with_a_dead_letter_topic_loads(tmp_path):
    c = load(tmp_path, "limits: {dead_letter_topic: dlq}\noutbox:\n  on_error: dead_letter\n  message_prefix: ev\n")
    assert c.outbox.on_error == "dead_letter"


# -- rows and messages to records ----------------------------------------------------------------

TEXT = PgType(25, "text")
JSONB = PgType(3802, "jsonb")
UUID = PgType(2950, "uuid")


def outbox_schema(payload: PgType = JSONB, extra: tuple[str, ...] = ()) -> TableSchema:
    cols = [
        Column("id", UUID, key=True),
        Column("aggregatetype", TEXT),
        Column("aggregateid", TEXT),
        Column("type", TEXT),
        Column("payload", payload),
        *(Column(e, TEXT) for e in extra),
    ]
    return TableSchema("public", "outbox", tuple(cols))


EVENT_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")


def row_event(op: Op = Op.CREATE, payload_type: PgType = JSONB, extra: tuple[str, ...] = (), **row: Any) -> ChangeEvent:
    after = {
        "id": EVENT_ID,
        "aggregatetype": "order",
        "aggregateid": "42",
        "type": "OrderPlaced",
        "payload": '{"total": "9.90"}',
        **row,
    }
    return ChangeEvent(
        op,
        outbox_schema(payload_type, extra),
        after if op is Op.DELETE else None,
        None if op is Op.DELETE else after,
        Lsn(0x500),
        Lsn(0x400),
        77,
        1,
        1_700_000_000_000_000,
    )


def router(**settings: Any) -> OutboxRouter:
    tables = settings.pop("tables", [{"name": "public.outbox"}])
    cfg = OutboxConfig(tables=tables, message_prefix="app.events", **settings)
    return OutboxRouter(cfg, "shop")


def test_an_insert_becomes_a_record_keyed_by_aggregate_id_with_the_payload_as_stored():
    r = router(topic="{topic_prefix}.outbox.{aggregate_type}")
    ev = r.from_row(r.tables["public.outbox"], row_event())
    assert isinstance(ev, OutboxEvent)
    rec = r.record(ev)
    assert rec.topic == "shop.outbox.order"
    assert rec.key == b"42"
    assert rec.value == b'{"total": "9.90"}'  # byte for byte what the server sent
    headers = dict(rec.headers)
    assert headers["id"] == str(EVENT_ID).encode()
    assert headers["eventType"] == b"OrderPlaced" and headers["aggregateType"] == b"order"
    assert headers["cdc.lsn"] == b"%d" % 0x400 and headers["cdc.txid"] == b"77"


def test_updates_deletes_and_snapshot_reads_of_the_outbox_are_ignored():
    r = router()
    box = r.tables["public.outbox"]
    assert r.from_row(box, row_event(Op.UPDATE)) is None
    assert r.from_row(box, row_event(Op.DELETE)) is None
    assert r.from_row(box, row_event(Op.READ)) is None


def test_extra_columns_go_to_headers_or_into_the_envelope():
    r = router(
        tables=[
            OutboxTable(
                name="public.outbox",
                extra=[
                    OutboxExtra(column="tenant", placement="header"),
                    OutboxExtra(column="trace", placement="envelope", name="traceId"),
                ],
            )
        ]
    )
    ev = r.from_row(r.tables["public.outbox"], row_event(extra=("tenant", "trace"), tenant="acme", trace="t-1"))
    assert isinstance(ev, OutboxEvent)
    rec = r.record(ev)
    assert dict(rec.headers)["tenant"] == b"acme"
    assert rec.value is not None
    assert orjson.loads(rec.value) == {"payload": {"total": "9.90"}, "traceId": "t-1"}


@pytest.mark.parametrize(
    ("row", "payload_type", "reason"),
    [
        ({"aggregateid": None}, JSONB, "missing_aggregate_id"),
        ({"aggregateid": ""}, JSONB, "missing_aggregate_id"),
        ({"aggregatetype": None}, JSONB, "missing_aggregate_type"),
        ({"type": ""}, JSONB, "missing_type"),
        ({"payload": None}, JSONB, "missing_payload"),
        ({"payload": "{not json"}, TEXT, "payload_not_json"),
        ({"aggregatetype": "order lines"}, JSONB, "aggregate_type_not_a_topic"),
    ],
)
def test_a_malformed_row_says_why_and_keeps_the_row(row, payload_type, reason):
    r = router()
    bad = r.from_row(r.tables["public.outbox"], row_event(payload_type=payload_type, **row))
    assert isinstance(bad, Malformed)
    assert bad.reason == reason
    assert "public.outbox" in bad.describe() and "LSN 0/400" in bad.describe()
    dead = r.dead_letter(bad, "dlq")
    assert dead.topic == "dlq" and dead.key  # never a null key
    body = orjson.loads(dead.value or b"")
    assert body["reason"] == reason and body["from"] == "public.outbox" and body["lsn"] == 0x400
    assert body["row"]["id"] == str(EVENT_ID)  # the whole row travels: nothing vanishes
    assert dict(dead.headers)["cdc.dead_letter.reason"] == reason.encode()


def test_a_text_payload_holding_json_is_accepted():
    r = router()
    ev = r.from_row(r.tables["public.outbox"], row_event(payload_type=TEXT, payload="[1, 2]"))
    assert isinstance(ev, OutboxEvent) and r.record(ev).value == b"[1, 2]"


def test_an_aggregate_type_outside_the_allowed_list_is_malformed():
    r = router(aggregate_types=["customer"])
    bad = r.from_row(r.tables["public.outbox"], row_event())
    assert isinstance(bad, Malformed) and bad.reason == "aggregate_type_not_allowed"
    assert r.startup_topics() == ["shop.outbox.event.customer"]


def message(content: bytes | str, transactional: bool = True, prefix: str = "app.events") -> MessageEvent:
    data = content.encode() if isinstance(content, str) else content
    commit = Lsn(0x900) if transactional else None
    xid = 12 if transactional else None
    return MessageEvent(prefix, data, transactional, commit, Lsn(0x880), xid, 2, 1_700_000_000_000_000)


def test_a_transactional_message_routes_like_a_row():
    r = router()
    content = message_content("e-1", "order", "42", "OrderPlaced", {"total": 9.9}, {"tenant": "acme"})
    ev = r.from_message(message(content))
    assert isinstance(ev, OutboxEvent)
    rec = r.record(ev)
    assert (rec.topic, rec.key, rec.value) == ("shop.outbox.event.order", b"42", b'{"total":9.9}')
    headers = dict(rec.headers)
    assert headers["id"] == b"e-1" and headers["tenant"] == b"acme" and headers["cdc.commit_lsn"] == b"%d" % 0x900


def test_a_message_without_an_id_gets_one_from_its_lsn_the_same_every_time():
    r = router()
    body = '{"aggregate_type":"order","aggregate_id":7,"type":"X","payload":{}}'
    a, b = r.from_message(message(body)), r.from_message(message(body))
    assert isinstance(a, OutboxEvent) and isinstance(b, OutboxEvent)
    assert a.id == b.id and uuid.UUID(a.id) and a.aggregate_id == "7"


@pytest.mark.parametrize(
    ("content", "transactional", "reason"),
    [
        ('{"aggregate_type":"order","aggregate_id":"1","type":"X","payload":{}}', False, "not_transactional"),
        ("not json at all", True, "message_not_json_object"),
        (b"\xff\xfe", True, "message_not_json_object"),
        ("[1, 2]", True, "message_not_json_object"),
        ('{"aggregate_type":"order","type":"X","payload":{}}', True, "missing_aggregate_id"),
        ('{"aggregate_type":"order","aggregate_id":"1","payload":{}}', True, "missing_type"),
        ('{"aggregate_type":"order","aggregate_id":"1","type":"X"}', True, "missing_payload"),
        (
            '{"aggregate_type":"order","aggregate_id":"1","type":"X","payload":1,"headers":{"id":"x"}}',
            True,
            "bad_headers",
        ),
    ],
)
def test_a_malformed_message_says_why_and_keeps_the_content(content, transactional, reason):
    r = router()
    bad = r.from_message(message(content, transactional))
    assert isinstance(bad, Malformed) and bad.reason == reason
    body = orjson.loads(r.dead_letter(bad, "dlq").value or b"")
    assert body["message"]["prefix"] == "app.events"
    assert ("content" in body["message"]) or ("content_base64" in body["message"])


def test_avro_values_are_registered_records_with_the_payload_as_a_json_string():
    class Registry:
        def __init__(self) -> None:
            self.subjects: dict[str, Any] = {}

        def register(self, subject: str, schema: Any, *, source: str | None = None) -> int:
            self.subjects[subject] = schema
            return 7

    registry = Registry()
    r = OutboxRouter(OutboxConfig(tables=[OutboxTable(name="public.outbox")]), "shop", registry=registry)
    ev = r.from_row(r.tables["public.outbox"], row_event())
    assert isinstance(ev, OutboxEvent)
    rec = r.record(ev)
    schema_id, body = decode_wire(rec.value or b"")
    assert schema_id == 7 and list(registry.subjects) == ["shop.outbox.event.order-value"]
    import io

    datum = fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(avro_event_schema(())), None)
    assert datum == {
        "id": str(EVENT_ID),
        "type": "OrderPlaced",
        "aggregate_type": "order",
        "aggregate_id": "42",
        "payload": '{"total": "9.90"}',
    }
    assert rec.key == b"42"  # plain text in both formats: one aggregate, one partition


# -- the helper's SQL ----------------------------------------------------------------------------


def test_the_insert_quotes_table_and_columns_as_identifiers():
    from cdc.outbox.config import OutboxColumns

    stmt = insert_statement('app."Events"', OutboxColumns(payload="body"), ("tenant",))
    text = stmt.as_string(None)
    assert text == (
        'INSERT INTO "app"."""Events""" ("id", "aggregatetype", "aggregateid", "type", "body", "tenant") '
        "VALUES (%s, %s, %s, %s, %s, %s)"
    )
    assert insert_statement("outbox").as_string(None).startswith('INSERT INTO "public"."outbox" (')


def test_the_message_is_transactional_and_its_content_a_json_object():
    assert MESSAGE_STATEMENT.as_string(None) == "SELECT pg_logical_emit_message(true, %s, %s::text)"
    assert orjson.loads(message_content("i", "order", "1", "T", {"a": 1}, {})) == {
        "id": "i",
        "aggregate_type": "order",
        "aggregate_id": "1",
        "type": "T",
        "payload": {"a": 1},
    }


def test_publish_refuses_an_autocommit_connection_outside_a_transaction():
    class Info:
        transaction_status = psycopg.pq.TransactionStatus.IDLE

    class Conn:
        autocommit = True
        info = Info()

    with pytest.raises(PublishError, match="autocommit"):
        publish(Conn(), "order", "1", "T", {})  # type: ignore[arg-type]  # a stand-in: refused before any query
    with pytest.raises(PublishError, match="non-empty"):
        publish(Conn(), "", "1", "T", {})  # type: ignore[arg-type]  # a stand-in: refused before any query
