"""The snapshot tests' helpers: the real daemon on a thread, a workload that writes the very rows being
read, and the check that a table's topic replayed from offset 0 equals the table.

The decoder's streaming of large transactions is off in these tests: its spool locks a directory per
slot for the life of the process, and the tests restart a daemon on the same slot within one process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import psycopg
import yaml
from confluent_kafka import Message

from cdc import log as logsetup
from cdc.config import Config
from cdc.pipeline import Daemon
from cdc.snapshot.config import SnapshotConfig
from cdc.snapshot.modes import StartupPlan


class SnapshotPipeline(Daemon):
    """The real daemon (``cdc.pipeline.Daemon``), with the snapshot settings in its configuration, plus
    what the snapshot tests look at: its snapshot service and start-up plan, and a failure on its thread."""

    def __init__(self, config: Config, snapshot: SnapshotConfig) -> None:
        super().__init__(config.model_copy(update={"snapshot": snapshot}))
        self.failure: BaseException | None = None

    @property
    def plan(self) -> StartupPlan | None:
        return self.components.snapshot_plan if self.components is not None else None


def make_config(
    services: Any, dsn: str, slot: str, publication: str, prefix: str, tables: list[Any], **extra: Any
) -> Config:
    kafka = {"bootstrap_servers": services.kafka_bootstrap, "partitions": 3}
    kafka.update(extra.pop("kafka", {}))
    return Config.model_validate(
        {
            "source": {"dsn": dsn, "slot": slot, "publication": publication},
            "tables": tables,
            "kafka": kafka,
            "topic_prefix": prefix,
            "status_interval_s": 1.0,
            "http": {"enabled": False},
            "decoder": {"streaming": False},
            **extra,
        }
    )


class Running:
    """A SnapshotPipeline on a thread."""

    def __init__(self, pipeline: SnapshotPipeline) -> None:
        self.pipeline = pipeline
        self.thread = threading.Thread(target=self._run, name="snapshot-pipeline", daemon=True)

    def _run(self) -> None:
        try:
            self.pipeline.run()
        except BaseException as e:
            self.pipeline.failure = e

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.pipeline.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the pipeline did not stop"

    def check(self) -> None:
        if self.pipeline.failure is not None:
            raise self.pipeline.failure


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, check: Callable[[], None] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


_Seen = TypeVar("_Seen")


def freeze_when(
    pid: int, read: Callable[[], _Seen], ready: Callable[[_Seen], bool], timeout: float, what: str
) -> _Seen:
    """Stop process ``pid`` (SIGSTOP) at the first reading that is ``ready`` and return that reading; the
    process stays stopped (kill it, or SIGCONT it).

    Every reading is taken while the process is stopped, and it runs only in short slices between them:
    checking a daemon and then killing it lets it go on in between (a snapshot once finished all its
    chunks there). A snapshot's main process hands each worker at most two chunks, so its workers get
    at most that far while it is stopped."""
    deadline = time.monotonic() + timeout
    while True:
        os.kill(pid, signal.SIGSTOP)
        seen = read()
        if ready(seen):
            return seen
        os.kill(pid, signal.SIGCONT)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {seen!r}")
        time.sleep(0.05)


def slot_confirmed_past(dsn: str, slot: str, lsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn >= %s::pg_lsn, active FROM pg_replication_slots WHERE slot_name = %s",
            (lsn, slot),
        ).fetchone()
    return bool(row and row[0])


def current_lsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


# --------------------------------------------------------------------------- workload


class Workload:
    """Inserts, updates, key changes and deletes on random rows of ``t`` (and of ``events`` if present),
    each in its own transaction, until stopped."""

    def __init__(self, dsn: str, max_id: int, *, seed: int = 7, keyless: bool = False, pause_s: float = 0.0) -> None:
        self.dsn = dsn
        self.max_id = max_id
        self.next_id = max_id * 10
        self.random = random.Random(seed)
        self.keyless = keyless
        self.pause_s = pause_s
        self.ops = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def start(self) -> Workload:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error
        return self.ops

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    self._one(conn)
                    self.ops += 1
                    if self.pause_s:
                        time.sleep(self.pause_s)
        except BaseException as e:
            self.error = e

    def _one(self, conn: psycopg.Connection[Any]) -> None:
        r = self.random
        i = r.randint(1, self.max_id)
        roll = r.random()
        if roll < 0.35:
            conn.execute("UPDATE t SET v = v || '+', n = n + 1, flag = NOT flag WHERE id = %s", (i,))
        elif roll < 0.5:
            self.next_id += 1
            conn.execute("INSERT INTO t VALUES (%s, 'new', 0, true, NULL)", (self.next_id,))
        elif roll < 0.65:
            conn.execute("DELETE FROM t WHERE id = %s", (i,))
        elif roll < 0.75:
            self.next_id += 1
            conn.execute("UPDATE t SET id = %s, v = 'moved' WHERE id = %s", (self.next_id, i))
        elif roll < 0.85:
            with conn.transaction():
                conn.execute("UPDATE t SET n = n + 100 WHERE id BETWEEN %s AND %s", (i, i + 20))
                conn.execute("DELETE FROM t WHERE id = %s", (i + 21,))
                self.next_id += 1
                conn.execute("INSERT INTO t VALUES (%s, 'tx', 1, false, 'x')", (self.next_id,))
        elif self.keyless:
            code = f"c{r.randint(1, self.max_id // 10)}"
            if roll < 0.92:
                conn.execute("UPDATE events SET n = n + 1 WHERE code = %s", (code,))
            elif roll < 0.96:
                conn.execute("DELETE FROM events WHERE code = %s", (code,))
            else:
                self.next_id += 1
                conn.execute("INSERT INTO events VALUES (%s, 0)", (f"n{self.next_id}",))
        else:
            conn.execute("UPDATE t SET note = %s WHERE id = %s", ('note\t\\ "quoted"\n', i))


SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL, n bigint NOT NULL, flag bool NOT NULL, note text);
"""


def fill(dsn: str, rows: int, *, keyless_rows: int = 0) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(
            "INSERT INTO t SELECT i, 'v' || i, i, i %% 2 = 0, CASE WHEN i %% 7 = 0 THEN NULL ELSE E'n\\t' || i END "
            "FROM generate_series(1, %s) i",
            (rows,),
        )
        if keyless_rows:
            conn.execute("CREATE TABLE events (code text NOT NULL, n int NOT NULL)")
            conn.execute("ALTER TABLE events REPLICA IDENTITY FULL")
            conn.execute("INSERT INTO events SELECT 'c' || i, i FROM generate_series(1, %s) i", (keyless_rows,))
        conn.execute("ANALYZE")


# --------------------------------------------------------------------------- replay and compare


def replay(messages: list[Message]) -> dict[bytes, dict[str, Any]]:
    """Latest value per key from offset 0: tombstones delete, a truncate marker empties its partition."""
    state: dict[int, dict[bytes, dict[str, Any]]] = {}
    for m in messages:
        part = state.setdefault(m.partition() or 0, {})
        key = m.key()
        assert key is not None, "a record without a key on a compacted topic"
        value = m.value()
        if value is None:
            part.pop(key, None)
            continue
        if dict(m.headers() or []).get("cdc.truncate") == b"1":  # a truncate marker (key: the key fields, all null)
            part.clear()
            continue
        part[key] = json.loads(value)
    out: dict[bytes, dict[str, Any]] = {}
    for part in state.values():
        out.update(part)
    return out


def table_rows(dsn: str, query: str, key_columns: tuple[str, ...]) -> dict[bytes, dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query)
        names = [d.name for d in cur.description or ()]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return {json.dumps({k: r[k] for k in key_columns}, separators=(",", ":")).encode(): r for r in rows}


def assert_topic_equals_table(
    consume_all: Any, topic: str, dsn: str, query: str, key: tuple[str, ...] = ("id",)
) -> int:
    state = replay(consume_all([topic], timeout=60.0))
    expected = table_rows(dsn, query, key)
    after = {k: v["after"] for k, v in state.items()}
    missing = sorted(set(expected) - set(after))[:5]
    extra = sorted(set(after) - set(expected))[:5]
    wrong = [(k, after[k], expected[k]) for k in expected if k in after and after[k] != expected[k]][:5]
    assert not missing and not extra and not wrong, (
        f"{topic} differs from the table: {len(set(expected) - set(after))} rows missing (e.g. {missing}), "
        f"{len(set(after) - set(expected))} extra (e.g. {extra}), wrong values (e.g. {wrong})"
    )
    return len(expected)


# --------------------------------------------------------------------------- a daemon in a subprocess


def main(argv: list[str]) -> int:
    """``python -c 'from tests.support.snapshots import main; main([...])' CONFIG SNAPSHOT_JSON``"""
    logsetup.configure("json", "info")
    config = Config(**yaml.safe_load(Path(argv[0]).read_text()))
    snapshot = SnapshotConfig(**json.loads(Path(argv[1]).read_text()))
    pipeline = SnapshotPipeline(config, snapshot)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        pipeline.stop()

    signal.signal(signal.SIGTERM, on_signal)
    pipeline.run()
    return 0


def write_subprocess_config(path: Path, config: Config) -> Path:
    data: Mapping[str, Any] = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
