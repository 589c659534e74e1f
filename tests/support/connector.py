"""Runs the daemon as a real process, as users do: `cdc run --config FILE`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml

from tests.support.db import scalar


def write_config(path: Path, **sections: Any) -> Path:
    """A configuration file; the HTTP endpoint listens on a free port unless the test says otherwise."""
    sections.setdefault("http", {"port": 0, "host": "127.0.0.1"})
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


class Connector:
    def __init__(self, config: Path, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where this run's lines begin in the log (a restart may append to the same file)

    def start(self) -> Connector:
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        # The child gets its own copy of the descriptor; ours is closed at once, so a failing test
        # leaves no open file behind.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cdc.cli", "--log-format", "json", "run", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        return self

    def wait_streaming(self, dsn: str, slot: str, timeout: float = 180.0) -> None:
        """Until the daemon streams (this run logged replication_started and the slot is active) or died.

        The slot alone is not enough: it is active while the daemon creates it for the initial snapshot
        too (a test restarted Postgres then, and the snapshot's worker could not connect).

        The wait is long because a daemon's start is slow on a loaded machine, not because it ever is when
        idle (under 1 s here): in one CI run, 40% slower than the one before it, a daemon started near the
        end of the suite wrote no line at all in 60 s, not even its first (``http_listening``), and was
        stopped before its signal handlers were installed. A daemon that dies ends the wait at once."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"connector exited with {self.proc.returncode}:\n{self.output()}")
                row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
                if row and row[0] and self._logged_since_start(b'"replication_started"'):
                    return
                time.sleep(0.1)
        raise AssertionError(f"connector not streaming after {timeout}s:\n{self.output()}")

    def _logged_since_start(self, text: bytes) -> bool:
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            return text in log.read()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"connector did not stop within {timeout}s after {sig}:\n{self.output()}") from None
        return code

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_events(self) -> list[dict[str, Any]]:
        """Every JSON log event. Several processes (the daemon and its snapshot workers) write to one file, and
        one killed between an event and its newline leaves the next event on the same line: each line is
        read as a run of JSON objects (one that does not parse still raises)."""
        events = []
        decoder = json.JSONDecoder()
        for line in self.output().splitlines():
            at = 0
            while line.startswith("{", at):
                event, at = decoder.raw_decode(line, at)
                events.append(event)
        return events


def drop_slots(admin: psycopg.Connection[Any], dbname: str) -> None:
    """Drop every replication slot of the database, waiting out walsenders that still hold one."""
    for attempt in range(20):
        rows = admin.execute(
            "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (dbname,)
        ).fetchall()
        if not rows:
            return
        busy = []
        for slot, active_pid in rows:
            try:
                admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            except psycopg.errors.ObjectInUse:  # "replication slot ... is active for PID n"
                busy.append((slot, active_pid))
            except psycopg.errors.UndefinedObject:
                pass  # dropped meanwhile
        if not busy:
            return
        if attempt >= 10:  # a client that does not let go: end its walsender
            for _, pid in busy:
                if pid is not None:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.3)
    raise RuntimeError(f"could not drop the replication slots of database {dbname}: still active")


def run_once(tmp_path: Path, config: Path, env: dict[str, str] | None = None, timeout: float = 90) -> tuple[int, str]:
    """Start the connector and wait for it to exit: (exit code, output). For start-ups that must be refused."""
    c = Connector(config, tmp_path / "cdc.log", env=env).start()
    code = c.wait_exit(timeout)
    return code, c.output()


def nothing_created(dsn: str, slot: str, publication: str, kafka_admin: Any, prefix: str) -> None:
    """A refused start-up left no slot, no publication and no topic behind."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is None
        assert conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is None
    if kafka_admin is not None:
        topics = kafka_admin.list_topics(timeout=10).topics
        assert not [t for t in topics if t.startswith(prefix + ".")]


def wait_confirmed(dsn: str, slot: str, target: str | None = None, timeout: float = 90) -> None:
    """Until the slot confirms ``target`` (default: the WAL written so far): the daemon has it all in Kafka
    (acks=all, and the position confirmed only after the acknowledgment)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        if target is None:
            target = scalar(conn.execute("SELECT pg_current_wal_lsn()::text"))
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (target, slot),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise AssertionError(f"slot {slot} did not confirm {target} within {timeout}s")
