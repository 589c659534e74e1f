"""Where snapshot events go: the pipeline's serializer and delivery, built afresh in each worker process.

Snapshot workers are processes (the per-row work is Python: conversion,
serialization, produce), so each builds its own serializer and producers from a
picklable ``OutputFactory``. They are the same classes, with the same settings,
as the pipeline's: the records are byte for byte what the stream would produce
for the same values.

At least once (idempotent producer, ``acks=all``), a chunk counts as copied
only once Kafka acknowledged all of it, and a chunk copied twice after a crash
only repeats upserts of the same rows. Exactly once (``delivery.mode:
exactly_once``), each chunk is one Kafka transaction holding its rows and the
record that says it is copied (``ChunkTransactions``, ``Output.chunk_record``),
so a read_committed consumer sees each row of the snapshot once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from cdc.columns import ColumnPolicy, policies
from cdc.config import Config, TableConfig
from cdc.event import ChangeEvent, MessageEvent, TruncateEvent, TxBegin, TxCommit
from cdc.sink.bulk import BulkProducer
from cdc.sink.chunks import ChunkTransactions, fence_transactions
from cdc.sink.delivery import AtLeastOnce, DeadLetters
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.kafka import producer_config
from cdc.sink.record import Record
from cdc.snapshot.state import chunk_record

__all__ = [
    "COORDINATOR",
    "ConfiguredOutput",
    "JsonKafkaOutput",
    "Output",
    "OutputFactory",
    "RecordDelivery",
    "Serializer",
]


class Serializer(Protocol):
    def records(self, event: ChangeEvent | TruncateEvent | MessageEvent) -> list[Record]: ...


class RecordDelivery(Protocol):
    """The part of ``cdc.sink.delivery.Delivery`` a snapshot uses."""

    def begin(self, tx: TxBegin) -> bool: ...
    def send(self, record: Record, describe: str) -> None: ...
    def commit(self, tx: TxCommit) -> None: ...
    def tick(self) -> None: ...
    def drain(self, timeout: float) -> int: ...


Transform = Callable[[ChangeEvent], ChangeEvent]


@dataclass(frozen=True, slots=True)
class Output:
    serializer: Serializer
    delivery: RecordDelivery
    transform: Transform | None = None  # what the pipeline applies between decoder and serializer (column policies)
    policy_tables: frozenset[str] = frozenset()  # the tables ``transform`` changes
    # the producer for rows written without a per-record callback (a chunk counts only once it is drained):
    # rows whose JSON the server builds (cdc.snapshot.sqljson) or the row codec wrote; and the size above
    # which such a row goes through ``delivery`` instead (its size limit, dead letters)
    bulk: BulkProducer | ChunkTransactions | None = None
    max_record_bytes: int = 0
    # exactly once: the record that says a chunk is copied (table, chunk index, rows), produced last in the
    # chunk's own Kafka transaction; None: the coordinator records it once Kafka acknowledged the rows
    chunk_record: Callable[[str, int, int], Record] | None = None
    # write rows straight from the COPY text into the records' bytes with the row codec where the serializer
    # offers a RowRendering (``decoder.render_rows``, as the stream does); False: every row through typed values
    render_rows: bool = True


COORDINATOR = -1  # the worker number of the coordinator's own output (its truncate markers)


class OutputFactory(Protocol):
    """Picklable; called once in each worker process, with the worker's number."""

    @property
    def transactional(self) -> bool: ...  # chunks are Kafka transactions (exactly once)

    def __call__(self, worker: int = 0) -> Output: ...

    def fence(self, worker: int) -> None: ...  # transactional: end what that worker's producer left open


@dataclass(frozen=True)
class JsonKafkaOutput:
    """The pipeline's JSON serializer, its column policies, and an at-least-once producer with its settings."""

    settings: JsonSettings
    partitions: Mapping[str, int]  # topic -> partition count, as ensure_topics returned it
    producer: Mapping[str, Any]  # cdc.sink.kafka.producer_config(...)
    max_record_bytes: int
    dead_letter_topic: str | None = None
    tables: Sequence[TableConfig] = ()  # for the column policies (include, exclude, mask)
    mask_fixed_value: str = "****"
    mask_salt: str | None = field(default=None, repr=False)
    render_rows: bool = True  # decoder.render_rows
    position_headers: bool = True  # kafka.position_headers (on, as for a serializer made directly)
    _partitions: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_partitions", dict(self.partitions))
        object.__setattr__(self, "tables", tuple(self.tables))

    @property
    def transactional(self) -> bool:
        return False

    def fence(self, worker: int) -> None:
        return None

    def __call__(self, worker: int = 0) -> Output:
        serializer = JsonSerializer(self.settings, self._partitions.__getitem__)
        serializer.position_headers = self.position_headers
        dead = DeadLetters(self.dead_letter_topic) if self.dead_letter_topic else None
        delivery = AtLeastOnce(dict(self.producer), max_record_bytes=self.max_record_bytes, dead_letters=dead)
        by_table = policies(self.tables, self.mask_fixed_value, self.mask_salt)
        return Output(
            serializer,
            delivery,
            _transform(by_table),
            frozenset(by_table),
            BulkProducer(self.producer),
            self.max_record_bytes,
            render_rows=self.render_rows,
        )


@dataclass(frozen=True)
class ConfiguredOutput:
    """What the pipeline builds from its configuration, built again in each worker: the serializer of
    ``config.format`` (by the pipeline's own ``make_serializer``, a module-level function so that it
    pickles), the column policies, and an at-least-once producer with the pipeline's settings."""

    config: Config
    partitions: Mapping[str, int]  # topic -> partition count, as ensure_topics returned it
    make_serializer: Callable[[Config, Callable[[str], int]], Serializer]
    progress_topic: str | None = None  # set with delivery.mode exactly_once: where chunk records go

    @property
    def transactional(self) -> bool:
        return self.progress_topic is not None and self.config.delivery.mode == "exactly_once"

    def _transactional_id(self, worker: int) -> str:
        if worker == COORDINATOR:
            return f"cdc-{self.config.source.slot}-snapshot-coordinator"
        return f"cdc-{self.config.source.slot}-snapshot-{worker}"

    def _producer(self) -> dict[str, Any]:
        cfg = self.config
        return producer_config(cfg.kafka.bootstrap_servers, cfg.kafka.producer, cfg.limits.max_record_bytes)

    def fence(self, worker: int) -> None:
        if self.transactional:
            fence_transactions(self._producer(), self._transactional_id(worker))

    def __call__(self, worker: int = 0) -> Output:
        cfg = self.config
        partitions = dict(self.partitions)
        serializer = self.make_serializer(cfg, partitions.__getitem__)
        producer = self._producer()
        dead = DeadLetters(cfg.limits.dead_letter_topic) if cfg.limits.dead_letter_topic else None
        salt = cfg.masking.salt.get_secret_value() if cfg.masking.salt is not None else None
        by_table = policies(cfg.tables, cfg.masking.fixed_value, salt)
        if self.transactional:
            assert self.progress_topic is not None
            chunks = ChunkTransactions(
                producer,
                transactional_id=self._transactional_id(worker),
                max_record_bytes=cfg.limits.max_record_bytes,
                dead_letters=dead,
            )
            return Output(
                serializer,
                chunks,
                _transform(by_table),
                frozenset(by_table),
                chunks,
                cfg.limits.max_record_bytes,
                partial(chunk_record, self.progress_topic, cfg.source.slot),
                cfg.decoder.render_rows,
            )
        delivery = AtLeastOnce(producer, max_record_bytes=cfg.limits.max_record_bytes, dead_letters=dead)
        return Output(
            serializer,
            delivery,
            _transform(by_table),
            frozenset(by_table),
            BulkProducer(producer),
            cfg.limits.max_record_bytes,
            render_rows=cfg.decoder.render_rows,
        )


def _transform(by_table: Mapping[str, ColumnPolicy]) -> Transform | None:
    if not by_table:
        return None

    def transform(event: ChangeEvent) -> ChangeEvent:
        policy = by_table.get(event.table.qualified)
        return policy.apply(event) if policy is not None else event

    return transform
