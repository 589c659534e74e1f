"""The ``outbox`` section of the configuration (embedded by ``cdc.config.Config``).

Two routes feed the same outbox topics:

* ``outbox.tables``: rows INSERTed into these tables become events; UPDATE and DELETE are
  ignored (so an application may insert and delete in one transaction and keep the table
  empty). The table's own change topic is produced only with ``produce_change_topic: true``.
* ``outbox.message_prefix``: transactional ``pg_logical_emit_message(true, prefix, json)``
  messages become events, with no table at all.

Both route to ``outbox.topic`` (a template) keyed by the aggregate id.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cdc.snapshot.config import WATERMARK_PREFIX

# The same characters Kafka allows in a topic name; an aggregate type becomes part of one.
TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]+")
TEMPLATE_FIELDS = frozenset({"aggregate_type", "topic_prefix"})
# Headers every outbox record carries: an extra column placed as a header must not shadow them.
RESERVED_HEADERS = frozenset({"id", "eventType", "aggregateType"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OutboxColumns(_Section):
    """Which column holds what (Debezium's outbox layout by default)."""

    id: str = Field(default="id", description="the event id (uuid or text): header 'id'")
    aggregate_type: str = Field(
        default="aggregatetype", description="the aggregate type: routes the event to its topic"
    )
    aggregate_id: str = Field(default="aggregateid", description="the aggregate id: the record key")
    type: str = Field(default="type", description="the event type: header 'eventType'")
    payload: str = Field(
        default="payload", description="the event itself (jsonb, json or text holding JSON): the record value"
    )

    def required(self) -> dict[str, str]:
        """role -> column name."""
        return {
            "id": self.id,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "type": self.type,
            "payload": self.payload,
        }

    @model_validator(mode="after")
    def _distinct(self) -> OutboxColumns:
        names = list(self.required().values())
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"one column cannot play two roles: {', '.join(dupes)}")
        return self


class OutboxExtra(_Section):
    """A further column of the outbox table, published beside the payload."""

    column: str = Field(description="the column's name")
    placement: Literal["header", "envelope"] = Field(
        description="header: a record header (the value's text); envelope: a field of the value, which then "
        'becomes {"payload": <payload>, <field>: <value>, ...}'
    )
    name: str | None = Field(default=None, description="the header or field name (default: the column name)")

    @property
    def target(self) -> str:
        return self.name or self.column


class OutboxTable(_Section):
    name: str = Field(description="schema-qualified outbox table, e.g. public.outbox")
    columns: OutboxColumns = Field(default_factory=OutboxColumns, description="column names of the five roles")
    extra: list[OutboxExtra] = Field(default_factory=list, description="further columns, as headers or envelope fields")
    produce_change_topic: bool = Field(
        default=False,
        description="also publish the table's own change events on <topic_prefix>.<schema>.<table> "
        "(compacted, keyed by its primary key); never part of a snapshot",
    )

    @field_validator("name")
    @classmethod
    def _qualified(cls, v: str) -> str:
        if "." not in v:
            v = f"public.{v}"
        schema, _, table = v.partition(".")
        if not schema or not table or "." in table:
            raise ValueError(f"expected schema.table, got {v!r}")
        return v

    @model_validator(mode="after")
    def _extras(self) -> OutboxTable:
        roles = set(self.columns.required().values())
        problems = []
        columns = [e.column for e in self.extra]
        for column in sorted({c for c in columns if columns.count(c) > 1}):
            problems.append(f"column {column} is listed twice in extra")
        for extra in self.extra:
            if extra.column in roles:
                problems.append(f"extra column {extra.column} already plays a role in 'columns'")
        headers = [e.target for e in self.extra if e.placement == "header"]
        fields = [e.target for e in self.extra if e.placement == "envelope"]
        for name in sorted(set(headers) & RESERVED_HEADERS):
            problems.append(f"header name {name} is reserved for the event's own headers; set 'name'")
        if "payload" in fields:
            problems.append("envelope field name payload holds the payload itself; set 'name'")
        for group in (headers, fields):
            for name in sorted({n for n in group if group.count(n) > 1}):
                problems.append(f"two extra columns publish as {name}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def schema_name(self) -> str:
        return self.name.partition(".")[0]

    @property
    def table_name(self) -> str:
        return self.name.partition(".")[2]


class OutboxConfig(_Section):
    tables: list[OutboxTable] = Field(
        default_factory=list, description="outbox tables: each INSERT becomes an event; UPDATE and DELETE are ignored"
    )
    message_prefix: str | None = Field(
        default=None,
        description="table-less route: transactional pg_logical_emit_message(true, <prefix>, <json>) messages with "
        "this prefix become events; the JSON object carries aggregate_type, aggregate_id, type, payload "
        "(and optionally id and headers). Unset: off",
    )
    topic: str = Field(
        default="{topic_prefix}.outbox.event.{aggregate_type}",
        description="topic of an event; placeholders {aggregate_type} and {topic_prefix}. The default is "
        "Debezium's outbox event router convention (outbox.event.<type>) under the prefix, so two daemons on one "
        "cluster do not share a topic; set outbox.event.{aggregate_type} for Debezium's exact names",
    )
    aggregate_types: list[str] | None = Field(
        default=None,
        description="the only aggregate types accepted (their topics are created at start-up); another type is a "
        "malformed event. Unset: any type whose topic name is valid; its topic is created on first sight",
    )
    on_error: Literal["fail", "dead_letter"] = Field(
        default="dead_letter",
        description="a malformed event (missing aggregate id, payload not JSON, type not allowed, a "
        "non-transactional message): dead_letter sends it to outbox.dead_letter_topic (counted in "
        "cdc_outbox_dead_letters_total, logged with table, key and reason) and capture goes on; fail stops the "
        "pipeline with an error naming it (and stops again at every restart until the row is dealt with)",
    )
    dead_letter_topic: str | None = Field(
        default=None,
        description="where malformed outbox events go (on_error: dead_letter); placeholder {topic_prefix}. "
        "Unset: limits.dead_letter_topic if set, else <topic_prefix>.outbox.dead_letter",
    )
    partitions: int | None = Field(
        default=None, ge=1, description="partitions of outbox topics (default: kafka.partitions)"
    )
    replication_factor: int | None = Field(default=None, ge=1, description="default: kafka.replication_factor")
    topic_config: dict[str, str] = Field(
        default_factory=dict,
        description="settings of created outbox topics; they are created with cleanup.policy=delete (event "
        "streams: compaction would keep only the last event of each aggregate)",
    )

    @field_validator("tables", mode="before")
    @classmethod
    def _table_shorthand(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"name": t} if isinstance(t, str) else t for t in v]
        return v

    @property
    def enabled(self) -> bool:
        return bool(self.tables) or self.message_prefix is not None

    @field_validator("topic")
    @classmethod
    def _template(cls, v: str) -> str:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as e:
            raise ValueError(f"not a valid template ({e}); use {{aggregate_type}} and {{topic_prefix}}") from None
        unknown = sorted(fields - TEMPLATE_FIELDS)
        if unknown:
            raise ValueError(
                f"unknown placeholder {', '.join('{' + u + '}' for u in unknown)}; "
                "only {aggregate_type} and {topic_prefix} exist"
            )
        if "aggregate_type" not in fields:
            raise ValueError("must contain {aggregate_type}, or every aggregate would share one topic")
        if not TOPIC_CHARS.fullmatch(v.replace("{aggregate_type}", "x").replace("{topic_prefix}", "x")):
            raise ValueError("may hold only letters, digits, '.', '_', '-' and the placeholders")
        return v

    @field_validator("message_prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v:
            raise ValueError("must not be empty (unset it to turn the message route off)")
        if v == WATERMARK_PREFIX:
            raise ValueError(f"{WATERMARK_PREFIX} is the prefix of the snapshot's watermarks; choose another")
        return v

    @field_validator("aggregate_types")
    @classmethod
    def _types(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("an empty list would refuse every event; unset it to accept any type")
        bad = [t for t in v if not TOPIC_CHARS.fullmatch(t)]
        if bad:
            raise ValueError(f"may hold only letters, digits, '.', '_' and '-' (they name topics): {bad}")
        return v

    @model_validator(mode="after")
    def _unique_tables(self) -> OutboxConfig:
        names = [t.name for t in self.tables]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tables: listed more than once: {', '.join(dupes)}")
        return self

    def topic_for(self, aggregate_type: str, topic_prefix: str) -> str:
        return self.topic.format(aggregate_type=aggregate_type, topic_prefix=topic_prefix)
