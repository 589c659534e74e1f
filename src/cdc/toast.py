"""The ``toast`` section of the configuration (``cdc.pipeline.toast`` fills the values)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ToastConfig(BaseModel):
    """Unchanged TOASTed values: a large value that an UPDATE left alone, which pgoutput does not send
    unless the table has REPLICA IDENTITY FULL (docs/operations.md, "Unchanged TOASTed values")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["fill", "placeholder"] = Field(
        default="fill",
        description="fill: each such value is read again from the table by key before the transaction's records "
        "are produced (the value read may be newer than the event; the last record of each key is exact), so "
        "no placeholder reaches a compacted topic; placeholder: the value becomes toast.placeholder, as "
        "Debezium writes it. REPLICA IDENTITY FULL tables take the value from the old row either way",
    )
    placeholder: str = Field(
        default="__debezium_unavailable_value",
        min_length=1,
        description="what an unfilled value becomes (Debezium's unavailable.value.placeholder): text and json "
        "fields get it, bytea its UTF-8 bytes. Also written in fill mode for a row deleted before it was read",
    )
    fill_batch: int = Field(
        default=1000, ge=1, le=10_000, description="fill: most events held before their values are read (one query)"
    )
