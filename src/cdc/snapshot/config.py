"""The ``snapshot`` section of the configuration (embedded by ``cdc.config.Config``)."""

from __future__ import annotations

import enum
import re
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

WATERMARK_PREFIX: Final = "cdc.wm"
"""The logical message prefix of watermarks; such messages are the coordinator's, never published.

Here, with the configuration, because ``outbox.message_prefix`` must not take it (``cdc.outbox.config``)."""


class SnapshotMode(enum.StrEnum):
    """When the daemon copies the tables' existing rows (Debezium's ``snapshot.mode`` names)."""

    INITIAL = "initial"  # when the slot is created (and resume an interrupted one); then stream
    INITIAL_ONLY = "initial_only"  # a consistent copy without a slot, then exit; no streaming
    NO_DATA = "no_data"  # never copy rows: stream from the slot's creation on
    WHEN_NEEDED = "when_needed"  # like initial, and again when the slot is missing or was invalidated
    ALWAYS = "always"  # at every start: drop and recreate the slot, copy everything, then stream


class SnapshotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["initial", "initial_only", "no_data", "when_needed", "always"] = Field(
        default="initial",
        description="when to copy the existing rows: initial (when the slot is created; an interrupted copy "
        "resumes), initial_only (copy, then exit), no_data (never), when_needed (also when the slot is missing "
        "or invalidated), always (at every start)",
    )
    on_slot_missing: Literal["fail", "snapshot"] = Field(
        default="fail",
        description="the slot is gone although it existed (the progress topic remembers it: a failover without "
        "a synchronized failover slot, or a dropped slot), in modes initial and no_data: fail stops, naming what "
        "may be missing and the fix; snapshot copies every table again (truncate markers first)",
    )
    workers: int = Field(default=2, ge=1, le=64, description="processes reading the initial snapshot in parallel")
    chunk_rows: int = Field(default=50_000, ge=100, description="rows per chunk of the initial snapshot (about)")
    incremental_chunk_rows: int = Field(
        default=4096, ge=1, description="rows per watermark window of a snapshot taken while streaming"
    )
    server_json: bool | None = Field(
        default=None,
        description="initial snapshot in the JSON format: let PostgreSQL build each row's key and 'after' JSON in "
        "the COPY (same records) for tables whose column types allow it. Unset: only when the compiled row codec "
        "is not built; otherwise the codec writes the rows from the COPY text (decoder.render_rows), which costs "
        "less CPU in all than the server's JSON. true: the server wherever it can (its CPU instead of the "
        "snapshot workers'), false: never",
    )
    progress_topic: str | None = Field(
        default=None, description="compacted topic of snapshot progress; default <topic_prefix>.__cdc_snapshot"
    )
    signal_table: str = Field(
        default="public.cdc_signal",
        description="table whose rows request snapshots while streaming (Debezium's signal table layout)",
    )
    signal_poll_s: float = Field(default=2.0, gt=0, description="how often the signal table is read")
    progress_log_s: float = Field(default=10.0, gt=0, description="how often progress is logged")
    progress_bar: bool = Field(default=True, description="draw a progress bar when stderr is a terminal")
    import_timeout_s: float = Field(default=120.0, gt=0, description="how long workers may take to start")

    @field_validator("signal_table")
    @classmethod
    def _qualified(cls, v: str) -> str:
        if "." not in v:
            v = f"public.{v}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*", v):
            raise ValueError(f"expected schema.table of plain identifiers, got {v!r}")
        return v

    @property
    def snapshot_mode(self) -> SnapshotMode:
        return SnapshotMode(self.mode)

    def progress_topic_for(self, topic_prefix: str) -> str:
        return self.progress_topic or f"{topic_prefix}.__cdc_snapshot"
