"""Snapshots: the initial copy under the slot's exported snapshot, and DBLog while streaming.

What an operator sees (``snapshot:`` section, ``cdc.snapshot.config``):

- ``mode``: ``initial`` (default: copy when the slot is created, resume an interrupted copy),
  ``initial_only``, ``no_data``, ``when_needed`` (also after an invalidated slot), ``always``;
  the table in ``cdc.snapshot.modes`` says what each does at start-up.
- The initial copy runs in ``workers`` processes, chunks of about ``chunk_rows`` rows cut by
  the primary key (heap pages for tables without a usable key), each chunk recorded in the
  progress topic (``<topic_prefix>.__cdc_snapshot``) once Kafka acknowledged it. Interrupted,
  it resumes: the next start streams from the slot's consistent point at once and reads the
  chunks not recorded while streaming, with DBLog watermarks over the same key ranges.
- While streaming: a table added to ``tables`` (at start, or on SIGHUP), a row in the signal
  table, or ``cdc snapshot --config FILE TABLE...`` starts a DBLog snapshot of it;
  streaming never pauses. Tables need a primary key (or a unique index over NOT NULL
  columns) for that.
- Progress: ``snapshot_progress`` / ``snapshot_table_progress`` log events (rows done,
  pg_class estimate, rows/s, ETA), ``SnapshotProgress`` values for the metrics endpoint,
  a progress bar on a terminal.

The pieces, each usable alone:

- ``service.Snapshots``: what the pipeline talks to (its wiring is described there).
- ``initial.InitialSnapshot``: parallel, chunked, resumable copy at the slot's consistent point.
- ``incremental.IncrementalCoordinator``: the pure watermark logic fed by the stream.
- ``reader.IncrementalReader``: runs DBLog chunks and watermarks on its own connection.
- ``copytext``: COPY text lines to the stream's typed rows.
- ``plan``, ``state``, ``modes``, ``progress``, ``output``, ``signals``.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc.snapshot.config import SnapshotConfig, SnapshotMode
    from cdc.snapshot.errors import SnapshotError, SnapshotImportError, SnapshotInterrupted, SnapshotRefused
    from cdc.snapshot.incremental import WATERMARK_PREFIX, IncrementalCoordinator, is_watermark
    from cdc.snapshot.initial import InitialResult, InitialSnapshot
    from cdc.snapshot.modes import SlotState, StartupPlan, decide, inspect_slot
    from cdc.snapshot.output import JsonKafkaOutput, Output, OutputFactory
    from cdc.snapshot.progress import ProgressTracker, SnapshotProgress, TableProgress
    from cdc.snapshot.service import Snapshots
    from cdc.snapshot.state import KafkaStore, MemoryStore, ProgressStore, SnapshotState, topics_holding_records

__all__ = [
    "WATERMARK_PREFIX",
    "IncrementalCoordinator",
    "InitialResult",
    "InitialSnapshot",
    "JsonKafkaOutput",
    "KafkaStore",
    "MemoryStore",
    "Output",
    "OutputFactory",
    "ProgressStore",
    "ProgressTracker",
    "SlotState",
    "SnapshotConfig",
    "SnapshotError",
    "SnapshotImportError",
    "SnapshotInterrupted",
    "SnapshotMode",
    "SnapshotProgress",
    "SnapshotRefused",
    "SnapshotState",
    "Snapshots",
    "StartupPlan",
    "TableProgress",
    "decide",
    "inspect_slot",
    "is_watermark",
    "topics_holding_records",
]

_WHERE = {
    "SnapshotConfig": "config", "SnapshotMode": "config",
    "SnapshotError": "errors", "SnapshotImportError": "errors", "SnapshotInterrupted": "errors", "SnapshotRefused": "errors",
    "WATERMARK_PREFIX": "incremental", "IncrementalCoordinator": "incremental", "is_watermark": "incremental",
    "InitialResult": "initial", "InitialSnapshot": "initial",
    "SlotState": "modes", "StartupPlan": "modes", "decide": "modes", "inspect_slot": "modes",
    "JsonKafkaOutput": "output", "Output": "output", "OutputFactory": "output",
    "ProgressTracker": "progress", "SnapshotProgress": "progress", "TableProgress": "progress",
    "Snapshots": "service",
    "KafkaStore": "state", "MemoryStore": "state", "ProgressStore": "state", "SnapshotState": "state",
    "topics_holding_records": "state",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    # Lazy: cdc.config imports cdc.snapshot.config, and an eager package would import the catalog,
    # which imports cdc.config back.
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'cdc.snapshot' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cdc.snapshot.{module}"), name)
