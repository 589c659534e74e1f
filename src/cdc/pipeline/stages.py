"""The layers between the decoder and the serializer, and the chain that runs them.

Every stage has one seam, ``process(event) -> event | None``: it passes the event
on (itself or a changed copy) or consumes it (None), and may deliver records of its
own on the way (an outbox event, a transaction's BEGIN record, the rows of a snapshot
chunk). The chain runs the stages in a fixed order for every event of a transaction
that delivery does not skip; what comes out of the last one is serialized and
delivered by ``Deliver``.

Each stage declares two things per table, from which the chain derives the rest:

- ``sees_rows(table)``: whether the table's row changes pass through it at all. The
  chain builds, once per table, the tuple of ``process`` methods a row of that table
  meets, so a stage that has nothing to do with a table costs its rows nothing.
- ``typed_rows(table)``: whether it reads the table's rows column by column. The
  decoder may write a table's rows straight in the sink format (a rendered row,
  carrying only its key's typed values) only when no stage of the chain needs typed
  rows of it; ``Chain.typed_rows`` is that condition, and nothing else keeps it.

Stages hold their own state; the chain holds none but its per-table cache, which
``invalidate`` clears when the captured tables or their policies change.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final

from cdc.columns import ColumnPolicy
from cdc.event import ChangeEvent, Event, MessageEvent, Op, TruncateEvent, TxBegin, TxCommit
from cdc.observe import Stats
from cdc.sink.delivery import Delivery
from cdc.sink.metadata import TransactionMetadata
from cdc.sink.records import EventSerializer
from cdc.snapshot.incremental import is_watermark
from cdc.snapshot.service import Snapshots

Process = Callable[[Any], Any]


class Stage(abc.ABC):
    """One layer of the chain. Subclasses override ``process`` and what they declare."""

    def sees_rows(self, table: str) -> bool:
        """Whether row changes of ``table`` pass through ``process`` (other events always do)."""
        return True

    def typed_rows(self, table: str) -> bool:
        """Whether ``process`` reads rows of ``table`` column by column (then they must not be rendered)."""
        return False

    def row_step(self, table: str) -> Process:
        """What a row change of ``table`` meets in this stage (when ``sees_rows``): ``process``, or a stage's
        cheaper equivalent for rows alone (the chain calls it once per row)."""
        return self.process

    @abc.abstractmethod
    def process(self, event: Event) -> Event | None:
        """The event to pass on, or None when this stage consumed it."""


def describe(event: ChangeEvent | TruncateEvent | MessageEvent) -> str:
    """What an event is about, for metrics and delivery errors: its table(s), or its message prefix."""
    if isinstance(event, ChangeEvent):
        return event.table.qualified
    if isinstance(event, TruncateEvent):
        return ",".join(t.qualified for t in event.tables)
    return f"message {event.prefix}"


_UPDATE: Final = Op.UPDATE


def count(counts: Any, table: str, op: Op, records: int) -> None:
    """One row change in ``cdc_events_total``: an update that changed the key is what its records are, a
    delete and a create (three records: the delete, its tombstone, the create)."""
    if op is _UPDATE and records == 3:
        counts[(table, Op.DELETE)] += 1
        counts[(table, Op.CREATE)] += 1
    else:
        counts[(table, op)] += 1


class Deliver:
    """The end of the chain: the serializer's records of an event, sent in order, and counted."""

    def __init__(self, serializer: EventSerializer[Any], delivery: Delivery, stats: Stats) -> None:
        self.records: Final = serializer.records
        self.send: Final = delivery.send
        self.counts: Final = stats.events

    def row(self, event: ChangeEvent, table: str) -> None:
        """One row change, serialized, sent and counted (``Chain.row`` does the same inline)."""
        send = self.send
        records = self.records(event)
        for record in records:
            send(record, table)
        count(self.counts, table, event.op, len(records))

    def other(self, event: TruncateEvent | MessageEvent) -> None:
        what = describe(event)
        for record in self.records(event):
            self.send(record, what)
        self.counts[(what, "t" if isinstance(event, TruncateEvent) else "m")] += 1


class Chain:
    """The stages in order; per table, the ``process`` methods its rows meet."""

    def __init__(self, stages: Sequence[Stage], deliver: Deliver) -> None:
        self.stages: Final = tuple(stages)
        self.deliver: Final = deliver
        # Deliver.row's work, bound once and done in ``row`` itself: a frame less per row.
        self._records = deliver.records
        self._send = deliver.send
        self._counts = deliver.counts
        self._rows: dict[str, tuple[Process, ...]] = {}

    def typed_rows(self, table: str) -> bool:
        return any(stage.typed_rows(table) for stage in self.stages)

    def invalidate(self) -> None:
        """The captured tables or their policies changed: the per-table chains are built again."""
        self._rows.clear()

    def rows_of(self, table: str) -> tuple[Process, ...]:
        found = self._rows.get(table)
        if found is None:
            found = self._rows[table] = tuple(s.row_step(table) for s in self.stages if s.sees_rows(table))
        return found

    def row(self, event: ChangeEvent) -> None:
        """A row change: through its table's stages, then delivered unless a stage consumed it."""
        table = event.table.qualified
        steps = self._rows.get(table)
        if steps is None:
            steps = self.rows_of(table)
        if steps:
            current: Any = event
            for process in steps:
                current = process(current)
                if current is None:
                    return
            event = current
        send = self._send
        records = self._records(event)
        for record in records:
            send(record, table)
        op = event.op
        if op is _UPDATE and len(records) == 3:  # a key change: Debezium's delete, tombstone and create
            count(self._counts, table, op, 3)
        else:
            # Op is a StrEnum: the member is the same key as its code ("c"), without Enum.value's descriptor call
            self._counts[(table, op)] += 1

    def other(self, event: Event) -> None:
        """Begin, commit, truncate or message: through every stage; a truncate or message that is left
        over is delivered."""
        current: Event | None = event
        for stage in self.stages:
            current = stage.process(current)  # type: ignore[arg-type]  # None ends the loop below
            if current is None:
                return
        if isinstance(current, TruncateEvent | MessageEvent):
            self.deliver.other(current)


class SnapshotStage(Stage):
    """DBLog incremental snapshots: every event goes to the coordinator in commit order; a high watermark
    releases its chunk's rows, which are delivered right there, inside the watermark's transaction.
    Watermark messages themselves are consumed, never published."""

    def __init__(
        self, snapshots: Snapshots, send_rows: Callable[[list[ChangeEvent]], None], delivery: Delivery
    ) -> None:
        self._on_event = snapshots.on_event
        # A row change's part of on_event without its dispatch and the reader check (both run at every
        # other event): the chain calls it per row, as this stage's row step.
        self._on_row = snapshots.coordinator.on_row
        self._send_rows = send_rows
        self._released_progress = snapshots.released_progress
        self._delivery = delivery

    def row_step(self, table: str) -> Process:
        return self._on_row

    def process(self, event: Event) -> Event | None:
        if type(event) is ChangeEvent:
            return self._on_row(event)
        if not is_watermark(event):
            rows = self._on_event(event)
            if rows:
                self._send_rows(rows)
            return event
        # A high watermark: the chunk's rows, inside its transaction, then (exactly once) the chunk's
        # progress, in the same Kafka transaction as its rows.
        delivery = self._delivery
        delivery.keep_together(True)
        try:
            rows = self._on_event(event)
            if rows:
                self._send_rows(rows)
            progress = self._released_progress()
            if progress is not None:
                delivery.send(progress, "snapshot progress")
        finally:
            delivery.keep_together(False)
        return None


_EMIT_PREFIX = re.compile(r"pg_logical_emit_message\s*\(\s*(?:true|false)\s*,\s*'((?:[^']|'')*)'", re.IGNORECASE)


def emitted_prefix(query: str | None) -> str | None:
    """The prefix a heartbeat action query emits its messages with, when it calls pg_logical_emit_message
    with a literal prefix."""
    found = _EMIT_PREFIX.search(query or "")
    return found.group(1).replace("''", "'") if found else None


class MessageFilter(Stage):
    """Logical messages published only for the prefixes the configuration includes (``messages.include`` /
    ``exclude``, Debezium's message.prefix lists); the daemon's own heartbeat prefix never. Left-out
    messages are counted per prefix. Watermarks never reach it (the snapshot stage consumes them), nor
    transactional messages of this daemon's outbox prefix (the outbox stage routes them); a
    non-transactional one of that prefix passes on, to be refused by the outbox route."""

    def __init__(
        self,
        include: Sequence[str] | None,
        exclude: Sequence[str],
        own: Sequence[str],
        outbox: str | None,
        stats: Stats,
    ) -> None:
        self._include = [re.compile(p) for p in include] if include is not None else None
        self._exclude = [re.compile(p) for p in exclude]
        self._own = frozenset(own)
        self._outbox = outbox
        self._left_out = stats.messages_left_out
        self._decided: dict[str, bool] = {}

    def sees_rows(self, table: str) -> bool:
        return False

    def published(self, prefix: str) -> bool:
        decided = self._decided.get(prefix)
        if decided is None:
            if prefix == self._outbox:
                decided = True
            elif prefix in self._own:
                decided = False
            elif self._include is not None:
                decided = any(p.fullmatch(prefix) for p in self._include)
            else:
                decided = not any(p.fullmatch(prefix) for p in self._exclude)
            if len(self._decided) < 10_000:
                self._decided[prefix] = decided
        return decided

    def process(self, event: Event) -> Event | None:
        if type(event) is MessageEvent:
            prefix = event.prefix
            if not self.published(prefix):
                self._left_out[prefix] += 1
                return None
        return event


class ColumnPolicyStage(Stage):
    """include_columns / exclude_columns / mask: applied to every row change of a table that has them.

    ``policies`` is the pipeline's own dict, changed in place at a reload (then ``Chain.invalidate``)."""

    def __init__(self, policies: dict[str, ColumnPolicy]) -> None:
        self._policies = policies

    def sees_rows(self, table: str) -> bool:
        return table in self._policies

    def typed_rows(self, table: str) -> bool:
        return table in self._policies

    def process(self, event: Event) -> Event | None:
        if type(event) is ChangeEvent:
            policy = self._policies.get(event.table.qualified)
            if policy is not None:
                return policy.apply(event)
        return event


class TransactionMetadataStage(Stage):
    """``transaction_metadata: true``: a BEGIN record at each transaction's start, its rows counted per
    table, an END record with the counts at its commit."""

    def __init__(self, metadata: TransactionMetadata, delivery: Delivery) -> None:
        self._metadata = metadata
        self._count = metadata.count
        self._send = delivery.send

    def process(self, event: Event) -> Event | None:
        kind = type(event)
        if isinstance(event, ChangeEvent):
            # Debezium's transaction block in the event itself: consumers regroup transactions with it.
            return replace(event, transaction=self._count(event.table.qualified))
        elif kind is TxBegin:
            self._send(self._metadata.begin(event), "transaction metadata")  # type: ignore[arg-type]
        elif kind is TxCommit:
            self._send(self._metadata.end(event), "transaction metadata")  # type: ignore[arg-type]
        return event
