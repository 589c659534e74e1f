"""A snapshot worker process: imports the exported snapshot, then copies the chunks it is given into Kafka.

Per chunk, inside the worker's one REPEATABLE READ transaction:

1. ``SAVEPOINT``; ``LOCK TABLE ... IN ACCESS SHARE MODE``: the table cannot be
   dropped or rewritten while the chunk is read.
2. Check that the table is the planned one (same oid) and was not rewritten
   since the snapshot (``ALTER TABLE`` rewrites, ``TRUNCATE``, ``VACUUM FULL``,
   ``CLUSTER`` give it a new relfilenode, and rows of a rewritten table are
   invisible to older snapshots: reading it would silently miss them).
3. ``COPY (SELECT ...) TO STDOUT``, each line one of three ways:

   - rendered (the default where the serializer offers a ``RowRendering``, as the
     stream's decoder renders rows): the row codec (``cdc.render.codec.copy_parser``,
     compiled or its reference) writes the line's row and key straight in the sink
     format, the bytes the stream writes for the same values. In JSON they go into
     the envelope's constant parts (``ReadParts``) and to the bulk producer, with no
     per-record callback; in Avro through the serializer and the delivery;
   - server-built JSON (``snapshot.server_json``, or where the compiled codec is
     not built): the COPY returns each row's key and ``after`` JSON
     (``cdc.snapshot.sqljson``), spliced the same way;
   - typed: ``copytext.row_parser`` (the stream's converters), a
     ``ChangeEvent(op=READ, snapshot=True)`` at the consistent point, the
     serializer, the delivery. A table with column policies, and any row the two
     others decline (a value they do not cover), takes this path.
4. ``ROLLBACK TO SAVEPOINT`` (it read only), which releases the lock: DDL may
   run between chunks instead of waiting for the whole snapshot.
5. Wait until Kafka acknowledged every record of the chunk, then report the
   chunk done. Only then may the coordinator record it as copied.

The worker dies with its parent (``PR_SET_PDEATHSIG``): a worker outliving a
killed daemon could otherwise write snapshot rows after the next daemon's stream
events, making a topic end on a stale value.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing.queues
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from psycopg import sql

from cdc import log as logsetup
from cdc.compiled import CHOSEN
from cdc.decoder.rows import Decline
from cdc.decoder.types import PARSE_ERRORS, ValueConversionError, parser_for
from cdc.event import Op, TxBegin, TxCommit, change_event
from cdc.lsn import Lsn
from cdc.process import tune_gc
from cdc.render import codec
from cdc.render.rows import CopyRecord, CopyRowParser
from cdc.sink.errors import SerializationError
from cdc.sink.json import JsonSerializer, ReadParts
from cdc.sink.kafka import SinkError
from cdc.sink.record import Record
from cdc.sink.records import EventSerializer, position_headers
from cdc.sink.wire import ORDINAL_HEADER
from cdc.snapshot.copyout import line_calls, lines
from cdc.snapshot.copytext import CopyFormatError, RowParser, row_parser, unescape
from cdc.snapshot.messages import ChunkDone, ChunkSkipped, ChunkTask, Failed, Ready, Report, Rows
from cdc.snapshot.output import Output, OutputFactory, Serializer
from cdc.snapshot.plan import LEAVES, SnapshotTable, chunk_select, session_setup
from cdc.snapshot.send import SEND_RENDERED, RenderedChunk
from cdc.snapshot.sqljson import JsonQuery, json_query

_NOTHING_UNCHANGED: frozenset[str] = frozenset()

log = structlog.get_logger("cdc.snapshot.worker")

__all__ = ["ChunkDone", "ChunkSkipped", "ChunkTask", "Failed", "Ready", "Rows", "WorkerSpec", "run_worker"]

_PROGRESS_EVERY = 8192
_DRAIN_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    worker_id: int
    conninfo: str
    snapshot_name: str
    output: OutputFactory
    consistent_point: Lsn
    xid: int | None
    commit_ts_us: int
    log_format: str = "json"
    log_level: str = "info"
    # let the server build the rows' JSON where it can (cdc.snapshot.sqljson); None: only where the compiled
    # row codec is not built (it renders the rows with less CPU in all than the server spends on the JSON)
    server_json: bool | None = None
    record_chunks: bool = True  # exactly once: a chunk's transaction ends with its progress record (not without a slot)


class _Skip(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def import_snapshot(conn: psycopg.Connection[Any], snapshot_name: str) -> None:
    """Open the transaction that reads under the exported snapshot. Raises psycopg.Error when it is gone."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))


def run_worker(
    spec: WorkerSpec,
    parent_pid: int,
    tasks: multiprocessing.queues.Queue[ChunkTask | None],
    reports: multiprocessing.queues.Queue[Report],
) -> None:
    """The worker process's main function."""
    _die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the death signal was armed
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator decides when workers stop
    logsetup.configure("console" if spec.log_format == "console" else "json", spec.log_level)
    tune_gc()  # a spawned interpreter: the daemon's settings are not inherited
    wid = spec.worker_id
    try:
        conn = psycopg.connect(spec.conninfo, autocommit=True)
    except psycopg.Error as e:
        reports.put(Ready(wid, f"cannot connect to Postgres: {str(e).strip()}"))
        return
    try:
        session_setup(conn, f"cdc-snapshot-{wid}")
        import_snapshot(conn, spec.snapshot_name)
    except psycopg.Error as e:
        reports.put(Ready(wid, str(e).strip()))
        conn.close()
        return
    try:
        output = spec.output(wid)
    except SinkError as e:
        reports.put(Ready(wid, f"cannot set up its Kafka producer: {e}"))
        conn.close()
        return
    reports.put(Ready(wid, None))
    readers: dict[str, _Reader] = {}
    server_json = (
        (spec.server_json if spec.server_json is not None else codec.IMPLEMENTATION != "compiled")
        and output.bulk is not None
        and _utf8(conn)
    )
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            name, index = task.table.name, task.chunk.index
            try:
                reader = readers.get(name)
                if reader is None or reader.table != task.table:
                    reader = readers[name] = _reader(task.table, output, spec, server_json)
                if reader.parts is not None:
                    rows = _copy_chunk_rendered(conn, output, spec, task, reader, reports)
                elif reader.query is not None:
                    rows = _copy_chunk_json(conn, output, spec, task, reader, reports)
                else:
                    rows = _copy_chunk(conn, output, spec, task, reader, reports)
            except _Skip as e:
                reports.put(ChunkSkipped(wid, name, index, e.reason, str(e)))
                continue
            except (psycopg.Error, CopyFormatError, SinkError, SerializationError) as e:
                reports.put(Failed(wid, name, index, f"{type(e).__name__}: {str(e).strip()}"))
                break
            reports.put(ChunkDone(wid, name, index, rows, reader.query is not None, reader.render is not None))
        output.delivery.drain(_DRAIN_TIMEOUT_S)
        if output.bulk is not None:
            output.bulk.drain(_DRAIN_TIMEOUT_S)
    except SinkError as e:
        reports.put(Failed(wid, None, None, f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _check_table(conn: psycopg.Connection[Any], table: SnapshotTable) -> None:
    relation = sql.Identifier(table.schema.schema, table.schema.name)
    try:
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(relation))
    except psycopg.errors.UndefinedTable:
        raise _Skip("dropped", f"table {table.name} was dropped during the snapshot") from None
    row = conn.execute(
        """
        SELECT to_regclass(%(name)s)::oid = %(oid)s,
               (SELECT count(*) FROM ({LEAVES}) l(relid)
                  LEFT JOIN pg_class c ON c.oid = l.relid
                 WHERE c.relfilenode IS DISTINCT FROM pg_relation_filenode(l.relid))
        """.replace("{LEAVES}", LEAVES),
        {"name": relation.as_string(conn), "oid": table.oid},
    ).fetchone()
    if row is None or not row[0]:
        raise _Skip("dropped", f"table {table.name} was dropped (or dropped and recreated) during the snapshot")
    if row[1]:
        raise _Skip(
            "rewritten",
            f"table {table.name} was rewritten (ALTER TABLE, TRUNCATE, VACUUM FULL or CLUSTER) after the snapshot "
            "was taken: its rows are no longer visible under the snapshot",
        )


@dataclass(frozen=True, slots=True)
class _Reader:
    """How this worker reads a table's chunks."""

    table: SnapshotTable
    parse: RowParser  # a COPY text line -> the row, as the stream converts it
    query: JsonQuery | None  # the server builds the rows' JSON (cdc.snapshot.sqljson); None: parse every row
    render: CopyRowParser | None = None  # the row codec writes each row's bytes; None: not for this table
    parts: ReadParts | None = None  # JSON with ``render``: the records' constant parts
    record: CopyRecord | None = None  # with ``parts``: a line's key and value in one call of the row codec


# What the row codec raises on a line it does not cover: the typed path reads it (and raises what is wrong).
_DECLINES = (Decline, ValueConversionError, *PARSE_ERRORS)


def _utf8(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT current_setting('server_encoding') = 'UTF8'").fetchone()
    return bool(row and row[0])


def _reader(table: SnapshotTable, output: Output, spec: WorkerSpec, server_json: bool) -> _Reader:
    parse = row_parser(table.schema.columns, where=table.name)
    serializer = output.serializer
    query = render = parts = record = None
    if table.name not in output.policy_tables:  # the column policies read typed values, as in the stream
        if server_json and isinstance(serializer, JsonSerializer):
            read_parts = serializer.read_parts(table.schema, spec.commit_ts_us, spec.consistent_point, spec.xid)
            query = json_query(table, read_parts, serializer.settings)
        rendering = getattr(serializer, "row_rendering", None)
        row_rendering = rendering(table.schema) if query is None and output.render_rows and rendering else None
        if row_rendering is not None:
            converters = [parser_for(c.type) for c in table.schema.columns]
            render = codec.copy_parser(row_rendering, converters, unescape)
            if isinstance(serializer, JsonSerializer) and output.bulk is not None:
                parts = serializer.read_parts(table.schema, spec.commit_ts_us, spec.consistent_point, spec.xid)
                record = codec.copy_record(row_rendering, converters, unescape)
    log.info(
        "snapshot_table_reader",
        worker=spec.worker_id,
        table=table.name,
        server_json=query is not None,
        rendered=render is not None,
        codec=codec.IMPLEMENTATION,
        loop=CHOSEN.implementation("snapshot_send") if record is not None else None,
    )
    return _Reader(table, parse, query, render, parts, record)


@contextlib.contextmanager
def _chunk_savepoint(conn: psycopg.Connection[Any], table: SnapshotTable) -> Iterator[None]:
    """Steps 1, 2 and 4 of the module's list around a chunk's COPY: a savepoint, the lock and the checks; the
    rollback to the savepoint (the chunk only read), which releases the lock."""
    conn.execute("SAVEPOINT cdc_chunk")
    try:
        _check_table(conn, table)
        yield
    finally:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.UNKNOWN:
            conn.execute("ROLLBACK TO SAVEPOINT cdc_chunk")
            conn.execute("RELEASE SAVEPOINT cdc_chunk")


def _copy_chunk(
    conn: psycopg.Connection[Any],
    output: Output,
    spec: WorkerSpec,
    task: ChunkTask,
    reader: _Reader,
    reports: multiprocessing.queues.Queue[Report],
) -> int:
    """A chunk through the serializer: rows the codec renders (Avro; JSON where the bulk path is not set up) or
    typed rows. Records go to the bulk producer, with no per-record callback, when there is one (the chunk
    counts once it is drained), except oversized ones, which take the delivery's size limit and dead letters."""
    parse, render = reader.parse, reader.render
    table = task.table
    delivery, records, transform = output.delivery, output.serializer.records, output.transform
    tick, bulk = delivery.tick, output.bulk
    send = delivery.send if bulk is None else _bulk_sender(bulk, delivery, output.max_record_bytes)
    schema, point, xid, ts = table.schema, spec.consistent_point, spec.xid, spec.commit_ts_us
    read_op = Op.READ
    describe = table.name
    wid = spec.worker_id
    ordinal = task.ordinal_base
    n = 0
    reported = 0
    with _chunk_savepoint(conn, table):
        delivery.begin(TxBegin(xid or 0, point, ts))
        with conn.cursor().copy(chunk_select(table, task.chunk)) as copy:
            for data in lines(copy):
                row: Any = None
                if render is not None:
                    try:
                        row = render(data)
                    except _DECLINES:
                        pass
                if row is None:
                    row = parse(bytes(data[:-1]))
                ordinal += 1
                event = change_event(
                    read_op, schema, None, row, point, point, xid, ordinal, ts, True, _NOTHING_UNCHANGED
                )
                for record in records(transform(event) if transform is not None else event):
                    send(record, describe)
                n += 1
                if n % _PROGRESS_EVERY == 0:
                    tick()
                    reports.put(Rows(wid, table.name, n - reported))
                    reported = n
        _end_chunk(output, spec, task, n)
    _drain_chunk(output, task, wid, n - reported, reports)
    return n


def _bulk_sender(bulk: Any, delivery: Any, limit: int) -> Callable[[Record, str], None]:
    """``delivery.send`` through the bulk producer: no per-record callback (the chunk counts once the bulk
    producer is drained too); a record with a partition of its own, a tombstone or an oversized record
    (the delivery's size limit and dead letters) still goes through the delivery."""
    produce, wait, send = bulk.produce, bulk.wait, delivery.send

    def bulk_send(record: Record, describe: str) -> None:
        topic, key, value, headers, partition = record
        if partition is not None or value is None or len(value) > limit:
            send(record, describe)
            return
        by_name: Any = dict(headers) if headers else None  # a dict converts faster; a list keeps a name twice
        if by_name is not None and len(by_name) != len(headers):
            by_name = list(headers)
        while True:
            try:
                if by_name is None:  # positional only: see cdc.snapshot.send
                    produce(topic, value, key)
                else:
                    produce(topic, value, key, headers=by_name)
                return
            except BufferError:
                wait()

    return bulk_send


def _end_chunk(output: Output, spec: WorkerSpec, task: ChunkTask, rows: int) -> None:
    """The chunk's end inside its savepoint, on every path: exactly once, its progress record last in its
    transaction; then the commit (the transaction's, or at least once the delivery's bookkeeping)."""
    delivery = output.delivery
    if output.chunk_record is not None and spec.record_chunks:
        delivery.send(output.chunk_record(task.table.name, task.chunk.index, rows), "snapshot progress")
    delivery.commit(TxCommit(spec.xid or 0, spec.consistent_point, spec.consistent_point, spec.commit_ts_us, rows))


def _drain_chunk(
    output: Output, task: ChunkTask, wid: int, unreported: int, reports: multiprocessing.queues.Queue[Report]
) -> None:
    """The chunk counts once Kafka has everything of it: the delivery's records and the bulk producer's; then
    the rows not yet reported go to the coordinator."""
    delivery, bulk = output.delivery, output.bulk
    while delivery.drain(_DRAIN_TIMEOUT_S) or (bulk is not None and bulk.drain(_DRAIN_TIMEOUT_S)):
        log.warning("snapshot_waiting_for_kafka", worker=wid, table=task.table.name, chunk=task.chunk.index)
    if unreported:
        reports.put(Rows(wid, task.table.name, unreported))


_CLOCK_EVERY = 256  # rows between readings of the clock for the envelopes' processing time


def _copy_chunk_json(
    conn: psycopg.Connection[Any],
    output: Output,
    spec: WorkerSpec,
    task: ChunkTask,
    reader: _Reader,
    reports: multiprocessing.queues.Queue[Report],
) -> int:
    """``_copy_chunk`` with the rows' JSON built by the server: per row, split the COPY line, splice the key
    and ``after`` objects into the envelope's constant parts, produce. A row the SQL does not cover (its
    JSON fields are NULL) and an oversized record take the ordinary path through ``output.delivery``."""
    query, parse = reader.query, reader.parse
    assert query is not None and output.bulk is not None
    table, parts, bulk = task.table, query.parts, output.bulk
    delivery, records, transform = output.delivery, output.serializer.records, output.transform
    produce, wait, limit = bulk.produce, bulk.wait, output.max_record_bytes
    topic, key_head, key_end = parts.topic, parts.key_head, parts.key_end
    value_head, value_middle, value_end = parts.value_head, parts.value_middle, parts.value_end
    times = parts.times
    schema, point, xid, ts = table.schema, spec.consistent_point, spec.xid, spec.commit_ts_us
    position, with_ordinal = _row_headers(point, xid, enabled=_headers_on(output.serializer))
    headers = position
    read_op = Op.READ
    wid = spec.worker_id
    ordinal = task.ordinal_base
    n = 0
    reported = 0
    tail = b""
    with _chunk_savepoint(conn, table):
        delivery.begin(TxBegin(xid or 0, point, ts))
        with conn.cursor().copy(query.copy(task.chunk)) as copy:
            for data in lines(copy):
                line = bytes(data)  # ends in a newline, after the last (raw) column
                ordinal += 1
                if n % _CLOCK_EVERY == 0:
                    tail = value_middle + times(time.time_ns()) + value_end
                    if n % _PROGRESS_EVERY == 0 and n:
                        bulk.check()
                        delivery.tick()
                        reports.put(Rows(wid, table.name, n - reported))
                        reported = n
                n += 1
                key, after, rest = line.split(b"\t", 2)
                if key == b"\\N":  # not covered by the SQL: the columns follow as COPY text
                    row = parse(rest[:-1])
                    event = change_event(
                        read_op, schema, None, row, point, point, xid, ordinal, ts, True, _NOTHING_UNCHANGED
                    )
                    for record in records(transform(event) if transform is not None else event):
                        delivery.send(record, table.name)
                    continue
                # COPY doubled the JSON's backslashes (the JSON has no other characters COPY escapes)
                if b"\\" in after:
                    after = after.replace(b"\\\\", b"\\")
                if b"\\" in key:
                    key = key.replace(b"\\\\", b"\\")
                if with_ordinal:
                    headers = position.copy()  # type: ignore[union-attr]
                    headers[ORDINAL_HEADER] = b"%d" % ordinal
                key = key_head + key + key_end
                value = value_head + after + tail
                if len(value) > limit:  # the same headers, in position_headers' order
                    pairs: Any = tuple(headers.items()) if headers else ()
                    delivery.send(Record(topic, key, value, pairs), table.name)
                    continue
                while True:
                    try:
                        if headers is None:  # positional only: see cdc.snapshot.send
                            produce(topic, value, key)
                        else:
                            produce(topic, value, key, headers=headers)
                        break
                    except BufferError:
                        wait()
        _end_chunk(output, spec, task, n)
    _drain_chunk(output, task, wid, n - reported, reports)
    return n


def _headers_on(serializer: Serializer) -> bool:
    """Whether the serializer writes the ``cdc.*`` position headers (``kafka.position_headers``, which the
    pipeline's ``make_serializer`` sets on it); one without that switch writes them."""
    return not isinstance(serializer, EventSerializer) or serializer.position_headers


def _row_headers(point: Lsn, xid: int | None, *, enabled: bool) -> tuple[dict[str, str | bytes | None] | None, bool]:
    """The position headers of this snapshot's rows as ``position_headers`` makes them (the one place that
    says what a record carries; the rendered and server-JSON paths take their headers from here alone), as a
    dict to copy per row, and whether the row's ordinal goes in it; None when they are none (``enabled``
    false: ``kafka.position_headers`` off, the envelope's source block has the position)."""
    headers: dict[str, str | bytes | None] = dict(position_headers(point, point, xid, 0, enabled=enabled))
    return (headers or None), ORDINAL_HEADER in headers


def _copy_chunk_rendered(
    conn: psycopg.Connection[Any],
    output: Output,
    spec: WorkerSpec,
    task: ChunkTask,
    reader: _Reader,
    reports: multiprocessing.queues.Queue[Report],
) -> int:
    """``_copy_chunk`` for JSON tables the row codec renders: per row, the codec writes the row's ``after`` and
    key objects from the COPY line (the bytes the stream writes for the same values), they go into the
    envelope's constant parts and to the bulk producer, with no per-record callback (the chunk counts once
    everything is drained); the loop is ``cdc.snapshot.send`` (compiled, or its reference). A line the codec
    declines and an oversized record take the ordinary path through ``output.delivery``."""
    record, parse, parts = reader.record, reader.parse, reader.parts
    assert record is not None and parts is not None and output.bulk is not None
    table, bulk = task.table, output.bulk
    delivery, records, transform = output.delivery, output.serializer.records, output.transform
    topic = parts.topic
    schema, point, xid, ts = table.schema, spec.consistent_point, spec.xid, spec.commit_ts_us
    position, with_ordinal = _row_headers(point, xid, enabled=_headers_on(output.serializer))
    wid = spec.worker_id
    reported = 0

    def declined(data: Any, ordinal: int) -> None:  # the typed path reads it, and raises what is wrong with it
        event = change_event(
            Op.READ, schema, None, parse(bytes(data[:-1])), point, point, xid, ordinal, ts, True, _NOTHING_UNCHANGED
        )
        for typed in records(transform(event) if transform is not None else event):
            delivery.send(typed, table.name)

    def oversized(key: bytes, value: bytes, headers: dict[str, str | bytes | None] | None) -> None:
        pairs: Any = tuple(headers.items()) if headers else ()  # the same headers, in position_headers' order
        delivery.send(Record(topic, key, value, pairs), table.name)

    def progress(rows: int) -> None:
        nonlocal reported
        bulk.check()
        delivery.tick()
        reports.put(Rows(wid, table.name, rows - reported))
        reported = rows

    with _chunk_savepoint(conn, table):
        delivery.begin(TxBegin(xid or 0, point, ts))
        with conn.cursor().copy(chunk_select(table, task.chunk)) as copy:
            get, read, end = line_calls(copy)
            n = SEND_RENDERED(
                RenderedChunk(
                    get=get,
                    read=read,
                    end=end,
                    record=record,
                    key_head=parts.key_head,
                    key_end=parts.key_end,
                    value_head=parts.value_head,
                    value_middle=parts.value_middle,
                    value_end=parts.value_end,
                    times=parts.times,
                    clock=time.time_ns,
                    produce=bulk.produce,
                    wait=bulk.wait,
                    topic=topic,
                    limit=output.max_record_bytes,
                    headers=position,
                    with_ordinal=with_ordinal,
                    ordinal_header=ORDINAL_HEADER,
                    ordinal=task.ordinal_base,
                    declines=_DECLINES,
                    declined=declined,
                    oversized=oversized,
                    progress=progress,
                    progress_every=_PROGRESS_EVERY,
                    clock_every=_CLOCK_EVERY,
                )
            )
        _end_chunk(output, spec, task, n)
    _drain_chunk(output, task, wid, n - reported, reports)
    return n
