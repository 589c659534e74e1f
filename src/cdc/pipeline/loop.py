"""The loop: one replication session, read -> decode -> the chain -> deliver, and keeping up.

One thread does everything, in this order per frame: read, decode, pass each event
through the chain of stages (``cdc.pipeline.stages``), whose end serializes and
produces, then serve delivery reports and confirm what is acknowledged. When
in-flight bytes pass the budget it stops reading WAL (Postgres keeps it in the slot)
and only serves delivery reports and status updates until the budget frees up.

The commit of a source transaction, in order:
1. ``delivery.begin`` at its BEGIN decides whether it is delivered at all (exactly-once skips what the
   offsets topic already holds); a skipped transaction meets no stage.
2. Its events pass through the chain and are produced as they come.
3. At its COMMIT the chain sees the commit, then ``delivery.commit`` ends it (exactly-once: the position
   goes into the Kafka transaction; at-least-once: the commit's end LSN waits for its records' acks).
4. ``keep_up`` confirms to Postgres only what delivery reports acknowledged (invariant 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, cast

import psycopg
import structlog

from cdc.config import Config
from cdc.event import ChangeEvent, Event, TxBegin, TxCommit
from cdc.instance import InstanceLock
from cdc.observe import Stats
from cdc.pipeline.wiring import Components
from cdc.replication import ConnectionLost, ReplicationStream, protocol_for
from cdc.sink.delivery import RetryableSinkError
from cdc.sink.kafka import DeliveryFailed
from cdc.sink.metadata import Heartbeat

log = structlog.get_logger("cdc.pipeline")

# Housekeeping runs every this many frames, when the stream is idle, and every 1,024 events inside one
# frame (the commit of a streamed transaction releases all of it at once).
_FRAMES_PER_KEEP_UP: Final = 64


class Pipeline:
    """Runs the components ``wire`` built, one replication session at a time (``session``)."""

    def __init__(self, components: Components, stats: Stats, lock: InstanceLock) -> None:
        self.components = components
        self.stats = stats
        self._lock = lock
        self._stop = False
        self.streaming_since: float | None = None  # monotonic; None while the session is not streaming
        self._side_conn: psycopg.Connection[tuple[object, ...]] | None = None  # the heartbeat action's
        self._sessions = 0  # replication sessions started

    @property
    def config(self) -> Config:
        return self.components.capture.config

    def stop(self) -> None:
        self._stop = True

    @property
    def stopping(self) -> bool:
        return self._stop

    def session(self, between_transactions: Callable[[], None]) -> None:
        """One replication connection, from the slot's confirmed position until stop or failure.

        ``between_transactions()`` runs when no source transaction is open (reload, rescan)."""
        c = self.components
        cfg = self.config
        stats = self.stats
        stream = c.transport()
        self.streaming_since = None
        heartbeat = (
            Heartbeat(cfg.topic_prefix, cfg.heartbeat.interval_ms / 1000, c.serializer)
            if cfg.heartbeat.interval_ms
            else None
        )
        self._expose(stream)
        try:
            self._start(stream)
            self._stream(stream, between_transactions, heartbeat)
            self._drain(stream)
        except (ConnectionLost, RetryableSinkError):
            stats.streaming = False
            self._recover(stream)
            raise
        except DeliveryFailed:
            stats.delivery_errors += 1
            stats.streaming = False
            stream.close()
            raise
        except BaseException:
            stats.streaming = False
            stream.close()
            raise

    def _expose(self, stream: ReplicationStream) -> None:
        """What /metrics and /healthz read of this session: in-flight records, the confirmed position."""
        delivery, stats = self.components.delivery, self.stats
        stats.inflight_bytes = lambda: delivery.inflight_bytes
        stats.inflight_records = lambda: delivery.inflight_records
        stats.confirmed_lsn = lambda: int(stream.flushed)
        stats.last_server_message = lambda: stream.last_message

    def _start(self, stream: ReplicationStream) -> None:
        """Connect and start streaming from what Kafka acknowledged; the decoder, history and snapshots afresh."""
        c, cfg = self.components, self.config
        self._lock.ensure()
        stream.connect()
        proto, options = protocol_for(stream.server_version, streaming=cfg.decoder.streaming)
        stream.start(
            cfg.source.slot,
            cfg.source.publication,
            c.delivery.acknowledged(),
            proto_version=proto,
            options=options,
            messages=True,  # watermarks
        )
        c.decoder.reset()
        if c.history is not None and self._sessions:
            # What the last session sent but Kafka never took (an aborted transaction, a failed
            # delivery) is not published: the versions are read again, and Relation messages resent.
            c.history.refresh(cfg.kafka.bootstrap_servers, cfg.kafka.producer)
        self._sessions += 1
        c.snapshots.reset()  # windows open in the last session are read again
        c.snapshots.start()  # DBLog jobs and the signal table
        self.stats.streaming = True
        self.streaming_since = time.monotonic()

    def _stream(
        self, stream: ReplicationStream, between_transactions: Callable[[], None], heartbeat: Heartbeat | None
    ) -> None:
        """Read, decode and dispatch until stopped: the per-event path, with housekeeping every 64 frames."""
        c, stats = self.components, self.stats
        delivery, chain, toast = c.delivery, c.chain, c.toast
        budget = self.config.limits.max_inflight_bytes
        feed = c.decoder.feed
        row, other = chain.row, chain.other
        skipping = False
        in_tx = False

        def dispatch(event: Event) -> None:
            """One event, as the commit order above says; what ``toast`` held comes here when released."""
            nonlocal skipping, in_tx
            kind = type(event)
            if kind is ChangeEvent:
                if not skipping:
                    row(event)  # type: ignore[arg-type]
            elif kind is TxBegin:
                skipping = not delivery.begin(event)  # type: ignore[arg-type]
                in_tx = True
                if not skipping:
                    other(event)
            elif kind is TxCommit:
                if not skipping:
                    other(event)
                commit = cast(TxCommit, event)
                delivery.commit(commit)
                skipping = in_tx = False
                stats.last_commit_ts_us = commit.commit_ts_us
                stats.last_processed_us = time.time_ns() // 1000
                stats.transaction_events.observe(commit.event_count)
            elif not skipping:  # a truncate or a logical message
                other(event)

        # Unchanged TOASTed values (cdc.pipeline.toast): a row change with them, and every event after it
        # while any is held, goes to the fill, which dispatches them in order once their values are read.
        toast.start(dispatch)
        frames = events = 0
        while not self._stop:
            holding = toast.holding
            frame = stream.read(0.0 if holding else 0.2)  # nothing waiting while holding: release it
            if frame is not None:
                lsn, payload = frame
                # Usually one event or none; the commit of a streamed transaction releases all of it.
                for event in feed(payload, lsn):
                    if toast.holding:
                        toast.take(event)
                    elif type(event) is ChangeEvent:  # the common case, without dispatch's call
                        if not skipping:
                            if event.unchanged:
                                toast.take(event)
                            else:
                                row(event)
                    else:
                        dispatch(event)
                    events += 1
                    if events & 1023 == 0:  # also inside a replay of millions of events
                        self.keep_up(stream, budget)
                frames += 1
                if frames < _FRAMES_PER_KEEP_UP:
                    continue  # housekeeping below runs every 64 frames, or when the stream is idle
            elif holding:
                toast.flush()
            frames = 0
            self.keep_up(stream, budget)
            if not in_tx and not toast.holding:
                self._between_transactions(between_transactions, heartbeat)

    def _between_transactions(self, between_transactions: Callable[[], None], heartbeat: Heartbeat | None) -> None:
        """No source transaction open: reload and rescan (``between_transactions``), then a heartbeat when due."""
        between_transactions()
        if heartbeat is not None:
            beat = heartbeat.due()
            if beat is not None:
                self.components.delivery.send_outside(beat)
                self._heartbeat_action()

    def keep_up(self, stream: ReplicationStream, budget: int) -> None:
        """Housekeeping: serve delivery reports, confirm, keep the server and /healthz answered, apply the budget."""
        delivery = self.components.delivery
        delivery.tick()
        stream.confirm(delivery.acknowledged())
        stream.send_status_if_due()  # the server ends a connection that stays silent for wal_sender_timeout
        self.stats.heartbeat = time.monotonic()
        self.stats.dead_letters = delivery.dead_lettered + sum(self.stats.outbox_dead_letters.values())
        if delivery.inflight_bytes > budget:
            self._wait_for_kafka(stream, budget)

    def _wait_for_kafka(self, stream: ReplicationStream, budget: int) -> None:
        """Backpressure: stop reading WAL (Postgres keeps it) until Kafka took half the budget back."""
        delivery = self.components.delivery
        paused = time.monotonic()
        log.info("backpressure_on", inflight_bytes=delivery.inflight_bytes, budget=budget)
        while delivery.inflight_bytes > budget // 2 and not self._stop:
            self.stats.heartbeat = time.monotonic()  # waiting on Kafka is not a hung daemon
            delivery.tick()
            time.sleep(0.01)
            stream.confirm(delivery.acknowledged())
            stream.send_status_if_due()
        self.stats.backpressure_s += time.monotonic() - paused
        log.info("backpressure_off", paused_s=round(time.monotonic() - paused, 3))

    def _heartbeat_action(self) -> None:
        query = self.config.heartbeat.action_query
        if not query:
            return
        try:
            if self._side_conn is None or self._side_conn.closed or self._side_conn.broken:
                self._side_conn = psycopg.connect(
                    self.config.source.conninfo(application_name="cdc-heartbeat"), autocommit=True, connect_timeout=5
                )
            self._side_conn.execute(query.encode())
        except psycopg.Error as e:
            log.warning("heartbeat_action_failed", error=str(e).strip())

    def _drain(self, stream: ReplicationStream) -> None:
        """Clean stop: deliver what is in flight, confirm it, close."""
        delivery = self.components.delivery
        log.info("stopping", inflight_records=delivery.inflight_records)
        remaining = delivery.drain(self.config.shutdown_timeout_s)
        stream.confirm(delivery.acknowledged())
        stream.close()
        log.info(
            "stopped", confirmed=str(stream.flushed), undelivered=remaining, events=sum(self.stats.events.values())
        )

    def _recover(self, stream: ReplicationStream) -> None:
        """After a lost connection or an aborted Kafka transaction: deliver what was sent, then start afresh."""
        delivery = self.components.delivery
        stream.close()
        while delivery.drain(5.0) and not self._stop:
            self.stats.heartbeat = time.monotonic()
            log.warning("waiting_for_kafka", inflight_records=delivery.inflight_records)
        delivery.reset()
        log.warning("replication_reconnecting", acknowledged=str(delivery.acknowledged()))

    def close(self) -> None:
        if self._side_conn is not None:
            self._side_conn.close()
        self.components.toast.close()
