"""Kafka Connect standalone with Debezium's connectors: its JDBC sink, to prove Debezium's own consumers
read our topics, and its PostgreSQL source, to measure it beside the daemon (``bench/debezium.py``).

Not a service of ``cdc dev up``: a test (or ``make debezium-compat``) starts one worker, adds
connectors through its REST API, and stops it. The jars come from Maven Central through the same
mechanism as the broker's (``_proc.maven_fetch``), into ``$CDC_CACHE_DIR/connect/``:

* ``connect-pom.xml``: the worker (connect-runtime, connect-json) at the broker's Kafka version;
* ``debezium-jdbc-pom.xml``: ``io.debezium:debezium-connector-jdbc`` with its dependencies and
  the PostgreSQL JDBC driver, laid out as one Connect plugin (``plugin.path``), so it gets its
  own class loader as in a real Connect installation;
* ``debezium-postgres-pom.xml``: ``io.debezium:debezium-connector-postgres``, laid out the same way.

A worker's files live under the directory it is given: ``worker.properties``,
``log4j2.properties``, ``connect.log`` (its log4j2 log), ``connect.out`` (JVM stdout/stderr),
``offsets`` (standalone source offsets; the sink's offsets are a consumer group in Kafka).
"""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from structlog.typing import FilteringBoundLogger

from cdc.dev import _proc
from cdc.dev._proc import DevServiceError

WORKER_POM = "connect-pom.xml"
JDBC_POM = "debezium-jdbc-pom.xml"
POSTGRES_POM = "debezium-postgres-pom.xml"
START_TIMEOUT_S = 180.0  # a cold JVM scanning the plugin on two busy cores
HEAP = "512m"
MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"
# The tests' JVM: small, and C1 only, because their worker starts often and moves a few records.
TEST_JVM = (f"-Xmx{HEAP}", "-XX:TieredStopAtLevel=1")
# Connect as Kafka ships it (connect-standalone.sh's heap, kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS),
# with the full JIT: what a benchmark of a connector's throughput must run, not the tests' start-up settings.
SHIPPED_JVM = (
    "-Xms256M",
    "-Xmx2G",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)


def pom_property(pom: str, name: str) -> str:
    """The value of ``<properties><name>`` in a pom's text."""
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom)
    if match is None:
        raise DevServiceError(f"no <{name}> in the pom")
    return match.group(1).strip()


def worker_version() -> str:
    return pom_property(_proc.package_text(WORKER_POM), "kafka.version")


def jdbc_sink_version() -> str:
    return pom_property(_proc.package_text(JDBC_POM), "debezium.version")


def postgres_source_version() -> str:
    return pom_property(_proc.package_text(POSTGRES_POM), "debezium.version")


def worker_jars(log: FilteringBoundLogger) -> Path:
    """The directory of the Connect worker's jars, fetched with Maven on first use."""
    libs = _proc.maven_fetch(WORKER_POM, "connect", f"connect-{worker_version()}", log) / "libs"
    if not any(libs.glob("connect-runtime-*.jar")):
        raise DevServiceError(f"the Connect jar cache {libs} is incomplete; delete {libs.parent} and retry")
    return libs


def plugin_path(log: FilteringBoundLogger) -> Path:
    """A ``plugin.path`` directory whose one plugin (``libs/``) is Debezium's JDBC sink, fetched on first use."""
    root = _proc.maven_fetch(JDBC_POM, "connect", f"debezium-jdbc-{jdbc_sink_version()}", log)
    if not any((root / "libs").glob("debezium-connector-jdbc-*.jar")):
        raise DevServiceError(f"the Debezium JDBC sink cache {root} is incomplete; delete it and retry")
    return root


def postgres_plugin_path(log: FilteringBoundLogger) -> Path:
    """A ``plugin.path`` directory whose one plugin (``libs/``) is Debezium's PostgreSQL source, fetched on
    first use."""
    root = _proc.maven_fetch(POSTGRES_POM, "connect", f"debezium-postgres-{postgres_source_version()}", log)
    if not any((root / "libs").glob("debezium-connector-postgres-*.jar")):
        raise DevServiceError(f"the Debezium PostgreSQL connector cache {root} is incomplete; delete it and retry")
    return root


def postgres_source_config(
    dsn: str, *, slot: str, publication: str, tables: Sequence[str], topic_prefix: str
) -> dict[str, str]:
    """Debezium's PostgreSQL connector streaming an existing slot through pgoutput, as the daemon does.

    No snapshot, not even of the schema (``configuration_based`` with all three switches saying so: what
    ``never`` was before Debezium 3 removed it): with no stored offset Debezium then streams from the slot's
    position, so it reads exactly the WAL a daemon on a slot made at the same point reads (``no_data`` would
    start at the server's current position, past what the slot holds). The publication is the caller's
    (``disabled``: never made or altered). JSON without schemas, the daemon's default format. Everything else
    is Debezium's default."""
    conn = psycopg.conninfo.conninfo_to_dict(dsn)
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": str(conn.get("host") or "localhost"),
        "database.port": str(conn.get("port") or 5432),
        "database.user": str(conn.get("user") or "postgres"),
        "database.password": str(conn.get("password") or ""),
        "database.dbname": str(conn["dbname"]),
        "topic.prefix": topic_prefix,
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "table.include.list": ",".join(tables),
        "snapshot.mode": "configuration_based",
        "snapshot.mode.configuration.based.snapshot.schema": "false",
        "snapshot.mode.configuration.based.snapshot.data": "false",
        "snapshot.mode.configuration.based.start.stream": "true",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
    }


def _log4j2(log_file: Path) -> str:
    return f"""# written by cdc.dev.connect on every start; edits are lost
status = warn
name = cdc-dev-connect
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.hibernate.name = org.hibernate
logger.hibernate.level = WARN
"""


class ConnectError(DevServiceError):
    """The worker or a connector failed; the message carries the worker's log tail."""


class ConnectWorker:
    """One Kafka Connect standalone worker (JSON converters with schemas unless a connector overrides them)."""

    def __init__(
        self,
        work_dir: Path,
        bootstrap: str,
        log: FilteringBoundLogger | None = None,
        *,
        plugins: Sequence[Path] | None = None,
        jvm: Sequence[str] = TEST_JVM,
    ) -> None:
        """``plugins``: the ``plugin.path`` directories (default: the JDBC sink's); ``jvm``: heap and JIT options."""
        self.work_dir = work_dir.resolve()
        self.bootstrap = bootstrap
        self.log = _proc.logger(log)
        self.plugins = plugins
        self.jvm = tuple(jvm)
        self.pid: int | None = None
        self.port: int | None = None
        self._tag = f"-Dcdc.dev.connect={self.work_dir}"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "connect.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise ConnectError("the Connect worker is not running")
        return f"http://127.0.0.1:{self.port}"

    def _markers(self) -> list[str]:
        return [_proc.exact_arg(MAIN), _proc.exact_arg(self._tag)]

    def _logs(self) -> list[Path]:
        return [self.work_dir / "connect.out", self.log_file]

    def start(self) -> ConnectWorker:
        java = _proc.find_java()
        libs = worker_jars(self.log)
        plugins = self.plugins if self.plugins is not None else [plugin_path(self.log)]
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = _proc.free_port("kafka-connect")
        settings = {
            "bootstrap.servers": self.bootstrap,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": str(self.work_dir / "offsets"),
            "offset.flush.interval.ms": "1000",
            "plugin.path": ",".join(str(p) for p in plugins),
            # Debezium's jars and Connect's own carry ServiceLoader manifests: no class scan at start-up.
            "plugin.discovery": "service_load",
            "listeners": f"http://127.0.0.1:{self.port}",
            "rest.advertised.host.name": "127.0.0.1",
        }
        worker = self.work_dir / "worker.properties"
        worker.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.work_dir / "log4j2.properties").write_text(_log4j2(self.log_file))
        cmd = [
            java,
            *self.jvm,
            "-XX:+ExitOnOutOfMemoryError",
            "-Xshare:auto",
            self._tag,
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp",
            str(libs / "*"),
            MAIN,
            str(worker),
        ]
        started = time.monotonic()
        self.pid = _proc.spawn(cmd, log_file=self.work_dir / "connect.out", cwd=self.work_dir)
        try:
            _proc.wait_ready(
                self._answers,
                pid=self.pid,
                markers=self._markers(),
                timeout=START_TIMEOUT_S,
                service="kafka-connect",
                logs=self._logs(),
            )
        except DevServiceError:
            self.stop()
            raise
        self.log.info(
            "dev.connect.started",
            pid=self.pid,
            port=self.port,
            version=worker_version(),
            seconds=round(time.monotonic() - started, 1),
        )
        return self

    def _answers(self) -> bool:
        try:
            self.request("GET", "/connectors")
        except (ConnectError, OSError):
            return False
        return True

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            raise ConnectError(f"Connect REST {method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}") from exc
        return json.loads(text) if text else None

    def add_connector(self, name: str, config: dict[str, str]) -> None:
        self.request("PUT", f"/connectors/{name}/config", {"name": name, **config})

    def delete_connector(self, name: str) -> None:
        self.request("DELETE", f"/connectors/{name}")

    def status(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/connectors/{name}/status")
        return result

    def failure(self, name: str) -> str | None:
        """The trace of the connector's or a task's failure; None while they run."""
        try:
            status = self.status(name)
        except ConnectError:
            return None  # not created yet
        states = [status.get("connector", {}), *status.get("tasks", [])]
        for state in states:
            if state.get("state") == "FAILED":
                return str(state.get("trace") or state)
        return None

    def tail(self, lines: int = 60) -> str:
        return _proc.tails(self._logs(), lines)

    def stop(self) -> None:
        if self.pid is not None:
            _proc.stop_pid(self.pid, self._markers(), self.log, "kafka-connect", timeout=30.0)
            self.pid = None


def unique_name(base: str) -> str:
    return f"{base}-{secrets.token_hex(3)}"
