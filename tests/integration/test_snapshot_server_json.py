"""The initial snapshot's server-built JSON (cdc.snapshot.sqljson) against the serializer it stands in for.

Keys must be byte for byte what the stream writes for the same row (compaction keeps one record per
key bytes), so the comparisons here are of bytes, not of parsed JSON.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from cdc.catalog import describe_tables
from cdc.config import TableConfig
from cdc.event import Op, change_event
from cdc.lsn import Lsn
from cdc.sink.errors import SerializationError
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.kafka import TopicSpec, admin_client, ensure_topics, producer_config
from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.copytext import row_parser
from cdc.snapshot.initial import InitialSnapshot
from cdc.snapshot.output import JsonKafkaOutput
from cdc.snapshot.plan import Chunk, chunk_select, describe_table, session_setup
from cdc.snapshot.progress import ProgressTracker
from cdc.snapshot.sqljson import json_query
from cdc.snapshot.state import MemoryStore, SnapshotState

pytestmark = pytest.mark.integration

NOW_NS = 1_732_000_000_123_456_789

TYPED = """
CREATE TYPE mood AS ENUM ('sad', 'happy', 'with "quote"');
CREATE TABLE typed (
    id bigint PRIMARY KEY, i2 int2, i4 int4, o oid, flag bool, t text, vc varchar(30), bp char(5), nm name,
    js json, jb jsonb, u uuid, b bytea, n0 numeric(18,0), n2 numeric(12,2), n6 numeric(18,6),
    ts timestamptz, ts3 timestamptz(3), ts0 timestamptz(0), tsn timestamp, tsn3 timestamp(3), d date, e mood
);
"""

# Values at the edges of each SQL encoding; the rows with a NaN, an infinity or a year outside 1..9999
# are not covered by the SQL and must come out exactly as the ordinary path makes them.
VALUES = {
    "i2": ["-32768", "32767", "0"],
    "i4": ["-2147483648", "2147483647"],
    "o": ["0", "4294967295"],
    "flag": ["true", "false"],
    "t": [
        "''",
        "'plain'",
        "E'quote \" back \\\\ slash'",
        "E'tab\\there'",
        "E'line\\nfeed\\rreturn'",
        "E'ctl \\x01\\x1f \\x7f'",
        "'unicode é ü 日本 🎉'",
        "E'\\\\N'",
        "'\\'",
    ],
    "vc": ["'x'", "E'a\\\\b'"],
    "bp": ["'ab'", "'abcde'"],
    "nm": ["'some_name'"],
    "js": ['\'{"a": [1, "x\\\\ty"], "b": null}\'', "'\"s\"'", "'[ 1 , 2 ]'"],
    "jb": [r"""'{"k": "v\"w", "n": 1.50, "t": "a\tb"}'""", "'null'", "'[]'"],
    "u": ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'"],
    "b": ["''", "E'\\\\x00ff5c0a'", "decode(repeat('ab', 100), 'hex')"],
    "n0": ["0", "-1", "999999999999999999", "-999999999999999999", "127", "128", "-128", "-129", "32767", "32768"],
    "n2": [
        "0",
        "0.01",
        "-0.01",
        "1.27",
        "1.28",
        "-1.28",
        "-1.29",
        "327.67",
        "327.68",
        "-327.68",
        "-327.69",
        "83886.07",
        "83886.08",
        "9999999999.99",
        "-9999999999.99",
        "21474836.47",
        "21474836.48",
    ],
    "n6": ["0.000001", "-0.000001", "999999999999.999999", "-999999999999.999999", "12.5"],
    "ts": [
        "'2024-05-01 12:34:56.789+02'",
        "'1970-01-01 00:00:00+00'",
        "'1969-12-31 23:59:59.999999+00'",
        "'0001-01-01 00:00:00+00'",
        "'9999-12-31 23:59:59.999999+00'",
        "'infinity'",
        "'-infinity'",
        "'0044-03-15 12:00:00+00 BC'",
        "'12000-01-01 00:00:00+00'",
    ],
    "ts3": ["'2024-05-01 12:34:56.7+00'", "'2024-05-01 12:34:56+00'", "'1900-02-03 04:05:06.123+00'"],
    "ts0": ["'2024-05-01 12:34:56+00'", "'1999-12-31 23:59:59+00'"],
    "tsn": [
        "'2024-05-01 12:34:56.789012'",
        "'1969-12-31 23:59:59.5'",
        "'0001-01-01 00:00:00'",
        "'infinity'",
        "'0100-01-01 00:00:00 BC'",
    ],
    "tsn3": ["'1969-12-31 23:59:59.999'", "'2024-05-01 00:00:00.001'", "'-infinity'"],
    "d": [
        "'1970-01-01'",
        "'1969-12-31'",
        "'2024-02-29'",
        "'0001-01-01'",
        "'infinity'",
        "'-infinity'",
        "'0300-01-01 BC'",
        "'5874897-12-31'",
    ],
    "e": ["'sad'", "'with \"quote\"'"],
}


def _fill(dsn: str) -> int:
    """One row per edge value (the other columns NULL), plus one row with every column NULL."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TYPED)
        row_id = 0
        for column, values in VALUES.items():
            for value in values:
                row_id += 1
                conn.execute(f"INSERT INTO typed (id, {column}) VALUES ({row_id}, {value})")  # test data, literal
        row_id += 1
        conn.execute(f"INSERT INTO typed (id) VALUES ({row_id})")
        conn.execute(
            "INSERT INTO typed SELECT g, 1, 2, 3, true, 't' || g, 'v', 'c', 'n', '{}', '{}', "
            "gen_random_uuid(), '\\x01', g, g / 100.0, g / 1e6, now(), now(), now(), "
            "localtimestamp, localtimestamp, current_date, 'happy' FROM generate_series(1000, 1999) g"
        )
    return row_id + 1000


@pytest.mark.parametrize("schemas_enable", [False, True])
def test_server_built_json_is_byte_for_byte_the_serializers(pg_dsn: str, schemas_enable: bool) -> None:
    rows = _fill(pg_dsn)
    settings = JsonSettings(topic_prefix="srv", database="db", schemas_enable=schemas_enable)
    serializer = JsonSerializer(settings, lambda _topic: 3, clock_ns=lambda: NOW_NS)
    point, xid, commit_ts = Lsn(0x1_0000_0028), 4242, 1_700_000_000_000_000
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        session_setup(conn, "test")
        info = describe_tables(conn, [TableConfig(name="public.typed")])["public.typed"]
        table = describe_table(conn, info)
        parts = serializer.read_parts(table.schema, commit_ts, point, xid)
        query = json_query(table, parts, settings)
        assert query is not None, "every column of this table has an SQL encoding"
        whole = Chunk(table.name, 0, None)
        parse = row_parser(table.schema.columns, where=table.name)

        expected: dict[bytes, bytes] = {}
        for line in _copy_lines(conn, chunk_select(table, whole)):
            event = change_event(
                Op.READ, table.schema, None, parse(line), point, point, xid, 1, commit_ts, True, frozenset()
            )
            (record,) = serializer.records(event)
            assert record.value is not None, "a snapshot read is never a tombstone"
            expected[record.key] = record.value

        covered = uncovered = 0
        tail = parts.value_middle + parts.times(NOW_NS) + parts.value_end
        for line in _copy_lines(conn, query.copy(whole)):
            key, _, rest = line.partition(b"\t")
            if key == b"\\N":
                uncovered += 1
                row = parse(rest.partition(b"\t")[2])
                event = change_event(
                    Op.READ, table.schema, None, row, point, point, xid, 1, commit_ts, True, frozenset()
                )
                (record,) = serializer.records(event)
                assert expected[record.key] == record.value
                continue
            covered += 1
            after = rest[: rest.index(b"\t")].replace(b"\\\\", b"\\")
            key = parts.key_head + key.replace(b"\\\\", b"\\") + parts.key_end
            assert key in expected, f"key {key!r} is not a key the serializer writes"
            assert parts.value_head + after + tail == expected[key], json.loads(expected[key])[
                "payload" if schemas_enable else "after"
            ]
        # A NaN cannot be written under decimal_handling='precise': the SQL leaves the row to the ordinary
        # path, whose error names the column and the fix.
        conn.execute("UPDATE typed SET n2 = 'NaN' WHERE id = 1")
        (line,) = [x for x in _copy_lines(conn, query.copy(whole)) if x.startswith(b"\\N\t\\N\t1\t")]
        event = change_event(
            Op.READ,
            table.schema,
            None,
            parse(line.split(b"\t", 2)[2]),
            point,
            point,
            xid,
            1,
            commit_ts,
            True,
            frozenset(),
        )
        with pytest.raises(SerializationError, match="column 'n2' .* NaN .* decimal_handling"):
            serializer.records(event)
    assert covered + uncovered == len(expected) == rows
    # the SQL leaves these to Python: +-infinity (4 timestamps, 2 dates), timestamptz years outside 1..9999 (2)
    assert uncovered == 8


def _copy_lines(conn: psycopg.Connection[Any], statement: Any) -> list[bytes]:
    lines = []
    with conn.cursor().copy(statement) as copy:
        while data := copy.read():
            lines.append(bytes(data[:-1]))
    return lines


@pytest.mark.parametrize("position_headers", [True, False], ids=["position_headers", "no_position_headers"])
def test_the_snapshot_writes_the_same_records_with_and_without_server_json(
    services: Any, pg_dsn: str, topic_prefix: str, consume_all: Any, position_headers: bool
) -> None:
    # typed values (Python's JSON), the row codec from the COPY text (the default), the server's JSON; each
    # with the cdc.* position headers or, as kafka.position_headers: false makes them, none on any path
    rows = _fill(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        tables = describe_tables(conn, [TableConfig(name="public.typed")])
    seen: list[dict[bytes, tuple[dict[str, Any], list[tuple[str, bytes]]]]] = []
    for n, (server_json, render_rows) in enumerate([(False, False), (False, True), (True, True)]):
        prefix = f"{topic_prefix}{n}"
        topic = f"{prefix}.public.typed"
        partitions = ensure_topics(admin_client(services.kafka_bootstrap, {}), [TopicSpec(topic, 3, 1)])
        output = JsonKafkaOutput(
            JsonSettings(topic_prefix=prefix, database="db"),
            partitions,
            producer_config(services.kafka_bootstrap, {}, 1_000_000),
            1_000_000,
            render_rows=render_rows,
            position_headers=position_headers,
        )
        snapshot = InitialSnapshot(
            conninfo=pg_dsn,
            slot=f"srvjson_{n}_{topic_prefix[-8:]}",
            tables=tables,
            output=output,
            state=SnapshotState(MemoryStore()),
            progress=ProgressTracker("initial", log_interval_s=30),
            settings=SnapshotConfig(workers=2, chunk_rows=300, progress_bar=False, server_json=server_json),
        )
        result = snapshot.run()
        assert result.rows == rows
        assert result.server_json_rows == (rows if server_json else 0)
        assert result.rendered_rows == (rows if render_rows and not server_json else 0)
        records: dict[bytes, tuple[dict[str, Any], list[tuple[str, bytes]]]] = {}
        for m in consume_all([topic], timeout=60.0):
            value = json.loads(m.value())
            for member in ("ts_ms", "ts_us", "ts_ns"):  # processing time
                del value[member]
            for member in ("name", "ts_ms", "ts_us", "ts_ns", "lsn", "sequence", "txId"):  # differ between the runs
                del value["source"][member]
            assert m.key() not in records, "each row once"
            records[m.key()] = (value, sorted(m.headers() or []))
        seen.append(records)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'srvjson%'"
            )
    ordinary, rendered, server = seen
    assert len(ordinary) == len(rendered) == len(server) == rows
    assert ordinary.keys() == rendered.keys() == server.keys()
    names = ["cdc.commit_lsn", "cdc.lsn", "cdc.ordinal", "cdc.txid"] if position_headers else []
    for key, (value, headers) in ordinary.items():
        assert server[key][0] == rendered[key][0] == value, key
        assert [h for h, _ in server[key][1]] == [h for h, _ in rendered[key][1]] == [h for h, _ in headers] == names
