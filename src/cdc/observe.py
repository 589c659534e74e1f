"""What an operator can see of a running daemon: /healthz, /readyz and Prometheus /metrics.

The hot path only bumps plain counters on ``Stats``; Prometheus reads them at
scrape time through a collector, so metrics cost nothing per event.
"""

from __future__ import annotations

import json
import threading
import time
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

log = structlog.get_logger(__name__)


WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")
"""pg_replication_slots.wal_status's values: ``cdc_slot_wal_status{status}`` has one series for each."""

TRANSACTION_EVENT_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
"""Upper bounds of ``cdc_transaction_events``'s buckets (events per source transaction)."""


@dataclass(frozen=True, slots=True)
class SlotReading:
    """The slot's row of pg_replication_slots, read at scrape time."""

    lag_bytes: int | None  # pg_current_wal_lsn() - confirmed_flush_lsn
    wal_status: str | None  # reserved, extended, unreserved, lost (PostgreSQL 13+)
    safe_wal_size_bytes: int | None  # WAL that may still be written before the slot is in danger; None: no limit


class EventHistogram:
    """Events per source transaction: one list index per commit on the hot path, a histogram at scrape time."""

    def __init__(self, bounds: tuple[int, ...] = TRANSACTION_EVENT_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0

    def observe(self, n: int) -> None:
        self.counts[bisect_left(self.bounds, n)] += 1
        self.sum += n

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((str(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


class ProducerStats:
    """librdkafka's statistics (``statistics.interval.ms``, ``stats_cb``) of the daemon's producers, as
    counters that survive a producer being replaced: each report adds what moved since that producer's last."""

    COUNTERS = ("tx", "txretries", "txerrs", "req_timeouts")  # per broker, cumulative in librdkafka

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str, str], int] = {}  # (producer, broker, field) -> its last total
        self._seen: dict[str, float] = {}  # producer -> monotonic time of its last report
        self.totals: Counter[tuple[str, str]] = Counter()  # (field, broker) -> total
        self.batches = 0
        self.batch_bytes = 0
        self.rtt: dict[str, tuple[float, float]] = {}  # broker -> (p50, p99) seconds of the last window
        self.up: dict[str, bool] = {}  # broker -> its connection's state was UP in the last report
        self.queue: dict[str, tuple[int, int]] = {}  # producer -> (messages, bytes) in librdkafka's queue
        self.reports = 0

    def on_stats(self, text: str) -> None:
        """The ``stats_cb``: called from the producer's poll() with librdkafka's statistics JSON."""
        try:
            d = json.loads(text)
        except ValueError:
            return
        now = time.monotonic()
        name = str(d.get("name", ""))
        with self._lock:
            self.reports += 1
            self._seen[name] = now
            for gone in [p for p, at in self._seen.items() if now - at > 600]:
                del self._seen[gone]
                self.queue.pop(gone, None)
                for key in [k for k in self._last if k[0] == gone]:
                    del self._last[key]
            self.queue[name] = (int(d.get("msg_cnt", 0)), int(d.get("msg_size", 0)))
            reported: set[str] = set()
            for broker in d.get("brokers", {}).values():
                nodeid = int(broker.get("nodeid", -1))
                if nodeid < 0:  # a bootstrap address, not a broker of the cluster
                    continue
                label = str(nodeid)
                reported.add(label)
                self.up[label] = broker.get("state") == "UP"
                for fld in self.COUNTERS:
                    value = int(broker.get(fld, 0))
                    key = (name, label, fld)
                    before = self._last.get(key, 0)
                    self._last[key] = value
                    self.totals[(fld, label)] += value - before if value >= before else value
                rtt = broker.get("rtt") or {}
                if rtt.get("cnt"):
                    self.rtt[label] = (rtt.get("p50", 0) / 1e6, rtt.get("p99", 0) / 1e6)
            for label in set(self.up) - reported:  # librdkafka drops a broker it lost from its statistics
                self.up[label] = False
                self.rtt.pop(label, None)
            for topic in d.get("topics", {}).values():  # window statistics: rolled over at each report
                self.batches += int((topic.get("batchcnt") or {}).get("cnt", 0))
                self.batch_bytes += int((topic.get("batchsize") or {}).get("sum", 0))

    def hooks(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with the statistics callback (every 10 s unless ``statistics.interval.ms`` says; 0: off)."""
        out = dict(config)
        out.setdefault("statistics.interval.ms", 10_000)
        if int(out["statistics.interval.ms"]) > 0:
            out["stats_cb"] = self.on_stats
        return out


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
    slot: Callable[[], SlotReading | None] = lambda: None  # read at scrape time
    queue_limit_bytes: int = 0  # limits.max_inflight_bytes
    backpressure_s: float = 0.0  # time the main loop waited on Kafka with the queue full
    last_server_message: Callable[[], float | None] = lambda: None  # monotonic time of the stream's last message
    transaction_events: EventHistogram = field(default_factory=EventHistogram)
    producer: ProducerStats = field(default_factory=ProducerStats)
    started: float = field(default_factory=time.monotonic)
    startup_phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds, in the order they ran
    last_commit_ts_us: int = 0
    last_processed_us: int = 0
    streaming: bool = False
    starting: bool = True  # start-up checks and the initial snapshot run; False once the components are wired
    heartbeat: float = field(default_factory=time.monotonic)  # the main loop touches it every pass
    snapshot_progress: Callable[[], list[Any]] = lambda: []  # cdc.snapshot.progress.SnapshotProgress values
    standbys: Callable[[], list[Any]] = lambda: []  # cdc.failover.HostSlot values (a multi-host DSN)

    def phase_done(self, phase: str) -> None:
        """A start-up phase ended: it took the time since the last one ended (or since the process started)."""
        now = time.monotonic()
        self.startup_phases[phase] = now - self.started - sum(self.startup_phases.values())

    def source_lag_ms(self) -> float:
        if not self.last_commit_ts_us:
            return 0.0
        return max(0.0, (self.last_processed_us - self.last_commit_ts_us) / 1000)


def _toast_metrics(s: Stats) -> Iterator[Any]:
    """cdc.pipeline.toast's counters, per table."""
    for name, doc, counts in (
        ("cdc_toast_filled", "Unchanged TOASTed values filled by re-reading their row", s.toast_filled),
        (
            "cdc_toast_unresolved",
            "Updates left with toast.placeholder: the row was gone when re-read",
            s.toast_unresolved,
        ),
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
        yield from self._counts(s)
        yield from self._standbys(s)
        yield from self._positions(s)
        yield from self._slot(s)
        yield from self._liveness(s)
        yield from self._producer(s.producer)
        yield from self._snapshots(s)

    @staticmethod
    def _counts(s: Stats) -> Iterator[Any]:
        """What was published, dead-lettered, filled, left out and snapshotted: counters by label."""
        events = CounterMetricFamily("cdc_events", "Change events published", labels=["table", "op"])
        for (table, op), n in sorted(s.events.items()):
            events.add_metric([table, op], n)
        yield events
        yield CounterMetricFamily("cdc_delivery_errors", "Records Kafka did not accept", value=s.delivery_errors)
        yield CounterMetricFamily("cdc_dead_letters", "Records sent to the dead-letter topic", value=s.dead_letters)
        outbox = CounterMetricFamily("cdc_outbox_events", "Outbox events published", labels=["aggregate_type", "route"])
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
            "cdc_uncaptured_changes",
            "Changes of tables in the publication but not in the configuration",
            labels=["table"],
        )
        for table, n in sorted(s.uncaptured.items()):
            skipped.add_metric([table], n)
        yield skipped
        left_out = CounterMetricFamily(
            "cdc_messages_left_out",
            "Logical messages not published (messages.include/exclude, own prefixes)",
            labels=["prefix"],
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

    @staticmethod
    def _standbys(s: Stats) -> Iterator[Any]:
        """The standbys that hold a synchronized copy of the slot, and how far behind it is."""
        ready = GaugeMetricFamily(
            "cdc_slot_failover_ready",
            "1 when the standby holds a synchronized, persistent copy of the slot",
            labels=["host"],
        )
        behind = GaugeMetricFamily(
            "cdc_slot_standby_behind_bytes",
            "How far the standby's copy of the slot is behind the primary's",
            labels=["host"],
        )
        for standby in s.standbys():
            if standby.role != "primary":
                name = f"{standby.host}:{standby.port}"
                ready.add_metric([name], 1 if standby.ready else 0)
                if standby.behind_bytes is not None:
                    behind.add_metric([name], standby.behind_bytes)
        yield ready
        yield behind

    @staticmethod
    def _positions(s: Stats) -> Iterator[Any]:
        """What is in flight, what is confirmed, and the lag behind the source."""
        yield GaugeMetricFamily("cdc_queue_bytes", "Bytes produced, not yet acknowledged", value=s.inflight_bytes())
        yield GaugeMetricFamily(
            "cdc_inflight_records", "Records produced, not yet acknowledged", value=s.inflight_records()
        )
        yield GaugeMetricFamily("cdc_confirmed_lsn", "LSN confirmed to Postgres", value=s.confirmed_lsn())
        yield GaugeMetricFamily(
            "cdc_source_lag_ms", "Commit-to-processing time of the last transaction", value=s.source_lag_ms()
        )
        yield GaugeMetricFamily(
            "cdc_source_lag_seconds",
            "Commit-to-processing time of the last transaction",
            value=s.source_lag_ms() / 1000,
        )

    @staticmethod
    def _liveness(s: Stats) -> Iterator[Any]:
        """Whether the loop streams and is alive, backpressure, transaction sizes, start-up phases."""
        yield GaugeMetricFamily("cdc_streaming", "1 while the replication stream runs", value=1 if s.streaming else 0)
        yield GaugeMetricFamily(
            "cdc_starting", "1 during the start-up checks and the initial snapshot", value=1 if s.starting else 0
        )
        yield GaugeMetricFamily(
            "cdc_main_loop_heartbeat_age_seconds",
            "Seconds since the main loop (or the initial snapshot) last showed it is alive",
            value=max(0.0, time.monotonic() - s.heartbeat),
        )
        last = s.last_server_message() if s.streaming else None
        if last is not None:
            yield GaugeMetricFamily(
                "cdc_server_message_age_seconds",
                "Seconds since the last message (data or keepalive) from the server on the replication connection",
                value=max(0.0, time.monotonic() - last),
            )
        yield GaugeMetricFamily("cdc_queue_limit_bytes", "limits.max_inflight_bytes", value=s.queue_limit_bytes)
        yield CounterMetricFamily(
            "cdc_backpressure_seconds",
            "Time the main loop stopped reading WAL because the queue was full",
            value=s.backpressure_s,
        )
        yield HistogramMetricFamily(
            "cdc_transaction_events",
            "Events per source transaction",
            buckets=s.transaction_events.buckets(),
            sum_value=s.transaction_events.sum,
        )
        phases = GaugeMetricFamily("cdc_startup_phase_seconds", "How long each start-up phase took", labels=["phase"])
        for phase, seconds in s.startup_phases.items():
            phases.add_metric([phase], seconds)
        yield phases

    @staticmethod
    def _snapshots(s: Stats) -> Iterator[Any]:
        """Each snapshot's progress by kind and table."""
        done = GaugeMetricFamily("cdc_snapshot_table_rows", "Rows a snapshot copied", labels=["kind", "table"])
        total = GaugeMetricFamily(
            "cdc_snapshot_table_rows_estimated", "Rows of the table by pg_class at planning", labels=["kind", "table"]
        )
        rate = GaugeMetricFamily("cdc_snapshot_rows_per_second", "Snapshot rows per second", labels=["kind"])
        eta = GaugeMetricFamily("cdc_snapshot_eta_seconds", "Estimated seconds left", labels=["kind"])
        running = GaugeMetricFamily("cdc_snapshot_running", "1 while a snapshot runs", labels=["kind"])
        chunks = GaugeMetricFamily("cdc_snapshot_table_chunks", "Chunks a snapshot finished", labels=["kind", "table"])
        planned = GaugeMetricFamily(
            "cdc_snapshot_table_chunks_planned",
            "Chunks a snapshot planned (0 when not chunked)",
            labels=["kind", "table"],
        )
        for p in s.snapshot_progress():
            for t in p.tables:
                done.add_metric([p.kind, t.table], t.rows_done)
                total.add_metric([p.kind, t.table], t.rows_estimated)
                chunks.add_metric([p.kind, t.table], t.chunks_done)
                planned.add_metric([p.kind, t.table], t.chunks_total)
            rate.add_metric([p.kind], p.rows_per_s)
            running.add_metric([p.kind], 1 if p.running else 0)
            if p.eta_s is not None:
                eta.add_metric([p.kind], p.eta_s)
        yield from (done, total, chunks, planned, rate, eta, running)

    @staticmethod
    def _slot(s: Stats) -> Iterator[Any]:
        reading = s.slot()
        if reading is None:
            return
        if reading.lag_bytes is not None:
            yield GaugeMetricFamily("cdc_slot_lag_bytes", "WAL the slot retains for us", value=reading.lag_bytes)
        if reading.safe_wal_size_bytes is not None:
            yield GaugeMetricFamily(
                "cdc_slot_safe_wal_size_bytes",
                "WAL that may still be written before the slot is in danger of invalidation (max_slot_wal_keep_size)",
                value=reading.safe_wal_size_bytes,
            )
        if reading.wal_status is not None:
            status = GaugeMetricFamily(
                "cdc_slot_wal_status",
                "1 for the slot's wal_status (reserved, extended, unreserved, lost)",
                labels=["status"],
            )
            for name in WAL_STATUSES:
                status.add_metric([name], 1 if reading.wal_status == name else 0)
            yield status

    @staticmethod
    def _producer(p: ProducerStats) -> Iterator[Any]:
        with p._lock:
            totals = dict(p.totals)
            rtt = dict(p.rtt)
            up = dict(p.up)
            queue = list(p.queue.values())
            batches, batch_bytes = p.batches, p.batch_bytes
        names = {
            "tx": ("cdc_kafka_requests", "Requests the producers sent to each broker"),
            "txretries": ("cdc_kafka_request_retries", "Requests the producers sent again"),
            "txerrs": ("cdc_kafka_request_errors", "Requests that failed to be sent"),
            "req_timeouts": ("cdc_kafka_request_timeouts", "Requests that timed out"),
        }
        for fld, (name, text) in names.items():
            family = CounterMetricFamily(name, text, labels=["broker"])
            for (f, broker), n in sorted(totals.items()):
                if f == fld:
                    family.add_metric([broker], n)
            yield family
        yield CounterMetricFamily(
            "cdc_kafka_batches", "Message batches (MessageSets) the producers sent", value=batches
        )
        yield CounterMetricFamily("cdc_kafka_batch_bytes", "Bytes of the batches the producers sent", value=batch_bytes)
        round_trip = GaugeMetricFamily(
            "cdc_kafka_broker_rtt_seconds",
            "Broker round-trip time in the last statistics window",
            labels=["broker", "quantile"],
        )
        for broker, (p50, p99) in sorted(rtt.items()):
            round_trip.add_metric([broker, "0.5"], p50)
            round_trip.add_metric([broker, "0.99"], p99)
        yield round_trip
        broker_up = GaugeMetricFamily(
            "cdc_kafka_broker_up",
            "1 when the producer's connection to the broker was up at its last report",
            labels=["broker"],
        )
        for broker, is_up in sorted(up.items()):
            broker_up.add_metric([broker], 1 if is_up else 0)
        yield broker_up
        yield GaugeMetricFamily(
            "cdc_kafka_producer_queue_messages",
            "Messages in librdkafka's queue, not yet acknowledged",
            value=sum(m for m, _ in queue),
        )
        yield GaugeMetricFamily(
            "cdc_kafka_producer_queue_bytes",
            "Bytes in librdkafka's queue, not yet acknowledged",
            value=sum(b for _, b in queue),
        )


class HttpEndpoint:
    """/healthz: the main loop is alive. /readyz: streaming. /metrics: Prometheus text format."""

    def __init__(self, stats: Stats, host: str, port: int, *, stall_after_s: float = 120.0) -> None:
        self.stats = stats
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(stats))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._reply(200, generate_latest(registry), "text/plain; version=0.0.4")
                elif self.path == "/healthz":
                    stalled = time.monotonic() - stats.heartbeat > stall_after_s
                    body = b"stalled\n" if stalled else b"starting\n" if stats.starting else b"ok\n"
                    self._reply(503 if stalled else 200, body)
                elif self.path == "/readyz":
                    ready = stats.streaming and not stats.starting
                    self._reply(
                        200 if ready else 503,
                        b"ready\n" if ready else b"starting\n" if stats.starting else b"not ready\n",
                    )
                else:
                    self._reply(404, b"not found\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
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
