"""The sink's sections of the configuration tree, owned here and embedded by ``cdc.config``.

``RegistrySettings`` is the ``schema_registry`` section (``cdc.sink.registry`` builds its client from
it). It lives apart from the client so that the configuration model does not import an HTTP client.

``JsonFormat`` and ``AvroFormat`` are the ``json`` and ``avro`` sections. Each format's serializer
settings (``JsonSettings``, ``AvroSettings``) are its section plus what the serializer takes from
elsewhere in the configuration (``RecordContext``): one model per format, built from the section with
``of``.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

import cdc

__all__ = [
    "AvroFormat",
    "AvroSettings",
    "JsonFormat",
    "JsonSettings",
    "RecordContext",
    "RegistrySettings",
    "ValueEncoding",
]


class RegistrySettings(BaseModel):
    """The ``schema_registry`` configuration section."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(
        description="base URL of the Confluent-compatible API, e.g. http://registry:8081 "
        "or Apicurio's http://registry:8080/apis/ccompat/v7"
    )
    username: str | None = Field(default=None, description="HTTP basic auth user (Confluent Cloud: the API key)")
    password: SecretStr | None = Field(default=None, description="HTTP basic auth password; prefer the environment")
    ssl_ca_file: Path | None = Field(default=None, description="CA bundle for an https registry with a private CA")
    timeout_s: float = Field(default=10.0, gt=0, description="timeout of one HTTP request")
    retry_timeout_s: float = Field(
        default=60.0, ge=0, description="how long connection errors are retried before the pipeline stops"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parsed = urllib.parse.urlsplit(v)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
        if parsed.query or parsed.fragment:
            raise ValueError(f"must not have a query or fragment: {v!r}")
        return v.rstrip("/")


class ValueEncoding(BaseModel):
    """How values of some types are written, in every format: Debezium's settings of the same names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decimal_handling: Literal["precise", "string", "double"] = Field(
        default="precise",
        description="numeric and money. precise (Debezium's default): numeric(p,s) as a Kafka Connect Decimal "
        "(JSON: base64 of the unscaled value; Avro: decimal bytes), unconstrained numeric as "
        "VariableScaleDecimal {scale, value}; NaN and infinities stop the pipeline naming the column. "
        "string: plain decimal text, NaN and infinities included. double: a floating-point number, which "
        "may round (key columns use string, so that keys stay distinct)",
    )
    time_precision: Literal["adaptive", "iso"] = Field(
        default="adaptive",
        description="date, time and timestamp. adaptive (Debezium's default): date as int32 days, time and "
        "timestamp as milliseconds (precision 0-3) or microseconds since the epoch/midnight. iso: ISO 8601 "
        "text (io.debezium.time.IsoDate, IsoTime, IsoTimestamp). timestamptz and timetz are ISO text in "
        "UTC either way",
    )
    interval_handling: Literal["numeric", "string"] = Field(
        default="numeric",
        description="interval. numeric (Debezium's default): int64 microseconds (MicroDuration, a month of "
        "365.25/12 days). string: ISO 8601 duration text such as P1Y2M3DT4H5M6.78S (key columns always "
        "use string, so that keys stay distinct)",
    )


class JsonFormat(ValueEncoding):
    """The ``json`` configuration section."""

    schemas_enable: bool = Field(
        default=False, description="wrap keys and values as {schema, payload} like Kafka Connect's JsonConverter"
    )


class AvroFormat(ValueEncoding):
    """The ``avro`` configuration section."""


class RecordContext(BaseModel):
    """What every format's serializer takes from outside its own section."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic_prefix: str = Field(min_length=1)
    database: str  # source.db
    unavailable_value: str = "__debezium_unavailable_value"  # placeholder for unchanged TOAST (toast.placeholder)
    connector_version: str = cdc.__version__

    @classmethod
    def of(cls, section: ValueEncoding, *, topic_prefix: str, database: str, unavailable_value: str) -> Self:
        """The settings of ``section``'s format: its values as configured, with the context."""
        context = {"topic_prefix": topic_prefix, "database": database, "unavailable_value": unavailable_value}
        return cls.model_validate({**section.model_dump(), **context})


class JsonSettings(JsonFormat, RecordContext):
    """The JSON serializer's settings: the ``json`` section and the context."""


class AvroSettings(AvroFormat, RecordContext):
    """The Avro serializer's settings: the ``avro`` section and the context."""
