"""Stages that route events elsewhere than their table's topic: the outbox, and messages outside transactions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from cdc.config import Config
from cdc.event import ChangeEvent, Event, MessageEvent, TxBegin, TxCommit
from cdc.observe import Stats
from cdc.outbox.route import Malformed, OutboxError, OutboxEvent, OutboxRouter
from cdc.pipeline.stages import Deliver, Stage
from cdc.sink.delivery import Delivery

log = structlog.get_logger("cdc.pipeline")


def _clip(content: Any, limit: int = 500) -> str:
    text = repr(dict(content))
    return text if len(text) <= limit else text[:limit] + "..."


class OutboxStage(Stage):
    """Rows inserted into an outbox table, and transactional messages with the outbox prefix, become
    outbox events, produced in the current source transaction like any change event. A malformed one
    goes to the dead-letter topic or stops the pipeline (``outbox.on_error``), never nowhere.

    An outbox table's row changes reach its own change topic only with ``produce_change_topic``;
    otherwise this stage consumes them. Non-transactional outbox messages are ``StandaloneMessages``'."""

    def __init__(
        self,
        router: OutboxRouter,
        delivery: Delivery,
        config: Config,
        stats: Stats,
        topic_exists: Callable[[str], bool],
        create_topic: Callable[[str], None],
    ) -> None:
        self.router = router
        self._tables = router.tables
        self._prefix = router.message_prefix
        self._delivery = delivery
        self._config = config
        self._stats = stats
        self._topic_exists = topic_exists
        self._create_topic = create_topic

    def sees_rows(self, table: str) -> bool:
        return table in self._tables

    def typed_rows(self, table: str) -> bool:
        return table in self._tables

    def process(self, event: Event) -> Event | None:
        kind = type(event)
        if kind is ChangeEvent:
            assert isinstance(event, ChangeEvent)
            box = self._tables.get(event.table.qualified)
            if box is None:
                return event
            self.route(self.router.from_row(box, event))
            return event if box.produce_change_topic else None
        if kind is MessageEvent:
            assert isinstance(event, MessageEvent)
            if event.prefix == self._prefix and event.transactional:
                self.route(self.router.from_message(event))
                return None
        return event

    def route(self, found: OutboxEvent | Malformed | None) -> None:
        if found is None:  # UPDATE or DELETE on an outbox table: ignored by design
            return
        if isinstance(found, OutboxEvent):
            record = self.router.record(found)
            if not self._topic_exists(record.topic):
                self._create_topic(record.topic)
            self._delivery.send(record, f"outbox {found.source}")
            self._stats.outbox_events[(found.aggregate_type, found.route)] += 1
            return
        dead_letter_topic = self._config.outbox_dead_letter_topic
        if self._config.outbox.on_error == "fail":
            raise OutboxError(
                f"{found.describe()} ({found.reason}); content {_clip(found.content)}. Nothing from this "
                "transaction on is confirmed, so a restart meets it again. Fix: set outbox.on_error: dead_letter "
                "(the default) to set such events aside and go on"
                + (
                    "; or allow the type in outbox.aggregate_types"
                    if found.reason == "aggregate_type_not_allowed"
                    else ""
                )
            )
        self._delivery.send(self.router.dead_letter(found, dead_letter_topic), f"outbox {found.source}")
        self._stats.outbox_dead_letters[found.reason] += 1
        log.error(
            "outbox_dead_lettered",
            source=found.source,
            key=found.key.decode("utf-8", "replace"),
            reason=found.reason,
            detail=found.detail,
            lsn=str(found.lsn),
            txid=found.xid,
            dead_letter_topic=dead_letter_topic,
        )


class StandaloneMessages(Stage):
    """A non-transactional message arrives between transactions at its own LSN: it is delivered as a
    transaction of one, so the confirmed LSN never passes it undelivered and exactly-once skips it when
    it was already committed. One with the outbox prefix is routed (and refused: not transactional)."""

    def __init__(self, delivery: Delivery, deliver: Deliver, stats: Stats, outbox: OutboxStage | None) -> None:
        self._delivery = delivery
        self._deliver = deliver
        self._stats = stats
        self._outbox = outbox

    def sees_rows(self, table: str) -> bool:
        return False

    def process(self, event: Event) -> Event | None:
        if type(event) is not MessageEvent:
            return event
        assert isinstance(event, MessageEvent)
        if event.transactional:
            return event
        delivery = self._delivery
        ts = event.commit_ts_us if event.commit_ts_us is not None else time.time_ns() // 1000
        if delivery.begin(TxBegin(0, event.lsn, ts)):
            outbox = self._outbox
            if outbox is not None and event.prefix == outbox.router.message_prefix:
                outbox.route(outbox.router.from_message(event))
            else:
                self._deliver.other(event)
        delivery.commit(TxCommit(0, event.lsn, event.lsn, ts, 1))
        return None
