"""What an operator can see of a running daemon: /healthz, /readyz and Prometheus /metrics.

The hot path only bumps plain counters on ``Stats``; Prometheus reads them at
scrape time through a collector, so metrics cost nothing per event.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = structlog.get_logger(__name__)


@dataclass
class Stats:
    """Counters the pipeline updates; read by the metrics collector and ``cdc status``."""

    events: Counter[tuple[str, str]] = field(default_factory=Counter)  # (table, op) -> count
    delivery_errors: int = 0
    dead_letters: int = 0
    snapshot_rows: Counter[str] = field(default_factory=Counter)
    uncaptured: Counter[str] = field(default_factory=Counter)  # the decoder's: changes of tables not captured
    messages_left_out: Counter[str] = field(default_factory=Counter)  # logical messages not published, by prefix
    outbox_events: Counter[tuple[str, str]] = field(default_factory=Counter)  # (aggregate type, route) -> count
    outbox_dead_letters: Counter[str] = field(default_factory=Counter)  # reason -> count
    # Unchanged TOASTed values (cdc.pipeline.toast), per table: filled, left with the placeholder (row gone),
    # re-read queries and their seconds.
    toast_filled: Counter[str] = field(default_factory=Counter)
    toast_unresolved: Counter[str] = field(default_factory=Counter)
    toast_fill_queries: Counter[str] = field(default_factory=Counter)
    toast_fill_seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    inflight_bytes: Callable[[], int] = lambda: 0
    inflight_records: Callable[[], int] = lambda: 0
    confirmed_lsn: Callable[[], int] = lambda: 0
    slot_lag_bytes: Callable[[], int | None] = lambda: None
    last_commit_ts_us: int = 0
    last_processed_us: int = 0
    streaming: bool = False
    starting: bool = True  # start-up checks and the initial snapshot run; False once the components are wired
    heartbeat: float = field(default_factory=time.monotonic)  # the main loop touches it every pass
    snapshot_progress: Callable[[], list[Any]] = lambda: []  # cdc.snapshot.progress.SnapshotProgress values
    standbys: Callable[[], list[Any]] = lambda: []  # cdc.failover.HostSlot values (a multi-host DSN)

    def source_lag_ms(self) -> float:
        if not self.last_commit_ts_us:
            return 0.0
        return max(0.0, (self.last_processed_us - self.last_commit_ts_us) / 1000)


def _toast_metrics(s: Stats) -> Iterator[Any]:
    """cdc.pipeline.toast's counters, per table."""
    for name, doc, counts in (
        ("cdc_toast_filled", "Unchanged TOASTed values filled by re-reading their row", s.toast_filled),
        ("cdc_toast_unresolved", "Updates left with toast.placeholder: the row was gone when re-read", s.toast_unresolved),
        ("cdc_toast_fill_queries", "Queries that re-read unchanged TOASTed values", s.toast_fill_queries),
        ("cdc_toast_fill_seconds", "Time spent in those queries", s.toast_fill_seconds),
    ):
        family = CounterMetricFamily(name, doc, labels=["table"])
        for table, n in sorted(counts.items()):
            family.add_metric([table], n)
        yield family


class _StatsCollector(Collector):
    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        s = self._stats
        events = CounterMetricFamily("cdc_events", "Change events published", labels=["table", "op"])
        for (table, op), n in sorted(s.events.items()):
            events.add_metric([table, op], n)
        yield events
        yield CounterMetricFamily("cdc_delivery_errors", "Records Kafka did not accept", value=s.delivery_errors)
        yield CounterMetricFamily("cdc_dead_letters", "Records sent to the dead-letter topic", value=s.dead_letters)
        outbox = CounterMetricFamily(
            "cdc_outbox_events", "Outbox events published", labels=["aggregate_type", "route"]
        )
        for (aggregate_type, route), n in sorted(s.outbox_events.items()):
            outbox.add_metric([aggregate_type, route], n)
        yield outbox
        outbox_dead = CounterMetricFamily(
            "cdc_outbox_dead_letters", "Malformed outbox events sent to the dead-letter topic", labels=["reason"]
        )
        for reason, n in sorted(s.outbox_dead_letters.items()):
            outbox_dead.add_metric([reason], n)
        yield outbox_dead
        yield from _toast_metrics(s)
        skipped = CounterMetricFamily(
            "cdc_uncaptured_changes", "Changes of tables in the publication but not in the configuration", labels=["table"]
        )
        for table, n in sorted(s.uncaptured.items()):
            skipped.add_metric([table], n)
        yield skipped
        left_out = CounterMetricFamily(
            "cdc_messages_left_out", "Logical messages not published (messages.include/exclude, own prefixes)", labels=["prefix"]
        )
        for prefix, n in sorted(s.messages_left_out.items()):
            left_out.add_metric([prefix], n)
        yield left_out
        snap = CounterMetricFamily("cdc_snapshot_rows", "Rows read by snapshots", labels=["table"])
        copied = Counter(s.snapshot_rows)  # while streaming (DBLog chunks released at their watermark)
        for p in s.snapshot_progress():
            if p.kind == "initial":  # its worker processes count in the progress tracker
                for t in p.tables:
                    copied[t.table] += t.rows_done
        for table, n in sorted(copied.items()):
            snap.add_metric([table], n)
        yield snap
        ready = GaugeMetricFamily(
            "cdc_slot_failover_ready", "1 when the standby holds a synchronized, persistent copy of the slot", labels=["host"]
        )
        behind = GaugeMetricFamily(
            "cdc_slot_standby_behind_bytes", "How far the standby's copy of the slot is behind the primary's", labels=["host"]
        )
        for standby in s.standbys():
            if standby.role != "primary":
                name = f"{standby.host}:{standby.port}"
                ready.add_metric([name], 1 if standby.ready else 0)
                if standby.behind_bytes is not None:
                    behind.add_metric([name], standby.behind_bytes)
        yield ready
        yield behind
        yield GaugeMetricFamily("cdc_queue_bytes", "Bytes produced, not yet acknowledged", value=s.inflight_bytes())
        yield GaugeMetricFamily(
            "cdc_inflight_records", "Records produced, not yet acknowledged", value=s.inflight_records()
        )
        yield GaugeMetricFamily("cdc_confirmed_lsn", "LSN confirmed to Postgres", value=s.confirmed_lsn())
        yield GaugeMetricFamily(
            "cdc_source_lag_ms", "Commit-to-processing time of the last transaction", value=s.source_lag_ms()
        )
        lag = s.slot_lag_bytes()
        if lag is not None:
            yield GaugeMetricFamily("cdc_slot_lag_bytes", "WAL the slot retains for us", value=lag)
        yield GaugeMetricFamily("cdc_streaming", "1 while the replication stream runs", value=1 if s.streaming else 0)
        done = GaugeMetricFamily("cdc_snapshot_table_rows", "Rows a snapshot copied", labels=["kind", "table"])
        total = GaugeMetricFamily(
            "cdc_snapshot_table_rows_estimated", "Rows of the table by pg_class at planning", labels=["kind", "table"]
        )
        rate = GaugeMetricFamily("cdc_snapshot_rows_per_second", "Snapshot rows per second", labels=["kind"])
        eta = GaugeMetricFamily("cdc_snapshot_eta_seconds", "Estimated seconds left", labels=["kind"])
        running = GaugeMetricFamily("cdc_snapshot_running", "1 while a snapshot runs", labels=["kind"])
        for p in s.snapshot_progress():
            for t in p.tables:
                done.add_metric([p.kind, t.table], t.rows_done)
                total.add_metric([p.kind, t.table], t.rows_estimated)
            rate.add_metric([p.kind], p.rows_per_s)
            running.add_metric([p.kind], 1 if p.running else 0)
            if p.eta_s is not None:
                eta.add_metric([p.kind], p.eta_s)
        yield from (done, total, rate, eta, running)


class HttpEndpoint:
    """/healthz: the main loop is alive. /readyz: streaming. /metrics: Prometheus text format."""

    def __init__(self, stats: Stats, host: str, port: int, *, stall_after_s: float = 120.0) -> None:
        self.stats = stats
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(stats))
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path == "/metrics":
                    self._reply(200, generate_latest(registry), "text/plain; version=0.0.4")
                elif self.path == "/healthz":
                    stalled = time.monotonic() - stats.heartbeat > stall_after_s
                    body = b"stalled\n" if stalled else b"starting\n" if stats.starting else b"ok\n"
                    self._reply(503 if stalled else 200, body)
                elif self.path == "/readyz":
                    ready = stats.streaming and not stats.starting
                    self._reply(200 if ready else 503, b"ready\n" if ready else b"starting\n" if stats.starting else b"not ready\n")
                else:
                    self._reply(404, b"not found\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
                pass

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise OSError(
                f"cannot listen on {host}:{port} for /healthz, /readyz and /metrics: {e.strerror}. "
                "Fix: set http.port to a free port (0 picks one), or http.enabled: false."
            ) from None
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="cdc-http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("http_listening", port=self.port, paths=["/healthz", "/readyz", "/metrics"])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
