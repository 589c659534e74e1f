"""Debezium's own consumers read the daemon's topics unchanged: Debezium's JDBC sink as the proof.

Kafka Connect standalone (the broker's version, jars from Maven Central through
``cdc.dev.connect``) runs ``io.debezium:debezium-connector-jdbc`` with JsonConverter
(``schemas.enable=true``) over the daemon's topics, with ``schemas_enable: true`` and precise
decimals. The sink writes into a second database on the same dev Postgres; each destination
table must then equal its source table row by row and column by column, except where the
sink's own mapping is lossy (``LOSSY`` names each exception, its reason and what the destination holds
instead); columns the sink gives another type (``RETYPED``) are compared through a cast of the source.

Beside it a FileStreamSink reads the side topics (heartbeats, transaction metadata, logical
messages) through the same converters: a record that is not valid against the schema it
carries kills that task.

One worker per module (its start-up is the slow part); one connector pair per test.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Json, Jsonb

from cdc import dev
from cdc.dev.connect import ConnectWorker, unique_name
from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration

TABLES = {
    "items": ["id"],  # int key
    "ledger": ["id"],  # bigint key
    "pairs": ["a", "b"],  # composite key (int, text)
    "kinds": ["id"],  # int key; more types (KIND_COLUMNS)
}
STANDARD = ("items", "ledger", "pairs")  # the three tables, columns COLUMNS
KEY_TYPES = {"items": "id int", "ledger": "id bigint", "pairs": "a int, b text", "kinds": "id int"}

# The non-key columns of every table: (name, type). NOT NULL columns make a delete's partial
# `before` (REPLICA IDENTITY DEFAULT) hold required fields the old tuple lacks; the nullable ones
# take the updates to and from NULL.
COLUMNS: list[tuple[str, str]] = [
    ("name", "text NOT NULL"),
    ("code", "varchar(20)"),
    ("price", "numeric(12,2) NOT NULL"),
    ("amount", "numeric"),
    ("flag", "boolean NOT NULL"),
    ("day", "date NOT NULL"),
    ("at", "timestamp"),
    ("at_tz", "timestamptz NOT NULL"),
    ("uid", "uuid NOT NULL"),
    ("doc", "jsonb NOT NULL"),
    ("data", "bytea NOT NULL"),
    ("nums", "int[] NOT NULL"),
    ("small", "int2 NOT NULL"),
    ("big", "int8 NOT NULL"),
    ("real4", "real"),
    ("dbl", "double precision NOT NULL"),
    ("clock", "time NOT NULL"),
    ("letter", "char(3)"),
    ("words", "text[]"),
    ("ratio", "numeric(6,3)"),
]
NULLABLE = [name for name, typ in COLUMNS if "NOT NULL" not in typ]

# More of the types the decoder converts, in a fourth table ("kinds", int key), NOT NULL so that the delete
# under DEFAULT carries the fallback of each.
KIND_COLUMNS: list[tuple[str, str]] = [
    ("span", "interval NOT NULL"),
    ("clock_tz", "timetz NOT NULL"),
    ("clock_ms", "time(3) NOT NULL"),
    ("at_ms", "timestamp(3) NOT NULL"),
    ("at_tz0", "timestamptz(0) NOT NULL"),
    ("addr", "inet NOT NULL"),
    ("net", "cidr NOT NULL"),
    ("mac", "macaddr NOT NULL"),
    ("cash", "money NOT NULL"),
    ("doc_xml", "xml NOT NULL"),
    ("flags", "bit(3) NOT NULL"),
    ("one_bit", "bit(1) NOT NULL"),
    ("vbits", "varbit(8) NOT NULL"),
    ("ints", "int4range NOT NULL"),
    ("objid", "oid NOT NULL"),
    ("label", "name NOT NULL"),
    ("mood", "mood NOT NULL"),
    ("plain_json", "json NOT NULL"),
    ("uids", "uuid[] NOT NULL"),
    ("doubles", "float8[] NOT NULL"),
]


def _kind_values(i: int) -> dict[str, Any]:
    return {
        "span": dt.timedelta(days=i, hours=3, microseconds=250),
        "clock_tz": dt.time(10, i % 60, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "clock_ms": dt.time(8, 30, i % 60, 123000),
        "at_ms": dt.datetime(2023, 12, 31, 23, 59, 58, 125000) + dt.timedelta(days=i),
        "at_tz0": dt.datetime(2024, 2, 29, 12, 0, i % 60, tzinfo=dt.UTC),
        "addr": f"10.0.0.{i}",
        "net": "192.168.0.0/24",
        "mac": f"08:00:2b:01:02:{i:02x}",
        "cash": Decimal(f"{i}.25"),
        "doc_xml": f"<a n='{i}'>x</a>",
        "flags": "101",
        "one_bit": "1",
        "vbits": "1101",
        "ints": f"[{i},{i + 10})",
        "objid": 4_000_000_000 + i,
        "label": f"name_{i}",
        "mood": "ok" if i % 2 else "sad",
        "plain_json": Json({"k": [i, None]}),
        "uids": [uuid.UUID(int=i), uuid.UUID(int=i + 1)],
        "doubles": [0.5 * i, -1.25],
    }


# Where the sink's own mapping loses information: column -> (reason, how the two sides are compared).
LOSSY: dict[str, tuple[str, Callable[[Any], Any]]] = {
    # column: (reason, what the destination holds for a source value)
    "amount": (
        "unconstrained numeric is io.debezium.data.VariableScaleDecimal, which Debezium's JDBC sink maps to "
        "double precision (for Debezium's own topics too)",
        float,
    ),
    "span": (
        "interval is io.debezium.time.MicroDuration (µs); the sink binds it as cast('<n> seconds' as interval) "
        "with whole seconds, dropping the sub-second part",
        lambda v: v - dt.timedelta(microseconds=v.microseconds),
    ),
    "vbits": (
        "varbit(8) is io.debezium.data.Bits with length 8; the sink writes all 8 bits, so '1101' becomes "
        "'00001101' (the value's own length is not in the record, for Debezium's topics either)",
        lambda v: v.zfill(8),
    ),
}
# Not lossy, but of another type in the destination (the sink maps these Connect types so): each is compared
# through the SQL expression on the source side that gives the destination's type.
RETYPED: dict[str, tuple[str, str]] = {
    "addr": ("inet is a plain string (its output text); the sink makes a text column", "host(addr)"),
    "net": ("cidr is a plain string; the sink makes a text column", "net::text"),
    "ints": ("int4range is a plain string; the sink makes a text column", "ints::text"),
    "cash": ("money is a Decimal(scale 2); the sink makes a numeric column", "cash::numeric"),
    "one_bit": ("bit(1) is a boolean, as in Debezium; the sink makes a boolean column", "one_bit = B'1'"),
}


def _values(i: int) -> dict[str, Any]:
    return {
        "name": f"name {i}",
        "code": f"C{i:04d}",
        "price": Decimal(f"{i * 10}.{i % 100:02d}"),
        "amount": Decimal(f"{i}.{i * 7}") if i % 3 else Decimal(-i),
        "flag": i % 2 == 0,
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=i),
        "at": dt.datetime(2024, 5, 1, 12, 34, 56, 789012) + dt.timedelta(hours=i),
        "at_tz": dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.UTC) + dt.timedelta(minutes=i),
        "uid": uuid.UUID(int=i * 7919),
        "doc": Jsonb({"i": i, "tags": ["a", "b"], "nested": {"ok": True}}),
        "data": bytes([i % 256, 0, 255, 1]),
        "nums": [i, -i, 0],
        "small": i % 30000,
        "big": 10_000_000_000 + i,
        "real4": 1.5 * i,
        "dbl": 2.25 * i,
        "clock": dt.time(1 + i % 20, 2, 3, 456000),
        "letter": "ab" if i % 2 else "xyz",
        "words": [f"w{i}", "two words"],
        "ratio": Decimal(f"{i % 999}.125"),
    }


def _key(table: str, i: int) -> dict[str, Any]:
    if table == "pairs":
        return {"a": i, "b": f"k{i}"}
    return {"id": 5_000_000_000 + i if table == "ledger" else i}


def _insert(conn: psycopg.Connection[Any], table: str, i: int, *, nulls: bool = False) -> None:
    row = {**_key(table, i), **(_kind_values(i) if table == "kinds" else _values(i))}
    if nulls:
        row.update(dict.fromkeys(NULLABLE))
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, row)),
        sql.SQL(", ").join(sql.Placeholder() * len(row)),
    )
    conn.execute(query, list(row.values()))


def _where(table: str, i: int) -> tuple[sql.Composable, list[Any]]:
    key = _key(table, i)
    cond = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in key)
    return cond, list(key.values())


def _update(conn: psycopg.Connection[Any], table: str, i: int, values: dict[str, Any]) -> None:
    cond, params = _where(table, i)
    sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in values)
    conn.execute(
        sql.SQL("UPDATE {} SET {} WHERE {}").format(sql.Identifier(table), sets, cond), [*values.values(), *params]
    )


def _delete(conn: psycopg.Connection[Any], table: str, i: int) -> None:
    cond, params = _where(table, i)
    conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(sql.Identifier(table), cond), params)


def _change_key(conn: psycopg.Connection[Any], table: str, i: int, new: int) -> None:
    _update(conn, table, i, _key(table, new))


def _columns_of(table: str) -> list[tuple[str, str]]:
    return KIND_COLUMNS if table == "kinds" else COLUMNS


def _create(conn: psycopg.Connection[Any], identity: str) -> None:
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    for table, key in TABLES.items():
        cols = ", ".join(f'"{name}" {typ}' for name, typ in _columns_of(table))
        conn.execute(f"CREATE TABLE {table} ({KEY_TYPES[table]}, {cols}, PRIMARY KEY ({', '.join(key)}))")
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY {identity}")


def _snapshot_rows(conn: psycopg.Connection[Any]) -> None:
    for table in STANDARD:
        for i in range(1, 7):
            _insert(conn, table, i, nulls=(i == 3))
    for i in range(1, 4):
        _insert(conn, "kinds", i)


def _stream_changes(conn: psycopg.Connection[Any]) -> None:
    """Inserts, updates to and from NULL, deletes, a key change per table, a TRUNCATE and rows after it."""
    for i in (4, 5):
        _insert(conn, "kinds", i)
    _update(conn, "kinds", 2, _kind_values(22))
    _delete(conn, "kinds", 3)
    _delete(conn, "kinds", 5)
    _change_key(conn, "kinds", 1, 101)
    for table in STANDARD:
        for i in (7, 8, 9):
            _insert(conn, table, i)
        _update(conn, table, 1, dict.fromkeys(NULLABLE))  # to NULL
        _update(conn, table, 3, {k: _values(33)[k] for k in NULLABLE})  # from NULL
        _update(conn, table, 2, {"name": "renamed", "price": Decimal("0.01"), "flag": True})
        _delete(conn, table, 4)  # a snapshot row
        _delete(conn, table, 8)  # a streamed row
        _change_key(conn, table, 5, 105)  # primary-key change
        _update(conn, table, 105, {"name": "after key change"})
    conn.execute("TRUNCATE items")
    for i in (201, 202, 203):
        _insert(conn, "items", i)
    _update(conn, "items", 201, {"code": None, "name": "after truncate"})
    _delete(conn, "items", 202)
    conn.execute("SELECT pg_logical_emit_message(true, 'compat', 'hello from the test')")


def _rows(dsn: str, table: str, columns: list[str], *, source: bool = False) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table's rows by key; ``source``: RETYPED columns read as the destination's type."""
    key = TABLES[table]
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (f"public.{table}",)).fetchone()
        if exists is None or exists[0] is None:
            return {}
        select = [
            sql.SQL(RETYPED[c][1] + " AS {}").format(sql.Identifier(c))
            if source and c in RETYPED
            else sql.Identifier(c)
            for c in columns
        ]
        query = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(select), sql.Identifier(table))
        cur = conn.execute(query)
        names = [d.name for d in cur.description or []]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return {tuple(r[k] for k in key): r for r in rows}


def _dst_columns(dsn: str, table: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
                (table,),
            ).fetchall()
        )


def _same(column: str, src: Any, dst: Any) -> bool:
    if column in LOSSY and src is not None:
        return bool(LOSSY[column][1](src) == dst)
    return bool(src == dst)


def _differences(src_dsn: str, dst_dsn: str, table: str) -> list[str]:
    columns = [*TABLES[table], *(name for name, _ in _columns_of(table))]
    src = _rows(src_dsn, table, columns, source=True)
    dst_cols = _dst_columns(dst_dsn, table)
    missing = [c for c in columns if c not in dst_cols]
    if not dst_cols:
        return [f"{table}: no destination table"]
    if missing:
        return [f"{table}: destination lacks columns {missing}"]
    dst = _rows(dst_dsn, table, columns)
    problems = []
    if set(src) != set(dst):
        problems.append(
            f"{table}: keys only in source {sorted(set(src) - set(dst))}, only in destination "
            f"{sorted(set(dst) - set(src))}"
        )
    for key in sorted(set(src) & set(dst)):
        for column in columns:
            if not _same(column, src[key][column], dst[key][column]):
                problems.append(f"{table} {key} {column}: source {src[key][column]!r} destination {dst[key][column]!r}")
    return problems


def _cause(trace: str) -> str:
    """The first lines of a Connect failure trace and of each of its causes."""
    lines = trace.splitlines()
    keep = [line for i, line in enumerate(lines) if i == 0 or line.startswith("Caused by")]
    return "\n".join(keep)[:4000]


@pytest.fixture(scope="module")
def connect_worker(services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectWorker]:
    worker = ConnectWorker(tmp_path_factory.mktemp("connect"), services.kafka_bootstrap).start()
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture
def destination(services: dev.Endpoints, test_id: str) -> Iterator[str]:
    """A second database on the same dev Postgres, for the sink to write into."""
    name = f"dst_{test_id}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def untruncated(services: dev.Endpoints, test_id: str) -> Iterator[str]:
    """A third database, for a sink with truncate.enabled=false."""
    name = f"dst2_{test_id}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# The rows items held when it was truncated: a sink that skips the marker keeps them.
ITEMS_BEFORE_TRUNCATE = {(1,), (2,), (3,), (105,), (6,), (7,), (9,)}


def _differences_without_truncate(src_dsn: str, dst_dsn: str) -> list[str]:
    """Tables other than items equal; items holds its source rows (equal) plus the truncated ones."""
    problems = [p for t in TABLES if t != "items" for p in _differences(src_dsn, dst_dsn, t)]
    columns = [*TABLES["items"], *(name for name, _ in COLUMNS)]
    if not _dst_columns(dst_dsn, "items"):
        return [*problems, "items: no destination table"]
    src, dst = _rows(src_dsn, "items", columns, source=True), _rows(dst_dsn, "items", columns)
    if set(dst) != set(src) | ITEMS_BEFORE_TRUNCATE:
        problems.append(
            f"items without truncates: keys {sorted(dst)}, expected {sorted(set(src) | ITEMS_BEFORE_TRUNCATE)}"
        )
    for key in set(src) & set(dst):
        problems += [f"items {key} {c}" for c in columns if not _same(c, src[key][c], dst[key][c])]
    return problems


def _jdbc_url(dsn: str, dbname: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"jdbc:postgresql://{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{dbname}"


def _sink_config(prefix: str, url: str, user: str, *, truncate: bool = True) -> dict[str, str]:
    return {
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": "1",
        "topics.regex": rf"{prefix}\.public\..*",
        "connection.url": url,
        "connection.username": user,
        "connection.password": "",
        "insert.mode": "upsert",
        "primary.key.mode": "record_key",
        "delete.enabled": "true",
        "truncate.enabled": "true" if truncate else "false",
        "schema.evolution": "basic",
        "collection.name.format": "${source.table}",
        "consumer.override.auto.offset.reset": "earliest",
        # The key-change headers __debezium.newkey/oldkey are Debezium's bytes ({"a":5,"b":"k5"}, what the
        # worker's default SimpleHeaderConverter writes for Debezium's own Key struct). Read back with the
        # same converter, a composite key whose values infer different Connect types becomes a map without
        # a value schema, and the sink dies building its header struct ("No schema defined for value of map
        # field") on Debezium's own topics as on ours. The sink does not use these headers: read them as
        # strings (docs/debezium-consumers.md).
        "header.converter": "org.apache.kafka.connect.storage.StringConverter",
    }


def _side_config(prefix: str, out: Path) -> dict[str, str]:
    return {
        "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
        "tasks.max": "1",
        "topics": f"__debezium-heartbeat.{prefix},{prefix}.transaction,{prefix}.message",
        "file": str(out),
        "consumer.override.auto.offset.reset": "earliest",
    }


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_debeziums_jdbc_sink_rebuilds_every_table_from_the_topics(
    identity,
    tmp_path,
    services,
    pg_dsn,
    destination,
    untruncated,
    slot_name,
    publication_name,
    topic_prefix,
    connect_worker,
):
    """Truncates enabled: every destination table equals its source. Under DEFAULT also a second sink with
    truncates off, which skips the markers and goes on: items keeps the rows the TRUNCATE removed."""
    started = time.monotonic()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _create(conn, identity)
        _snapshot_rows(conn)
    cfg = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
        tables=[f"public.{t}" for t in TABLES],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
        json={"schemas_enable": True, "decimal_handling": "precise"},
        heartbeat={"interval_ms": 500},
        transaction_metadata=True,
        status_interval_s=1.0,
    )
    daemon = Connector(cfg, tmp_path / "cdc.log").start()
    sink, side, plain = unique_name("jdbc"), unique_name("side"), unique_name("jdbc-no-truncate")
    connectors = [sink, side, plain] if identity == "DEFAULT" else [sink, side]
    side_out = tmp_path / "side-topics.txt"
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            _stream_changes(conn)
        user = psycopg.conninfo.conninfo_to_dict(services.postgres_dsn).get("user", "postgres")
        connect_worker.add_connector(
            sink, _sink_config(topic_prefix, _jdbc_url(services.postgres_dsn, destination), str(user))
        )
        connect_worker.add_connector(side, _side_config(topic_prefix, side_out))
        if plain in connectors:
            url = _jdbc_url(services.postgres_dsn, untruncated)
            connect_worker.add_connector(plain, _sink_config(topic_prefix, url, str(user), truncate=False))
        dst_dsn = psycopg.conninfo.make_conninfo(services.postgres_dsn, dbname=destination)
        plain_dsn = psycopg.conninfo.make_conninfo(services.postgres_dsn, dbname=untruncated)
        deadline = time.monotonic() + 90
        problems: list[str] = ["not compared yet"]
        while time.monotonic() < deadline:
            failures = {name: connect_worker.failure(name) for name in connectors}
            if any(failures.values()):
                time.sleep(5)  # let the others reach their verdicts too, so one run shows them all
                failures = {name: connect_worker.failure(name) for name in connectors}
                report = "\n".join(f"connector {n} failed:\n{_cause(f)}" for n, f in failures.items() if f)
                raise AssertionError(f"{report}\nleft to compare: {problems[:10]}")
            problems = [p for t in TABLES for p in _differences(pg_dsn, dst_dsn, t)]
            if plain in connectors:
                problems += [f"(truncates off) {p}" for p in _differences_without_truncate(pg_dsn, plain_dsn)]
            side_seen = side_out.exists() and side_out.stat().st_size > 0
            if not problems and side_seen:
                break
            time.sleep(1.0)
        assert not problems, "\n".join(problems[:40])
        # Every side-topic kind went through JsonConverter: heartbeats, BEGIN/END, the logical message.
        text = side_out.read_text()
        assert "ts_ms" in text and "status=BEGIN" in text and "status=END" in text and "prefix=compat" in text, text[
            -3000:
        ]
    finally:
        for name in connectors:
            try:
                connect_worker.delete_connector(name)
            except Exception:
                pass
        assert daemon.stop() == 0
    if identity == "DEFAULT":
        print("compat destination types:", _dst_columns(dst_dsn, "items"), _dst_columns(dst_dsn, "kinds"))
    for table in TABLES:
        columns = [*TABLES[table], *(name for name, _ in _columns_of(table))]
        rows = len(_rows(pg_dsn, table, columns))
        if plain in connectors:
            print(f"compat {identity} truncates off {table}: destination={len(_rows(plain_dsn, table, columns))}")
        print(
            f"compat {identity} {table}: rows source={rows} destination={len(_rows(dst_dsn, table, columns))} "
            f"columns={len(columns)} lossy={[c for c in columns if c in LOSSY]} "
            f"retyped={[c for c in columns if c in RETYPED]} seconds={time.monotonic() - started:.1f}"
        )
