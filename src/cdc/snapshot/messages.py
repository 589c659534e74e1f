"""What the snapshot's coordinator and its worker processes send each other: a chunk to copy, and what a
worker reports back (through multiprocessing queues, so plain picklable values)."""

from __future__ import annotations

from dataclasses import dataclass

from cdc.snapshot.plan import Chunk, SnapshotTable

__all__ = ["ChunkDone", "ChunkSkipped", "ChunkTask", "Failed", "Ready", "Report", "Rows"]


@dataclass(frozen=True, slots=True)
class ChunkTask:
    table: SnapshotTable
    chunk: Chunk
    ordinal_base: int  # ordinals of this chunk's events are ordinal_base + 1, + 2, ...


# --- what a worker reports ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    worker: int
    error: str | None  # None: the snapshot is imported


@dataclass(frozen=True, slots=True)
class Rows:
    worker: int
    table: str
    rows: int


@dataclass(frozen=True, slots=True)
class ChunkDone:
    worker: int
    table: str
    index: int
    rows: int
    server_json: bool = False  # read with server-built JSON
    rendered: bool = False  # read through the row codec (rows it declined took the typed path)


@dataclass(frozen=True, slots=True)
class ChunkSkipped:
    worker: int
    table: str
    index: int
    reason: str  # dropped, rewritten
    message: str


@dataclass(frozen=True, slots=True)
class Failed:
    worker: int
    table: str | None
    index: int | None
    message: str


Report = Ready | Rows | ChunkDone | ChunkSkipped | Failed
