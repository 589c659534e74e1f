"""The sink's sections of the configuration tree, owned here and embedded by ``cdc.config``.

``RegistrySettings`` is the ``schema_registry`` section (``cdc.sink.registry`` builds its client from
it). It lives apart from the client so that the configuration model does not import an HTTP client.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["RegistrySettings"]


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
