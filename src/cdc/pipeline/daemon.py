"""The daemon: health endpoint, wiring, then the loop with its reconnects, until a signal stops it."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import psycopg
import structlog

from cdc.catalog import StartupError
from cdc.config import Config, ConfigError, load_config
from cdc.decoder import pgoutput
from cdc.decoder.errors import ChangeError
from cdc.decoder.spool import SpoolError
from cdc.failover import FailoverWatch
from cdc.instance import InstanceLock
from cdc.observe import HttpEndpoint, SlotReading, Stats
from cdc.outbox.route import OutboxError
from cdc.pipeline.loop import Pipeline
from cdc.pipeline.reconnect import stream_with_retries
from cdc.pipeline.reload import Reloader
from cdc.pipeline.wiring import Components, wire
from cdc.process import tune_gc
from cdc.replication import ReplicationError
from cdc.sink.errors import SerializationError
from cdc.sink.kafka import SinkError
from cdc.sink.registry import RegistryError
from cdc.snapshot.errors import SnapshotError, SnapshotInterrupted
from cdc.snapshot.service import Snapshots

log = structlog.get_logger("cdc.pipeline")

FATAL = (
    StartupError,
    SinkError,
    ReplicationError,
    ChangeError,
    SpoolError,
    SerializationError,
    RegistryError,
    pgoutput.DecodeError,
    ConfigError,
    SnapshotError,
    OutboxError,
)


class Daemon:
    """``cdc run``: serves /healthz from the start (progress during the initial snapshot), wires the
    components, then streams until ``stop``."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.stats = Stats()
        self.stats.queue_limit_bytes = config.limits.max_inflight_bytes
        self._lock = InstanceLock(config.source.conninfo(), config.source.slot)
        self._stop = False
        self._reload_path: Path | None = None
        self._signals: list[str] = []  # received, not yet logged (see note_signal)
        self.pipeline: Pipeline | None = None
        self.components: Components | None = None  # once wired
        self.snapshots: Snapshots | None = None  # from before the initial snapshot on
        self._lag_conn: psycopg.Connection[tuple[object, ...]] | None = None  # the metrics thread's
        self._failover: FailoverWatch | None = None  # a multi-host DSN: the standbys' copies of the slot

    @property
    def events(self) -> int:
        return sum(self.stats.events.values())

    def stop(self) -> None:
        self._stop = True
        if self.pipeline is not None:
            self.pipeline.stop()

    @property
    def stopping(self) -> bool:
        return self._stop

    def request_reload(self, config_path: Path) -> None:
        """SIGHUP: re-read the table list at the next transaction boundary."""
        self._reload_path = config_path

    def note_signal(self, name: str) -> None:
        """From a signal handler, which must not log: structlog's writer holds a non-reentrant lock that the
        interrupted main thread may hold itself (a SIGTERM arriving while a line was written hung the daemon
        until SIGKILL). The signal is logged at the next transaction boundary, or when the daemon ends."""
        self._signals.append(name)

    def log_signals(self) -> None:
        while self._signals:
            log.info("signal", signal=self._signals.pop(0))

    def run(self) -> None:
        http = None
        try:
            if self.config.http.enabled:  # before wiring: progress and health during the initial snapshot
                http = HttpEndpoint(self.stats, self.config.http.host, self.config.http.port)
                http.start()
            components = self.components = wire(
                self.config, self.stats, self._lock, lambda: self._stop, on_snapshots=self._keep_snapshots
            )
            self.config = components.capture.config
            self.stats.starting = False
            self.stats.phase_done("wired")
            if not components.snapshot_plan.stream:
                log.info("snapshot_only_done", mode=self.config.snapshot.mode)  # initial_only
                return
            pipeline = self.pipeline = Pipeline(components, self.stats, self._lock)
            if self._stop:
                pipeline.stop()
            reloader = Reloader(components)
            self.stats.uncaptured = components.decoder.uncaptured
            self.stats.slot = self._slot_lag
            conninfo = self.config.source.conninfo()
            if FailoverWatch.wanted(conninfo):
                watch = self._failover = FailoverWatch(
                    conninfo, self.config.source.slot, self.config.source.failover_check_s
                )
                self.stats.standbys = lambda: watch.latest
                watch.start()

            def between_transactions() -> None:
                self.log_signals()
                if self._reload_path is not None:
                    reloader.request(self._reload_path)
                    self._reload_path = None
                reloader.between_transactions()
                self.config = components.capture.config

            stream_with_retries(
                lambda: pipeline.session(between_transactions),
                lambda: pipeline.streaming_since,
                self.config.reconnect_timeout_s,
                lambda: self._stop,
            )
        finally:
            self.log_signals()
            if http is not None:
                http.stop()
            if self.snapshots is not None:
                self.snapshots.stop()
            self._lock.release()
            if self.pipeline is not None:
                self.pipeline.close()
            if self._lag_conn is not None:
                self._lag_conn.close()
            if self._failover is not None:
                self._failover.stop()

    def _keep_snapshots(self, snapshots: Snapshots) -> None:
        self.snapshots = snapshots

    def _slot_lag(self) -> SlotReading | None:
        """Bytes of WAL the slot holds back, its wal_status and safe_wal_size (read at scrape time, on a
        connection of its own)."""
        try:
            if self._lag_conn is None or self._lag_conn.closed or self._lag_conn.broken:
                self._lag_conn = psycopg.connect(
                    self.config.source.conninfo(application_name="cdc-metrics"), autocommit=True, connect_timeout=5
                )
            row = self._lag_conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, wal_status, safe_wal_size "
                "FROM pg_replication_slots WHERE slot_name = %s",
                (self.config.source.slot,),
            ).fetchone()
        except psycopg.Error as e:
            log.warning("slot_lag_unavailable", error=str(e).strip())
            return None
        if not row:
            return None
        return SlotReading(
            int(str(row[0])) if row[0] is not None else None,
            str(row[1]) if row[1] is not None else None,
            int(str(row[2])) if row[2] is not None else None,
        )


def install_signal_handlers(daemon: Daemon, config_path: Path) -> None:
    """SIGTERM and SIGINT stop the daemon, SIGHUP reloads its table list. The handlers only set flags and
    note the signal (``Daemon.note_signal``): nothing in a handler may log."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        daemon.note_signal(signal.Signals(signum).name)
        daemon.stop()

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        daemon.note_signal("SIGHUP")
        daemon.request_reload(config_path)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)


def run(config_path: Path) -> int:
    """Entry point of ``cdc run``: 0 after a clean stop, 1 on a fatal error, 2 on a bad configuration."""
    try:
        config = load_config(config_path)
    except ConfigError as e:
        log.error("config_invalid", error=str(e))
        return 2
    daemon = Daemon(config)
    install_signal_handlers(daemon, config_path)
    tune_gc()
    try:
        daemon.run()
    except SnapshotInterrupted as e:
        log.warning("snapshot_interrupted", error=str(e))
        return 0 if daemon.stopping else 1
    except FATAL as e:
        log.error("fatal", error=str(e), kind=type(e).__name__)
        return 1
    except OSError as e:  # e.g. the HTTP port is taken
        log.error("fatal", error=str(e), kind=type(e).__name__)
        return 1
    return 0
