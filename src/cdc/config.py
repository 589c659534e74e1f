"""The one configuration tree: a YAML file validated by pydantic, overridden by environment variables.

Environment variables use the prefix ``CDC_`` and ``__`` between levels, through
the same model: ``CDC_KAFKA__BOOTSTRAP_SERVERS=broker:9092``,
``CDC_SOURCE__PASSWORD=...``. Unknown keys are errors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final, Literal

import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from cdc.declared import SparkSection
from cdc.outbox.config import OutboxConfig
from cdc.sink.settings import AvroFormat, JsonFormat, RegistrySettings
from cdc.snapshot.config import SnapshotConfig
from cdc.toast import ToastConfig

_IDENT = re.compile(r"^[a-z_][a-z0-9_$]*$")


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# TCP settings of every connection to the source unless the DSN sets them (libpq ignores them on a Unix
# socket). Keepalives keep an idle connection, such as the instance lock's, open through NAT gateways
# and firewalls that drop idle flows after a few minutes, and notice a dead peer in about a minute
# instead of about two hours; tcp_user_timeout does the same for a connection with unacknowledged
# data (a status update sent into a network partition), instead of about 15 minutes of retransmissions.
TCP_DEFAULTS: Final[dict[str, str]] = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}


class SourceConfig(_Section):
    dsn: str = Field(
        description="libpq connection string or URI, without the password; TCP keepalives (30 s idle, 10 s "
        "interval, 3 probes) and tcp_user_timeout=60000 are added unless it sets them"
    )
    password: SecretStr | None = Field(
        default=None, description="Postgres password; prefer CDC_SOURCE__PASSWORD or password_file"
    )
    password_file: Path | None = Field(default=None, description="file whose first line is the password")
    slot: str = Field(description="logical replication slot name (created if missing)")
    publication: str = Field(description="publication name (created if missing, for exactly the captured tables)")
    slot_failover: bool | None = Field(
        default=None,
        description="make the slot a failover slot (PostgreSQL 17+: standbys with sync_replication_slots keep "
        "it through a promotion; docs/operations.md, 'Beside a primary with standbys'). Unset: on where the "
        "server supports it and is a primary; true on PostgreSQL 15/16 is refused at start-up",
    )
    failover_check_s: float = Field(
        default=30.0,
        gt=0,
        description="with several hosts in the DSN: how often the daemon reads whether each standby holds a "
        "synchronized, persistent copy of the slot (log failover_readiness on a change; metric "
        "cdc_slot_failover_ready)",
    )

    @field_validator("slot", "publication")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not _IDENT.match(v) or len(v) > 63:
            raise ValueError(f"must be a lower-case identifier of at most 63 characters (letters, digits, _): {v!r}")
        return v

    @field_validator("dsn")
    @classmethod
    def _parse_dsn(cls, v: str) -> str:
        try:
            params = conninfo_to_dict(v)
        except psycopg.ProgrammingError as e:
            raise ValueError(f"not a valid libpq connection string: {e}") from None
        if "password" in params:
            raise ValueError("holds a password; remove it and set CDC_SOURCE__PASSWORD or source.password_file instead")
        return v

    def conninfo(self, **overrides: Any) -> str:
        """The connection string with the password filled in from the environment or the file, and the
        TCP_DEFAULTS the DSN does not set."""
        params: dict[str, Any] = {**TCP_DEFAULTS, **conninfo_to_dict(self.dsn)}
        secret = self.resolved_password()
        if secret is not None:
            params["password"] = secret
        params.update(overrides)
        return make_conninfo(**params)

    def resolved_password(self) -> str | None:
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_file is not None:
            try:
                return self.password_file.read_text().splitlines()[0]
            except (OSError, IndexError) as e:
                raise ConfigError(
                    f"source.password_file: cannot read a password from {self.password_file}: {e}"
                ) from None
        return None

    @property
    def database(self) -> str:
        params = conninfo_to_dict(self.dsn)
        return str(params.get("dbname") or params.get("user") or "postgres")


def check_glob(pattern: str) -> str:
    """A ``pattern`` entry's glob with its schema made explicit (``order_*`` -> ``public.order_*``).

    ValueError says what is wrong. ``cdc.selection`` matches the glob against the catalog.
    """
    if "." not in pattern:
        pattern = f"public.{pattern}"
    schema, _, table = pattern.partition(".")
    if not schema or not table or "." in table:
        raise ValueError(f"expected a glob of the form schema.table (one dot), got {pattern!r}")
    for part in (schema, table):
        if part.count("[") != part.count("]"):
            raise ValueError(f"unbalanced [ ] in the glob {pattern!r}")
    return pattern


class TableConfig(_Section):
    """One entry of ``tables``: a table by ``name``, or every table a ``pattern`` (glob) or ``regex`` selects.

    Pattern entries are expanded against the database catalog at start-up, on SIGHUP and at each
    ``table_rescan_interval_s`` (``cdc.selection``); every table they select gets the entry's settings.
    """

    name: str | None = Field(
        default=None, description="schema-qualified table name, e.g. public.orders (give one of name, pattern, regex)"
    )
    pattern: str | None = Field(
        default=None,
        description="glob over schema.table selecting every matching ordinary or partitioned table (not views, not "
        "partitions: those come through their partitioned table): * and ? stay within the schema or the table "
        "name, [abc] is a character class; no schema means public; e.g. public.order_*",
    )
    regex: str | None = Field(
        default=None,
        description="regular expression (Python syntax) that must match the whole schema.table, like Debezium's "
        "table.include.list, e.g. 'public\\.order_\\d+'",
    )
    allow_empty: bool = Field(
        default=False,
        description="pattern/regex only: a pattern matching no table is logged (table_pattern_empty) instead of "
        "refusing to start",
    )
    key: list[str] | None = Field(
        default=None, description="key columns; default: the primary key (or the replica identity index)"
    )
    columns: list[str] | None = Field(
        default=None, description="columns to publish (default: all); key columns are always published"
    )
    exclude_columns: list[str] = Field(default_factory=list, description="columns never published")
    mask: dict[str, Literal["fixed", "hash"]] = Field(
        default_factory=dict,
        description="columns published masked: 'fixed' replaces the value with masking.fixed_value, 'hash' with "
        "the hex SHA-256 of masking.salt and the value's text",
    )
    partitions: int | None = Field(default=None, ge=1, description="overrides kafka.partitions for this table")
    replication_factor: int | None = Field(default=None, ge=1, description="overrides kafka.replication_factor")
    topic_config: dict[str, str] = Field(
        default_factory=dict, description="topic settings for this table, over kafka.topic_config"
    )
    truncate: Literal["marker", "skip"] = Field(
        default="marker",
        description="what a TRUNCATE of this table (or a re-snapshot's reset) writes to its topic. marker: one "
        "truncate marker per partition (op 't'), so a replay from offset 0 drops the rows before it. skip: "
        "nothing, like Debezium's default skipped.operations=t, for consumers that fail on op 't' (Flink's "
        "debezium-json format); a replay of the topic then still holds the truncated rows (logged as "
        "truncate_skipped). Read at start-up",
    )
    toast: Literal["fill", "placeholder"] | None = Field(default=None, description="overrides toast.mode for it")

    @model_validator(mode="after")
    def _one_selector(self) -> TableConfig:
        given = [k for k in ("name", "pattern", "regex") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of name, pattern, regex" + (f" (this entry has {', '.join(given)})" if given else "")
            )
        if self.allow_empty and self.name is not None:
            raise ValueError("allow_empty applies to pattern and regex entries only; remove it from a named table")
        return self

    @model_validator(mode="after")
    def _columns_consistent(self) -> TableConfig:
        key = set(self.key or ())
        clash = key & (set(self.exclude_columns) | set(self.mask))
        if clash:
            raise ValueError(f"key columns cannot be excluded or masked: {', '.join(sorted(clash))}")
        if self.columns is not None:
            both = set(self.columns) & set(self.exclude_columns)
            if both:
                raise ValueError(f"columns both included and excluded: {', '.join(sorted(both))}")
        return self

    @field_validator("name")
    @classmethod
    def _qualified(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if "." not in v:
            v = f"public.{v}"
        schema, _, table = v.partition(".")
        if not schema or not table or "." in table:
            raise ValueError(f"expected schema.table, got {v!r}")
        return v

    @field_validator("pattern")
    @classmethod
    def _glob(cls, v: str | None) -> str | None:
        if v is None:
            return v
        return check_glob(v)

    @field_validator("regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression ({e}): {v!r}") from None
        return v

    @property
    def qualified(self) -> str:
        """The table's schema.table; only for a named entry (pattern entries are expanded first)."""
        if self.name is None:
            raise ValueError(f"the table entry {self.selector} is a pattern, not a table: expand it first")
        return self.name

    @property
    def selector(self) -> str:
        """How the entry selects tables, for messages: the name, ``pattern 'public.order_*'`` or ``regex '...'``."""
        if self.pattern is not None:
            return f"pattern {self.pattern!r}"
        if self.regex is not None:
            return f"regex {self.regex!r}"
        return self.qualified

    @property
    def schema_name(self) -> str:
        return self.qualified.partition(".")[0]

    @property
    def table_name(self) -> str:
        return self.qualified.partition(".")[2]


class KafkaConfig(_Section):
    bootstrap_servers: str = Field(description="comma-separated host:port list")
    partitions: int = Field(default=1, ge=1, description="partitions of each table topic created by the daemon")
    replication_factor: int = Field(default=1, ge=1, description="replication factor of created topics")
    topic_config: dict[str, str] = Field(
        default_factory=dict, description="extra settings of created topics (cleanup.policy is always compact)"
    )
    producer: dict[str, str | int | bool] = Field(
        default_factory=dict,
        description="librdkafka producer settings passed through (security.protocol, sasl.*, ssl.*, linger.ms, ...)",
    )
    position_headers: bool = Field(
        default=False,
        description="cdc.lsn, cdc.commit_lsn, cdc.txid and cdc.ordinal headers on every change record; off, "
        "readers take the position from the envelope (source.lsn, source.sequence, source.txId), and records cost "
        "the producer less (bench/README.md, headers in e2e.py); on for consumers that read the headers",
    )

    @field_validator("topic_config")
    @classmethod
    def _compact(cls, v: dict[str, str]) -> dict[str, str]:
        policy = v.get("cleanup.policy")
        if policy is not None and "compact" not in policy.split(","):
            raise ValueError("cleanup.policy must include compact: change topics are compacted by key")
        return v

    @field_validator("producer")
    @classmethod
    def _no_unsafe_producer_settings(cls, v: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        fixed = {"enable.idempotence", "acks", "partitioner", "bootstrap.servers", "transactional.id"}
        bad = sorted(fixed & v.keys())
        if bad:
            raise ValueError(
                f"{', '.join(bad)} cannot be overridden: delivery guarantees depend on them "
                "(set kafka.bootstrap_servers and delivery instead)"
            )
        return v


class DeliveryConfig(_Section):
    mode: Literal["at_least_once", "exactly_once"] = Field(
        default="at_least_once",
        description="at_least_once: idempotent producer, Postgres holds the position; exactly_once: Kafka "
        "transactions with the position in the offsets topic (consumers must read with read_committed)",
    )
    offsets_topic: str = Field(
        default="__cdc_offsets", description="compacted topic holding the committed position (exactly_once)"
    )
    commit_interval_ms: int = Field(
        default=100, ge=1, description="exactly_once: how long a Kafka transaction stays open to batch source ones"
    )
    commit_records: int = Field(default=10_000, ge=1, description="exactly_once: records per Kafka transaction")
    split_records: int = Field(
        default=1_000_000,
        ge=1024,
        description="exactly_once: a source transaction with more records, or producing for half of "
        "transaction.timeout.ms, goes to Kafka in parts (read_committed sees the parts)",
    )


class HeartbeatConfig(_Section):
    interval_ms: int = Field(
        default=0,
        ge=0,
        description="write a heartbeat record to __debezium-heartbeat.<topic_prefix> this often; 0: off",
    )
    action_query: str | None = Field(
        default=None,
        description="SQL run on the source at each heartbeat, e.g. to make WAL on an idle database "
        "(SELECT pg_logical_emit_message(false, 'heartbeat', now()::text))",
    )


class MessagesConfig(_Section):
    include: list[str] | None = Field(
        default=None,
        description="logical decoding messages (pg_logical_emit_message) published on <topic_prefix>.message: only "
        "those whose prefix fully matches one of these regular expressions (Debezium's message.prefix.include.list). "
        "Unset: every prefix but the excluded ones. This daemon's own watermark, heartbeat action_query and outbox "
        "prefixes are never published",
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="prefixes (regular expressions, full match) never published (Debezium's "
        "message.prefix.exclude.list); not together with include. Other daemons' heartbeat and outbox prefixes "
        "belong here",
    )

    @field_validator("include", "exclude")
    @classmethod
    def _regexes(cls, v: list[str] | None) -> list[str] | None:
        for pattern in v or ():
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"{pattern!r} is not a regular expression: {e}") from None
        return v

    @model_validator(mode="after")
    def _one_list(self) -> MessagesConfig:
        if self.include is not None and self.exclude:
            raise ValueError("set include or exclude, not both (as Debezium's message.prefix lists)")
        return self


class MaskingConfig(_Section):
    fixed_value: str = Field(default="****", description="what a 'fixed' mask publishes")
    salt: SecretStr | None = Field(
        default=None, description="salt of 'hash' masks; prefer CDC_MASKING__SALT; required when any hash mask is set"
    )


class DecoderConfig(_Section):
    streaming: bool = Field(
        default=True,
        description="PostgreSQL 14+: receive large transactions in blocks before they commit (streaming 'on'); "
        "they wait on disk in spool_dir until their commit. Off: the server holds them until their commit",
    )
    spool_dir: Path | None = Field(
        default=None,
        description="where streamed transactions wait for their commit, in a subdirectory per slot "
        "(default: <system temp dir>/cdc-spool); needs room for the largest transaction's changes",
    )
    render_rows: bool = Field(
        default=True,
        description="write each streamed row straight from the server's text into the record's JSON or "
        "Avro, skipping typed values where a column's text maps directly (integers, text types, bool, "
        "uuid, json, numeric(p,s) under precise, timestamptz); the records are byte for byte the same. "
        "Tables with column policies and outbox tables always take typed values. False: every row "
        "through typed values",
    )


class HttpConfig(_Section):
    enabled: bool = Field(default=True, description="serve /healthz, /readyz and Prometheus /metrics")
    host: str = Field(default="0.0.0.0", description="address to listen on")
    port: int = Field(default=8080, ge=0, le=65535, description="port to listen on (0: any free port, logged)")


class LimitsConfig(_Section):
    max_inflight_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes of records produced but not yet acknowledged before reading WAL pauses",
    )
    max_record_bytes: int = Field(default=1_000_000, ge=1024, description="largest record value accepted")
    dead_letter_topic: str | None = Field(
        default=None,
        description="where a record over max_record_bytes goes (its key, size and reason; counted and logged); "
        "unset: such a record stops the pipeline with an error naming table and key",
    )


class Config(BaseSettings):
    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix="CDC_",
        env_nested_delimiter="__",
        env_prefix_target="all",  # CDC_JSON__... too, though the field is aliased "json"
        nested_model_default_partial_update=True,
    )

    source: SourceConfig
    tables: list[TableConfig] = Field(
        min_length=1,
        description="captured tables, by name or pattern; a table named here wins over a pattern that also matches it",
    )
    table_rescan_interval_s: float = Field(
        default=0,
        ge=0,
        description="while streaming, look for new tables matching a pattern or regex entry this often (they are "
        "captured and snapshotted like tables added on SIGHUP); 0: only at start-up and on SIGHUP",
    )
    kafka: KafkaConfig
    topic_prefix: str = Field(description="topics are <topic_prefix>.<schema>.<table>")
    format: Literal["json", "avro"] = Field(
        default="json", description="record format: json (Debezium envelope) or avro (Confluent wire format)"
    )
    json_format: JsonFormat = Field(default_factory=JsonFormat, alias="json")
    avro_format: AvroFormat = Field(default_factory=AvroFormat, alias="avro")
    schema_registry: RegistrySettings | None = Field(
        default=None, description="Confluent-compatible schema registry; required with format: avro"
    )
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    toast: ToastConfig = Field(default_factory=ToastConfig)
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    decoder: DecoderConfig = Field(default_factory=DecoderConfig)
    masking: MaskingConfig = Field(default_factory=MaskingConfig)
    heartbeat: HeartbeatConfig = Field(default_factory=HeartbeatConfig)
    messages: MessagesConfig = Field(default_factory=MessagesConfig)
    spark: SparkSection = Field(default_factory=SparkSection)  # declared views and indexes (cdc.declared)
    outbox: OutboxConfig = Field(default_factory=OutboxConfig, description="application events through the log")
    transaction_metadata: bool = Field(
        default=False, description="write BEGIN/END records with event counts to <topic_prefix>.transaction"
    )
    status_interval_s: float = Field(default=10.0, gt=0, le=60, description="standby status update interval")
    reconnect_timeout_s: float = Field(
        default=600.0, gt=0, description="how long to retry a lost replication connection before giving up"
    )
    shutdown_timeout_s: float = Field(
        default=30.0, gt=0, description="on SIGTERM, how long to wait for Kafka to acknowledge what is in flight"
    )

    @field_validator("tables", mode="before")
    @classmethod
    def _table_shorthand(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"name": t} if isinstance(t, str) else t for t in v]
        return v

    @field_validator("topic_prefix")
    @classmethod
    def _topic_chars(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", v):
            raise ValueError("may hold only letters, digits, '.', '_' and '-'")
        return v

    @model_validator(mode="after")
    def _unique_tables(self) -> Config:
        names = [t.selector for t in self.tables]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tables: listed more than once: {', '.join(dupes)}")
        if self.format == "avro" and self.schema_registry is None:
            raise ValueError("format avro needs a schema_registry section with its url")
        if self.masking.salt is None and any("hash" in t.mask.values() for t in self.tables):
            raise ValueError("a 'hash' mask needs masking.salt (set CDC_MASKING__SALT)")
        captured = {t.name for t in self.tables if t.name is not None}
        both = sorted(captured & {t.name for t in self.outbox.tables})
        if both:
            raise ValueError(
                f"outbox.tables: {', '.join(both)} is also under 'tables'; list an outbox table only under "
                "outbox.tables (set produce_change_topic: true there for its change topic)"
            )
        return self

    @property
    def outbox_dead_letter_topic(self) -> str:
        """Where malformed outbox events go: outbox.dead_letter_topic, else limits.dead_letter_topic, else
        ``<topic_prefix>.outbox.dead_letter``."""
        if self.outbox.dead_letter_topic is not None:
            return self.outbox.dead_letter_topic.replace("{topic_prefix}", self.topic_prefix)
        return self.limits.dead_letter_topic or f"{self.topic_prefix}.outbox.dead_letter"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment wins over the YAML file (passed as init arguments).
        return (env_settings, init_settings)


def _explain(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (remove it, or check its spelling)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"  {path}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path) -> Config:
    """Read, validate and return the configuration; ConfigError explains every problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read the configuration file {p}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {e}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of keys (source, tables, kafka, ...)")
    spark = data.get("spark")
    included = spark.get("file") if isinstance(spark, dict) and isinstance(spark.get("file"), str) else None
    if isinstance(spark, dict) and included is not None:  # relative to this file, not to the working directory
        data["spark"] = {**spark, "file": str(p.parent / Path(included).expanduser())}
    try:
        return Config(**data)
    except ValidationError as e:
        note = f"\n  (spark.views and spark.indexes include those of {data['spark']['file']})" if included else ""
        raise ConfigError(f"{p}: invalid configuration:\n{_explain(e)}{note}") from None
