"""cdc.sink.registry: the schema registry client, against stand-ins (no services); the real registry is in
tests/integration."""

from __future__ import annotations

import base64
import http.server
import io
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from email.message import Message
from typing import Any

import orjson
import pydantic
import pytest
from structlog.testing import capture_logs

from cdc.sink.registry import (
    IncompatibleSchemaError,
    RegistryClient,
    RegistryError,
    RegistrySettings,
    describe_changes,
)

URL = "http://registry.test:8081"

V1 = {
    "type": "record",
    "name": "Envelope",
    "namespace": "p.public.t",
    "fields": [
        {
            "name": "before",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Value",
                    "namespace": "p.public.t",
                    "fields": [
                        {"name": "id", "type": "int"},
                        {"name": "name", "type": ["null", "string"], "default": None},
                        {"name": "n", "type": ["null", "int"], "default": None},
                    ],
                },
            ],
            "default": None,
        },
        {"name": "after", "type": ["null", "p.public.t.Value"], "default": None},
        {"name": "op", "type": "string"},
    ],
}


def with_value_fields(fields: list[dict[str, Any]]) -> dict[str, Any]:
    schema = orjson.loads(orjson.dumps(V1))
    schema["fields"][0]["type"][1]["fields"] = fields
    return dict(schema)


class Response(io.BytesIO):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(orjson.dumps(body) if body is not None else b"")
        self.status = status


class FakeOpener:
    """Answers requests from a script: each entry is a response body with status, or an exception to raise."""

    def __init__(
        self, *script: tuple[int, Any] | BaseException | Callable[[urllib.request.Request], tuple[int, Any]]
    ) -> None:
        self.script = list(script)
        self.requests: list[urllib.request.Request] = []

    def open(
        self, fullurl: urllib.request.Request, data: bytes | None = None, timeout: float | None = None
    ) -> Response:
        self.requests.append(fullurl)
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, BaseException):
            raise step
        status, body = step(fullurl) if callable(step) else step
        if status >= 400:
            raise urllib.error.HTTPError(fullurl.full_url, status, "error", Message(), io.BytesIO(orjson.dumps(body)))
        return Response(status, body)

    def calls(self) -> list[tuple[str, str, Any]]:
        out = []
        for r in self.requests:
            body = orjson.loads(r.data) if isinstance(r.data, bytes) else None
            out.append((r.get_method(), r.full_url.removeprefix(URL), body))
        return out


def client(opener: FakeOpener, **kw: Any) -> RegistryClient:
    kw.setdefault("retry_timeout_s", 5.0)
    return RegistryClient(URL, opener=opener, **kw)


# --- register -------------------------------------------------------------------------------


def test_register_posts_the_schema_and_caches_the_id() -> None:
    opener = FakeOpener((200, {"id": 42}))
    c = client(opener)
    assert c.register("p.public.t-value", V1, source="table public.t") == 42
    assert c.register("p.public.t-value", orjson.loads(orjson.dumps(V1))) == 42  # equal schema: cached
    assert c.register("p.public.t-value", orjson.dumps(V1, option=orjson.OPT_SORT_KEYS).decode()) == 42  # same, as text
    assert opener.calls() == [("POST", "/subjects/p.public.t-value/versions", {"schema": orjson.dumps(V1).decode()})]
    request = opener.requests[0]
    assert request.get_header("Content-type") == "application/vnd.schemaregistry.v1+json"
    assert "application/vnd.schemaregistry.v1+json" in (request.get_header("Accept") or "")
    assert request.get_header("Authorization") is None


def test_the_cache_is_per_subject() -> None:
    opener = FakeOpener((200, {"id": 1}))
    c = client(opener)
    c.register("a-value", V1)
    c.register("b-value", V1)
    assert [path for _, path, _ in opener.calls()] == ["/subjects/a-value/versions", "/subjects/b-value/versions"]


def test_subjects_are_url_quoted() -> None:
    opener = FakeOpener((200, {"id": 1}))
    client(opener).register("odd/subject name", V1)
    assert opener.requests[0].full_url == f"{URL}/subjects/odd%2Fsubject%20name/versions"


def test_basic_auth() -> None:
    opener = FakeOpener((200, {"id": 1}))
    client(opener, username="key", password="s3cret").register("s", V1)
    expected = "Basic " + base64.b64encode(b"key:s3cret").decode()
    assert opener.requests[0].get_header("Authorization") == expected


def test_refused_credentials_name_the_settings() -> None:
    opener = FakeOpener((401, {"error_code": 40101, "message": "Unauthorized"}))
    with pytest.raises(RegistryError, match=r"refused the credentials \(HTTP 401\).*schema_registry.username"):
        client(opener).register("s", V1)


def test_an_incompatible_schema_names_subject_table_changes_and_fixes() -> None:
    new = with_value_fields(
        [
            {"name": "id", "type": "int"},
            {"name": "name", "type": ["null", "int"], "default": None},
            {"name": "email", "type": "string"},
        ]
    )
    opener = FakeOpener(
        (409, {"error_code": 409, "message": "Incompatible artifact: p.public.t-value [AVRO]"}),
        (200, {"subject": "p.public.t-value", "version": 3, "id": 17, "schema": orjson.dumps(V1).decode()}),
        (200, {"compatibilityLevel": "BACKWARD"}),
    )
    with pytest.raises(IncompatibleSchemaError) as info:
        client(opener).register("p.public.t-value", new, source="table public.t")
    error = info.value
    message = str(error)
    assert error.subject == "p.public.t-value" and error.compatibility == "BACKWARD"
    assert error.changes == (
        "Value.n was removed",
        "Value.name changed type from null|string to null|int",
        "Value.email was added (string, without a default)",
    )
    for part in (
        "subject 'p.public.t-value' (table public.t)",
        "version 3 (id 17)",
        "compatibility BACKWARD",
        "Value.email was added",
        "Incompatible artifact",
        "Fix:",
        f"PUT {URL}/config/p.public.t-value",
    ):
        assert part in message, part
    assert [c[:2] for c in opener.calls()] == [
        ("POST", "/subjects/p.public.t-value/versions"),
        ("GET", "/subjects/p.public.t-value/versions/latest"),
        ("GET", "/config/p.public.t-value?defaultToGlobal=true"),
    ]


def test_an_invalid_schema_is_reported_as_a_bug() -> None:
    opener = FakeOpener((422, {"error_code": 42201, "message": "Invalid schema"}))
    with pytest.raises(RegistryError, match=r"HTTP 422: Invalid schema \(error code 42201\).*bug"):
        client(opener).register("s", V1, source="table public.t")


def test_a_server_error_is_not_retried() -> None:
    opener = FakeOpener((500, {"error_code": 50001, "message": "store error"}))
    with pytest.raises(RegistryError, match="HTTP 500"):
        client(opener).register("s", V1)
    assert len(opener.requests) == 1


# --- connection errors and retries ------------------------------------------------------------


def test_connection_errors_are_retried_then_succeed() -> None:
    opener = FakeOpener(
        urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
        ConnectionResetError(104, "Connection reset by peer"),
        (200, {"id": 5}),
    )
    with capture_logs() as logs:
        assert client(opener).register("s", V1) == 5
    assert len(opener.requests) == 3
    retries = [e for e in logs if e["event"] == "registry.retry"]
    assert [e["attempt"] for e in retries] == [1, 2]
    assert all(e["url"] == URL and e["log_level"] == "warning" for e in retries)
    assert "Connection refused" in retries[0]["error"]


def test_an_unreachable_registry_names_the_url_and_the_fix() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/apis/ccompat/v7"
    c = RegistryClient(url, retry_timeout_s=0.3, timeout_s=1.0)
    with pytest.raises(RegistryError) as info:
        c.register("s", V1)
    message = str(info.value)
    assert f"cannot reach the schema registry at {url} to register a schema" in message
    assert "Fix: check schema_registry.url" in message and "retried for 0.3s" in message
    with pytest.raises(RegistryError, match="cannot reach"):
        c.check_reachable()


def test_tls_errors_are_not_retried() -> None:
    opener = FakeOpener(urllib.error.URLError(ssl.SSLCertVerificationError(1, "certificate verify failed")))
    with pytest.raises(RegistryError, match="TLS.*ssl_ca_file"):
        client(opener).register("s", V1)
    assert len(opener.requests) == 1


# --- look-ups and configuration ----------------------------------------------------------------


def test_lookups() -> None:
    text = orjson.dumps(V1).decode()
    opener = FakeOpener(
        (200, {"subject": "s", "version": 2, "id": 9, "schema": text}),
        (404, {"error_code": 40401, "message": "Subject not found"}),
        (200, [1, 2]),
        (200, {"schema": text}),
        (200, {"is_compatible": False}),
        (404, {"error_code": 40401, "message": "Subject not found"}),
        (200, {"compatibilityLevel": "NONE"}),
        (200, {"compatibility": "FULL"}),
        (200, [1, 2]),
        (200, ["a-key", "a-value"]),
    )
    c = client(opener)
    latest = c.latest("s")
    assert latest is not None and (latest.version, latest.id, latest.schema) == (2, 9, text)
    assert c.latest("nope") is None
    assert c.versions("s") == [1, 2]
    assert c.schema_text(9) == text
    assert c.schema_text(9) == text  # cached
    assert c.is_compatible("s", V1) is False
    assert c.is_compatible("new-subject", V1) is True
    assert c.compatibility() == "NONE"
    c.set_compatibility("FULL", "s")
    assert c.delete_subject("s") == [1, 2]
    assert c.subjects() == ["a-key", "a-value"]
    assert [c[:2] for c in opener.calls()] == [
        ("GET", "/subjects/s/versions/latest"),
        ("GET", "/subjects/nope/versions/latest"),
        ("GET", "/subjects/s/versions"),
        ("GET", "/schemas/ids/9"),
        ("POST", "/compatibility/subjects/s/versions/latest"),
        ("POST", "/compatibility/subjects/new-subject/versions/latest"),
        ("GET", "/config"),
        ("PUT", "/config/s"),
        ("DELETE", "/subjects/s"),
        ("GET", "/subjects"),
    ]
    assert opener.calls()[7][2] == {"compatibility": "FULL"}
    with pytest.raises(ValueError, match="BACKWARD"):
        c.set_compatibility("SOMETIMES")


# --- settings --------------------------------------------------------------------------------


def test_settings() -> None:
    s = RegistrySettings(url="https://registry.example:8081/", username="u", password=pydantic.SecretStr("p"))
    assert s.url == "https://registry.example:8081"
    assert "p" not in repr(s.password)
    assert RegistryClient.from_settings(s).url == "https://registry.example:8081"
    for bad in ("registry:8081", "ftp://x", "http://x/?a=1"):
        with pytest.raises(pydantic.ValidationError):
            RegistrySettings(url=bad)
    with pytest.raises(pydantic.ValidationError):
        RegistrySettings(url="http://x", compatibility="NONE")  # type: ignore[call-arg]  # the unknown field under test


# --- over real HTTP (a server in this process) ------------------------------------------------------


@pytest.fixture
def local_registry() -> Iterator[tuple[str, list[tuple[str, str, bytes, str | None]]]]:
    seen: list[tuple[str, str, bytes, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            seen.append((self.command, self.path, body, self.headers.get("Content-Type")))
            if self.path.endswith("/subjects/bad-value/versions"):
                status, reply = 409, {"error_code": 409, "message": "incompatible"}
            elif self.path.endswith("/versions/latest"):
                status, reply = 404, {"error_code": 40401, "message": "Subject not found"}
            elif self.path.startswith("/ccompat/config"):
                status, reply = 200, {"compatibilityLevel": "BACKWARD"}
            else:
                status, reply = 200, {"id": 7}
            data = orjson.dumps(reply)
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/ccompat", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_over_http(local_registry: tuple[str, list[tuple[str, str, bytes, str | None]]]) -> None:
    url, seen = local_registry
    c = RegistryClient(url)
    assert c.register("t-value", V1) == 7
    assert seen[0][:2] == ("POST", "/ccompat/subjects/t-value/versions")
    assert orjson.loads(seen[0][2]) == {"schema": orjson.dumps(V1).decode()}
    assert seen[0][3] == "application/vnd.schemaregistry.v1+json"
    with pytest.raises(IncompatibleSchemaError) as info:
        c.register("bad-value", V1, source="table public.bad")
    assert "compatibility BACKWARD" in str(info.value) and "incompatible (error code 409)" in str(info.value)
    c.check_reachable()


# --- describe_changes ----------------------------------------------------------------------------


def test_describe_changes_walks_nested_records_once() -> None:
    new = with_value_fields(
        [
            {"name": "id", "type": "long"},
            {"name": "name", "type": ["null", "string"], "default": None},
            {"name": "email", "type": ["null", "string"], "default": None},
            {"name": "age", "type": "int"},
        ]
    )
    assert describe_changes(V1, new) == [
        "Value.n was removed",
        "Value.id changed type from int to long",
        "Value.email was added (null|string, with default null)",
        "Value.age was added (int, without a default)",
    ]


def test_describe_changes_of_equal_schemas_is_empty() -> None:
    assert describe_changes(V1, orjson.loads(orjson.dumps(V1))) == []


def test_describe_changes_sees_optionality_and_renames() -> None:
    new = with_value_fields(
        [
            {"name": "id", "type": ["null", "int"], "default": None},
            {"name": "name", "type": ["null", "string"], "default": None},
            {"name": "n", "type": ["null", "int"], "default": None},
        ]
    )
    assert describe_changes(V1, new) == ["Value.id changed type from int to null|int"]
    renamed = dict(V1, name="Other")
    assert describe_changes(V1, renamed) == ["record Envelope was renamed Other"]
