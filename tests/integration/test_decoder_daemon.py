"""The decoder inside the real daemon (`cdc run`): schema changes end to end, a PostgreSQL restart, a
dropped slot, and a large transaction in bounded memory."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog
from confluent_kafka import Consumer, TopicPartition

from cdc.dev import postgres
from cdc.lsn import Lsn
from cdc.replication import ConnectionLost, ReplicationError, ReplicationStream, SlotGone
from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration


def config(
    tmp_path: Path, services: Any, dsn: str, slot: str, publication: str, prefix: str, tables: list[Any], **extra: Any
) -> Path:
    return write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": dsn, "slot": slot, "publication": publication},
        tables=tables,
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=prefix,
        status_interval_s=1.0,
        **extra,
    )


def replay(messages: list[Any]) -> dict[bytes, Any]:
    """Latest value per key, tombstones deleting: what a consumer rebuilding from offset 0 holds."""
    state: dict[bytes, Any] = {}
    for m in messages:
        if m.value() is None:
            state.pop(m.key(), None)
        else:
            state[m.key()] = json.loads(m.value())
    return state


def key(i: int) -> bytes:
    return json.dumps({"id": i}, separators=(",", ":")).encode()


def wait_until(check: Any, timeout: float, what: str, connector: Connector | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if connector is not None and connector.proc is not None and connector.proc.poll() is not None:
            raise AssertionError(
                f"the daemon exited with {connector.proc.returncode} waiting for {what}:\n{connector.output()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}"
                + (f":\n{connector.output()[-5000:]}" if connector else "")
            )
        time.sleep(0.3)


def topic_state_equals_table(consume_all: Any, topic: str, dsn: str, query: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = {key(r[0]): r for r in conn.execute(query).fetchall()}
    state = replay(consume_all([topic], timeout=20.0))
    if set(state) != set(rows):
        return False
    return all(tuple(state[k]["after"][c] for c in state[k]["after"]) == rows[k] for k in rows)


# --- schema changes end to end ---------------------------------------------------------------------


def test_alter_table_during_a_workload_reaches_the_topic_through_the_daemon_with_no_event_lost(
    tmp_path: Path,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
    consume_all: Any,
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, a int, b text)")
    cfg = config(tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.items"])
    topic = f"{topic_prefix}.public.items"
    daemon = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for step in [
                "INSERT INTO items SELECT g, g, 'x' FROM generate_series(1, 50) g",
                "ALTER TABLE items ADD COLUMN c bool DEFAULT true",
                "INSERT INTO items SELECT g, g, 'y', false FROM generate_series(51, 100) g",
                "UPDATE items SET a = a + 1000 WHERE id % 10 = 0",
                "ALTER TABLE items DROP COLUMN b",
                "INSERT INTO items SELECT g, g, true FROM generate_series(101, 150) g",
                "ALTER TABLE items RENAME COLUMN a TO amount",
                "UPDATE items SET amount = amount + 1 WHERE id % 7 = 0",
                "ALTER TABLE items ALTER COLUMN amount TYPE bigint",
                "INSERT INTO items SELECT g, g * 10000000000, false FROM generate_series(151, 200) g",
                "DELETE FROM items WHERE id % 9 = 0",
                # Touch every row, so that each one's latest event carries today's columns.
                "UPDATE items SET c = NOT c",
            ]:
                conn.execute(step)
        wait_until(
            lambda: topic_state_equals_table(consume_all, topic, pg_dsn, "SELECT id, amount, c FROM items"),
            60,
            "the topic to equal the table",
            daemon,
        )
    finally:
        assert daemon.stop() == 0, daemon.output()
    messages = consume_all([topic], timeout=20.0)
    values = [json.loads(m.value()) for m in messages if m.value() is not None]
    updates = 10 + 21 + (200 - 22)  # id % 10 of 1..100, id % 7 of 1..150, every row left at the end
    assert len(values) == 200 + updates + 22  # and the deletes of id % 9
    assert values[0]["after"] == {"id": 1, "a": 1, "b": "x"}
    assert [v["op"] for v in values].count("d") == 22
    assert {"id": 151, "amount": 1510000000000, "c": True} in [v["after"] for v in values]


# --- a PostgreSQL restart ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[tuple[Path, str, Any]]:
    """A PostgreSQL server of this module's own, so that restarting or starving it disturbs no other test.

    Its state lives under the system temp directory rather than pytest's: the server runs as an
    unprivileged user (as root), and pytest resets its own directory to 0700 whenever a session starts.
    """
    state = Path(tempfile.mkdtemp(prefix="cdc-own-pg-"))
    log = structlog.get_logger("tests.own_postgres")
    try:
        dsn = postgres.up(state, log)
        try:
            yield state, dsn, log
        finally:
            postgres.down(state, log)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_a_postgres_restart_in_the_middle_of_a_workload_loses_nothing(
    tmp_path: Path, services: Any, own_postgres: Any, topic_prefix: str, consume_all: Any
) -> None:
    state, dsn, log = own_postgres
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS counters")
        conn.execute("CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL)")
    cfg = config(tmp_path, services, dsn, "restart_slot", "restart_pub", topic_prefix, ["public.counters"])
    topic = f"{topic_prefix}.public.counters"
    stop = threading.Event()
    written = [0]

    def workload() -> None:  # rows come and go and change; it reconnects through the restart
        i = 0
        while not stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
                    while not stop.is_set():
                        i += 1
                        conn.execute(
                            "INSERT INTO counters VALUES (%s, 0) ON CONFLICT (id) DO UPDATE SET n = counters.n + 1",
                            (i % 300,),
                        )
                        if i % 7 == 0:
                            conn.execute("DELETE FROM counters WHERE id = %s", ((i * 13) % 300,))
                        written[0] = i
            except psycopg.OperationalError:
                time.sleep(0.2)

    daemon = Connector(cfg, tmp_path / "cdc.log").start()
    worker = threading.Thread(target=workload)
    try:
        daemon.wait_streaming(dsn, "restart_slot")
        worker.start()
        wait_until(lambda: written[0] > 500, 30, "the workload to get going")
        postgres.down(state, log)
        time.sleep(1.0)
        postgres.up(state, log)
        before = written[0]
        wait_until(lambda: written[0] > before + 500, 60, "the workload to go on after the restart")
        stop.set()
        worker.join()
        wait_until(
            lambda: topic_state_equals_table(consume_all, topic, dsn, "SELECT id, n FROM counters"),
            90,
            "the topic to equal the table",
            daemon,
        )
    finally:
        stop.set()
        if worker.is_alive():
            worker.join()
        code = daemon.stop()
    assert code == 0, daemon.output()
    events = [e.get("event") for e in daemon.log_events()]
    assert "replication_retry" in events and events.count("replication_started") >= 2, daemon.output()


def test_a_connection_lost_after_streaming_longer_than_the_reconnect_timeout_reconnects_and_an_outage_still_ends(
    tmp_path: Path, services: Any, own_postgres: Any, topic_prefix: str, consume_all: Any
) -> None:
    """reconnect_timeout_s bounds one outage, not the daemon's life: a session lost after streaming longer
    than the timeout reconnects (it used to be fatal, the retry clock having run since the daemon
    started), and an outage that lasts longer than the timeout still stops the daemon, naming it."""
    state, dsn, log = own_postgres
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS items")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
    timeout_s = 3.0
    cfg = config(
        tmp_path, services, dsn, "lost_slot", "lost_pub", topic_prefix, ["public.items"], reconnect_timeout_s=timeout_s
    )
    topic = f"{topic_prefix}.public.items"

    def walsender() -> int | None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'lost_slot'").fetchone()
        return None if row is None else row[0]

    def arrived(i: int) -> bool:
        return key(i) in replay(consume_all([topic], timeout=5.0))

    daemon = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(dsn, "lost_slot")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1)")
        wait_until(lambda: arrived(1), 60, "row 1 in the topic", daemon)
        time.sleep(timeout_s + 1)  # the session has now streamed for longer than the timeout
        first = walsender()
        assert first is not None
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (first,))
        wait_until(lambda: walsender() not in (None, first), 60, "a new replication session", daemon)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (2)")
        wait_until(lambda: arrived(2), 60, "row 2 in the topic after the reconnect", daemon)

        time.sleep(timeout_s + 1)
        postgres.down(state, log)  # an outage longer than the timeout: the daemon gives up
        try:
            code = daemon.wait_exit(60 + timeout_s)
        finally:
            postgres.up(state, log)
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
    assert code == 1, daemon.output()
    events = daemon.log_events()
    lost = [e for e in events if e.get("event") == "replication_lost"]
    assert len(lost) == 2 and all(e["streamed_s"] >= timeout_s for e in lost), daemon.output()
    fatal = [e for e in events if e.get("event") == "fatal"]
    assert fatal and fatal[-1]["kind"] == "ConnectionLost", daemon.output()
    assert [e.get("event") for e in events].count("replication_started") == 2, daemon.output()


# --- the slot goes away --------------------------------------------------------------------------------


def test_a_slot_invalidated_by_max_slot_wal_keep_size_while_streaming_is_slot_gone(own_postgres: Any) -> None:
    _, admin_dsn, _ = own_postgres
    dbname = f"invalidated_{int(time.time() * 1000) % 10**8}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {dbname}")
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=dbname)
    stream = ReplicationStream(dsn, status_interval=1.0)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, filler text)")
            conn.execute("CREATE PUBLICATION p FOR TABLE t")
        stream.connect()
        stream.create_slot("starved")
        stream.start("starved", "p", Lsn(0))  # reads, but never confirms: the slot keeps its WAL

        def write_wal_and_checkpoint() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for _ in range(3):  # past the 1 MB the slot may keep, in whole segments
                    conn.execute("INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(1, 20000) g")
                    conn.execute("DELETE FROM t")
                    conn.execute("SELECT pg_switch_wal()")
                # The checkpointer invalidates the slot and ends its walsender, which must first get its
                # last words out to this reader: so the reading goes on meanwhile, in the main thread.
                conn.execute("CHECKPOINT")

        writer = threading.Thread(target=write_wal_and_checkpoint)
        writer.start()
        lost: ReplicationError | None = None
        deadline = time.monotonic() + 60
        while lost is None and time.monotonic() < deadline:
            try:
                stream.read(0.5)
            except ReplicationError as error:
                lost = error
        writer.join()
        stream.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            status = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'starved'").fetchone()
        assert type(lost) is ConnectionLost  # first the walsender is terminated: a retry would reconnect ...
        assert status is not None and status[0] == "lost"
        again = ReplicationStream(dsn)
        again.connect()
        try:
            with pytest.raises(SlotGone, match="invalidated .*take a new snapshot"):  # ... and find this
                again.start("starved", "p", Lsn(0))
        finally:
            again.close()
    finally:
        stream.close()
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(
                "SELECT pg_drop_replication_slot('starved') WHERE EXISTS "
                "(SELECT 1 FROM pg_replication_slots WHERE slot_name = 'starved' AND NOT active)"
            )
            conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def test_a_slot_dropped_while_streaming_stops_the_daemon_with_a_clear_error(
    tmp_path: Path, services: Any, pg_dsn: str, slot_name: str, publication_name: str, topic_prefix: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
    cfg = config(tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, ["public.items"])
    daemon = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1)")

            def dropped() -> bool:
                conn.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND active_pid IS NOT NULL",
                    (slot_name,),
                )
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))
                except psycopg.errors.ObjectInUse:  # the walsender is still going, or the daemon is back
                    return False
                return True

            wait_until(dropped, 30, "the slot to be dropped")
        code = daemon.wait_exit(60)
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
    assert code == 1, daemon.output()
    fatal = [e for e in daemon.log_events() if e.get("event") == "fatal"]
    assert fatal and fatal[-1]["kind"] == "SlotGone", daemon.output()
    assert "does not exist" in fatal[-1]["error"] and "snapshot.on_slot_missing: snapshot" in fatal[-1]["error"]


# --- a large transaction in bounded memory ----------------------------------------------------------------

ROWS = 200_000
FILLER = 500  # characters a row: held whole, the transaction's events alone would take about 200 MiB


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def records_in(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        total = 0
        for partition in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()


@pytest.mark.parametrize("streaming", [False, True], ids=["streaming-off", "streaming-on"])
def test_a_large_transaction_passes_through_the_daemon_in_bounded_memory(
    streaming: bool,
    tmp_path: Path,
    services: Any,
    pg_dsn: str,
    slot_name: str,
    publication_name: str,
    topic_prefix: str,
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, filler text)")
    extra: dict[str, Any] = {"limits": {"max_inflight_bytes": 8 * 1024 * 1024}}
    extra["decoder"] = {"streaming": streaming, "spool_dir": str(tmp_path / "spool")}
    # A small logical_decoding_work_mem makes the server stream (or spill) early.
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, options="-c logical_decoding_work_mem=1MB")
    cfg = config(tmp_path, services, dsn, slot_name, publication_name, topic_prefix, ["public.big"], **extra)
    topic = f"{topic_prefix}.public.big"
    daemon = Connector(cfg, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        time.sleep(1.0)
        assert daemon.proc is not None
        idle_kib = vm_kib(daemon.proc.pid, "VmHWM")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO big SELECT g, repeat(md5(g::text), %s) FROM generate_series(1, %s) g",
                (FILLER // 32 + 1, ROWS),
            )
        wait_until(lambda: records_in(services.kafka_bootstrap, topic) >= ROWS, 240, f"{ROWS} records", daemon)
        peak_kib = vm_kib(daemon.proc.pid, "VmHWM")
    finally:
        code = daemon.stop()
    assert code == 0, daemon.output()
    grown_mib = (peak_kib - idle_kib) / 1024
    print(
        f"streaming={streaming}: idle peak {idle_kib / 1024:.0f} MiB, peak {peak_kib / 1024:.0f} MiB, grew "
        f"{grown_mib:.0f} MiB"
    )
    streamed = [e for e in daemon.log_events() if e.get("event") == "streamed_transaction_committed"]
    assert bool(streamed) == streaming, daemon.output()[-3000:]
    assert grown_mib < 100, f"the daemon grew by {grown_mib:.0f} MiB for one {ROWS}-row transaction"
