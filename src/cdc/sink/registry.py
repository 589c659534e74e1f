"""A small client for a Confluent-compatible schema registry.

It speaks the Confluent Schema Registry REST API (v7), which Confluent's registry, Apicurio
Registry's ccompat API (``http://host:8080/apis/ccompat/v7``), Karapace and Redpanda serve,
and does only what the Avro sink needs:

* ``register(subject, schema)``: the schema's id under a subject (registered if new). Ids are
  cached by subject and canonical schema text, so a table schema seen again costs no request.
* ``latest``, ``schema_text``, ``is_compatible``, ``compatibility``/``set_compatibility``,
  ``delete_subject``, ``check_reachable``: look-ups and administration (start-up checks, tests).

HTTP goes through the standard library (``urllib``); no extra dependency. Connection errors
(refused, reset, timed out, name resolution) are retried with capped exponential backoff for
``retry_timeout_s``; an HTTP answer is never retried. Errors say what failed and what to do:

* ``RegistryError``: unreachable, credentials refused, or an unexpected answer; names the URL.
* ``IncompatibleSchemaError``: HTTP 409 on register, the subject's compatibility rule rejected
  the schema; names the subject, what the schema describes (the table), the fields that
  changed and the fixes.

Not thread-safe (the pipeline has one thread).
"""

from __future__ import annotations

import base64
import http.client
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import orjson
import structlog
import tenacity

from cdc.sink.avro_diff import describe_changes
from cdc.sink.settings import RegistrySettings

__all__ = [
    "IncompatibleSchemaError",
    "RegisteredSchema",
    "RegistryClient",
    "RegistryError",
    "RegistrySettings",
    "SchemaRegistry",
    "describe_changes",
]

log = structlog.get_logger("cdc.sink.registry")

_CONTENT_TYPE: Final = "application/vnd.schemaregistry.v1+json"
_ACCEPT: Final = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json"
_COMPATIBILITY_LEVELS: Final = frozenset(
    {"NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"}
)


class RegistryError(Exception):
    """The schema registry cannot be used; the message names the URL and the fix."""


class IncompatibleSchemaError(RegistryError):
    """The registry refused a schema under the subject's compatibility rule (HTTP 409)."""

    def __init__(self, message: str, *, subject: str, changes: tuple[str, ...], compatibility: str | None) -> None:
        super().__init__(message)
        self.subject = subject
        self.changes = changes
        self.compatibility = compatibility


class SchemaRegistry(Protocol):
    """What the Avro serializer needs from a registry (``RegistryClient``; a fake in unit tests)."""

    def register(self, subject: str, schema: Mapping[str, Any] | str, *, source: str | None = None) -> int:
        """The id of ``schema`` under ``subject``, registering it as a new version if needed.

        ``source`` says what the schema describes (e.g. ``table public.orders``) for error messages.
        """
        ...


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    subject: str
    version: int
    id: int
    schema: str  # the schema text as the registry holds it


class _Unreachable(Exception):
    """A connection-level failure: retried, then reported as RegistryError."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Opener(Protocol):
    """``urllib.request.OpenerDirector``, or a stand-in in tests."""

    def open(self, fullurl: urllib.request.Request, data: bytes | None = None, timeout: float | None = ...) -> Any: ...


def canonical_schema(schema: Mapping[str, Any] | str) -> tuple[str, str]:
    """(the text to send, the text that identifies it): compact JSON, and the same with sorted keys."""
    if isinstance(schema, str):
        try:
            parsed = orjson.loads(schema)
        except orjson.JSONDecodeError as exc:
            raise RegistryError(f"not a JSON schema: {exc}: {schema[:200]!r}") from exc
        return schema, orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    return orjson.dumps(schema).decode(), orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()


class RegistryClient:
    """A Confluent Schema Registry API client (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        ssl_ca_file: Path | None = None,
        timeout_s: float = 10.0,
        retry_timeout_s: float = 60.0,
        opener: _Opener | None = None,
    ) -> None:
        self._url = url.rstrip("/")
        self._timeout = timeout_s
        self._retry_timeout = retry_timeout_s
        self._headers = {"Content-Type": _CONTENT_TYPE, "Accept": _ACCEPT}
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        if opener is None:
            handlers: list[urllib.request.BaseHandler] = []
            if ssl_ca_file is not None:
                handlers.append(
                    urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(ssl_ca_file)))
                )
            self._opener: _Opener = urllib.request.build_opener(*handlers)
        else:
            self._opener = opener
        self._ids: dict[tuple[str, str], int] = {}
        self._texts: dict[int, str] = {}

    @classmethod
    def from_settings(cls, settings: RegistrySettings) -> RegistryClient:
        return cls(
            settings.url,
            username=settings.username,
            password=settings.password.get_secret_value() if settings.password is not None else None,
            ssl_ca_file=settings.ssl_ca_file,
            timeout_s=settings.timeout_s,
            retry_timeout_s=settings.retry_timeout_s,
        )

    @property
    def url(self) -> str:
        return self._url

    # --- schemas --------------------------------------------------------------

    def register(self, subject: str, schema: Mapping[str, Any] | str, *, source: str | None = None) -> int:
        """The id of ``schema`` under ``subject``; a new schema becomes the subject's next version."""
        text, canonical = canonical_schema(schema)
        cached = self._ids.get((subject, canonical))
        if cached is not None:
            return cached
        status, body = self._call(
            "POST", f"/subjects/{_quote(subject)}/versions", {"schema": text}, "register a schema"
        )
        if status == 200 and isinstance(body, dict) and isinstance(body.get("id"), int):
            schema_id: int = body["id"]
            self._ids[(subject, canonical)] = schema_id
            self._texts.setdefault(schema_id, text)
            log.info("registry.schema_registered", subject=subject, schema_id=schema_id, source=source)
            return schema_id
        if status == 409:
            raise self._incompatible(subject, text, body, source)
        raise self._unexpected(f"registering a schema under subject {subject!r}", status, body, source)

    def lookup(self, subject: str, schema: Mapping[str, Any] | str) -> RegisteredSchema | None:
        """The version of ``subject`` holding exactly ``schema``, or None (nothing is registered)."""
        text, _ = canonical_schema(schema)
        status, body = self._call("POST", f"/subjects/{_quote(subject)}", {"schema": text}, "look a schema up")
        if status == 404:
            return None
        if status == 200:
            return _registered(subject, body, text)
        raise self._unexpected(f"looking a schema up under subject {subject!r}", status, body, None)

    def latest(self, subject: str) -> RegisteredSchema | None:
        """The subject's latest version, or None when the subject has none."""
        status, body = self._call("GET", f"/subjects/{_quote(subject)}/versions/latest", None, "read a subject")
        if status == 404:
            return None
        if status == 200:
            return _registered(subject, body, None)
        raise self._unexpected(f"reading the latest version of subject {subject!r}", status, body, None)

    def versions(self, subject: str) -> list[int]:
        """The subject's version numbers (empty when it does not exist)."""
        status, body = self._call("GET", f"/subjects/{_quote(subject)}/versions", None, "list versions")
        if status == 404:
            return []
        if status == 200 and isinstance(body, list):
            return [int(v) for v in body]
        raise self._unexpected(f"listing the versions of subject {subject!r}", status, body, None)

    def schema_text(self, schema_id: int) -> str:
        """The schema registered with id ``schema_id`` (what a consumer decodes a record with)."""
        text = self.find_schema_text(schema_id)
        if text is None:
            raise RegistryError(f"the schema registry at {self._url} has no schema with id {schema_id} (HTTP 404)")
        return text

    def find_schema_text(self, schema_id: int) -> str | None:
        """The schema registered with id ``schema_id``, or None when the registry does not know the id."""
        text = self._texts.get(schema_id)
        if text is not None:
            return text
        status, body = self._call("GET", f"/schemas/ids/{schema_id}", None, "read a schema by id")
        if status == 200 and isinstance(body, dict) and isinstance(body.get("schema"), str):
            text = str(body["schema"])
            self._texts[schema_id] = text
            return text
        if status == 404:
            return None
        raise self._unexpected(f"reading the schema with id {schema_id}", status, body, None)

    def is_compatible(self, subject: str, schema: Mapping[str, Any] | str) -> bool:
        """Whether ``schema`` passes the subject's compatibility rule against its latest version."""
        text, _ = canonical_schema(schema)
        path = f"/compatibility/subjects/{_quote(subject)}/versions/latest"
        status, body = self._call("POST", path, {"schema": text}, "test compatibility")
        if status == 404:  # no version yet: anything is compatible
            return True
        if status == 200 and isinstance(body, dict) and isinstance(body.get("is_compatible"), bool):
            return bool(body["is_compatible"])
        raise self._unexpected(f"testing compatibility under subject {subject!r}", status, body, None)

    # --- configuration --------------------------------------------------------

    def compatibility(self, subject: str | None = None) -> str:
        """The compatibility level of ``subject`` (falling back to the global one), or the global level."""
        path = "/config" if subject is None else f"/config/{_quote(subject)}?defaultToGlobal=true"
        status, body = self._call("GET", path, None, "read the compatibility level")
        if status == 404 and subject is not None:
            return self.compatibility()
        if status == 200 and isinstance(body, dict):
            level = body.get("compatibilityLevel", body.get("compatibility"))
            if isinstance(level, str):
                return level
        raise self._unexpected("reading the compatibility level", status, body, None)

    def set_compatibility(self, level: str, subject: str | None = None) -> None:
        """Set the compatibility level of ``subject`` (or the global one): NONE, BACKWARD, FULL, ..."""
        if level not in _COMPATIBILITY_LEVELS:
            raise ValueError(f"compatibility must be one of {', '.join(sorted(_COMPATIBILITY_LEVELS))}, not {level!r}")
        path = "/config" if subject is None else f"/config/{_quote(subject)}"
        status, body = self._call("PUT", path, {"compatibility": level}, "set the compatibility level")
        if status != 200:
            raise self._unexpected(f"setting compatibility {level} on {subject or 'the registry'}", status, body, None)

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        """Delete a subject (soft; ``permanent`` also removes soft-deleted versions). Returns the versions."""
        quoted = _quote(subject)
        status, body = self._call("DELETE", f"/subjects/{quoted}", None, "delete a subject")
        if permanent and status in (200, 404):
            status, body = self._call("DELETE", f"/subjects/{quoted}?permanent=true", None, "delete a subject")
        if status == 404:
            return []
        if status == 200 and isinstance(body, list):
            self._ids = {k: v for k, v in self._ids.items() if k[0] != subject}
            return [int(v) for v in body]
        raise self._unexpected(f"deleting subject {subject!r}", status, body, None)

    def subjects(self) -> list[str]:
        status, body = self._call("GET", "/subjects", None, "list subjects")
        if status == 200 and isinstance(body, list):
            return [str(s) for s in body]
        raise self._unexpected("listing subjects", status, body, None)

    def check_reachable(self) -> None:
        """Raise RegistryError unless the registry answers (for start-up checks)."""
        status, body = self._call("GET", "/config", None, "check that it answers")
        if status != 200:
            raise self._unexpected("checking that it answers (GET /config)", status, body, None)

    # --- HTTP -----------------------------------------------------------------

    def _call(self, method: str, path: str, payload: Any, what: str) -> tuple[int, Any]:
        """(status, decoded JSON body) of one request, retrying connection errors only."""
        data = orjson.dumps(payload) if payload is not None else None
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Unreachable),
            wait=tenacity.wait_exponential(multiplier=0.1, max=5.0),
            stop=tenacity.stop_after_delay(self._retry_timeout),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    status, raw = self._send(method, path, data)
        except _Unreachable as exc:
            raise RegistryError(
                f"cannot reach the schema registry at {self._url} to {what} ({exc.reason}; retried for "
                f"{self._retry_timeout:g}s). Fix: check schema_registry.url (the Confluent-compatible API, e.g. "
                "http://registry:8081, or Apicurio's http://registry:8080/apis/ccompat/v7), that the registry "
                "is running, and that this host can reach it"
            ) from None
        if status in (401, 403):
            raise RegistryError(
                f"the schema registry at {self._url} refused the credentials (HTTP {status}) to {what}. "
                "Fix: set schema_registry.username and schema_registry.password (CDC_SCHEMA_REGISTRY__PASSWORD) "
                "to an account allowed to read and register schemas"
            )
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = raw.decode("utf-8", "replace")[:500]
        return status, body

    def _send(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        request = urllib.request.Request(self._url + path, data=data, method=method, headers=self._headers)
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:  # an answer, not a connection error
            with exc:
                return exc.code, exc.read()
        except ssl.SSLError as exc:
            raise RegistryError(
                f"TLS with the schema registry at {self._url} failed: {exc}. Fix: check the URL's scheme "
                "and, for a private CA, set schema_registry.ssl_ca_file"
            ) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLError):
                raise RegistryError(
                    f"TLS with the schema registry at {self._url} failed: {exc.reason}. Fix: check the URL's "
                    "scheme and, for a private CA, set schema_registry.ssl_ca_file"
                ) from None
            if isinstance(exc.reason, OSError):
                raise _Unreachable(_reason(exc.reason)) from exc
            raise RegistryError(f"cannot use the schema registry URL {self._url}: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:  # reset, timed out, remote closed
            raise _Unreachable(_reason(exc)) from exc

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "registry.retry",
            url=self._url,
            attempt=state.attempt_number,
            error=str(error) if error is not None else None,
            wait_s=round(state.next_action.sleep, 3) if state.next_action is not None else None,
        )

    # --- errors -----------------------------------------------------------------

    def _incompatible(self, subject: str, text: str, body: Any, source: str | None) -> IncompatibleSchemaError:
        changes: tuple[str, ...] = ()
        latest_version = "the latest version"
        try:
            latest = self.latest(subject)
            if latest is not None:
                latest_version = f"version {latest.version} (id {latest.id})"
                changes = tuple(describe_changes(orjson.loads(latest.schema), orjson.loads(text)))
        except (RegistryError, orjson.JSONDecodeError):
            pass  # the registry's own message below still explains
        level: str | None = None
        try:
            level = self.compatibility(subject)
        except RegistryError:
            pass
        what = f" ({source})" if source else ""
        changed = "; ".join(changes) if changes else "see the registry's message"
        message = (
            f"the schema registry at {self._url} rejected the new schema of subject {subject!r}{what} as "
            f"incompatible with {latest_version} under compatibility {level or 'unknown'}. "
            f"What changed: {changed}. Registry says: {_message(body)}. "
            "Fix: evolve the table compatibly (adding or dropping a non-key column is compatible; changing "
            "a key column, or a column's type in a way Avro cannot promote, is not), or, if every consumer "
            f"copes with the change, relax the rule for this subject: PUT {self._url}/config/{_quote(subject)} "
            '{"compatibility": "NONE"}, then restart'
        )
        return IncompatibleSchemaError(message, subject=subject, changes=changes, compatibility=level)

    def _unexpected(self, what: str, status: int, body: Any, source: str | None) -> RegistryError:
        hint = ""
        if status == 422:
            hint = (
                " The registry rejects the schema itself as invalid: this is a bug, please report it with this message."
            )
        elif status == 404:
            hint = " Fix: check that schema_registry.url points at the Confluent-compatible API root."
        what_for = f" for {source}" if source else ""
        return RegistryError(
            f"schema registry {self._url}: {what}{what_for} failed with HTTP {status}: {_message(body)}.{hint}"
        )


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _message(body: Any) -> str:
    if isinstance(body, dict):
        message = body.get("message")
        code = body.get("error_code")
        if message is not None:
            return f"{message} (error code {code})" if code is not None else str(message)
    return str(body)[:500] if body else "(no body)"


def _registered(subject: str, body: Any, text: str | None) -> RegisteredSchema:
    if not isinstance(body, dict):
        raise RegistryError(f"schema registry: unexpected answer for subject {subject!r}: {body!r:.200}")
    return RegisteredSchema(
        subject=str(body.get("subject", subject)),
        version=int(body["version"]),
        id=int(body["id"]),
        schema=str(body.get("schema", text or "")),
    )


# ---------------------------------------------------------------------------
# What changed between two Avro schemas (for error messages)
# ---------------------------------------------------------------------------
