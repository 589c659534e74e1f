"""A one-node Apache Kafka 4 (KRaft, combined broker+controller) run from Maven Central jars.

Layout under `<state>/kafka/`: `data/` (log.dirs, incl. the KRaft metadata log),
`server.properties`, `log4j2.properties`, `logs/server.log` (log4j2), `kafka.out`
(stdout/stderr of the JVM), `kafka.pid`, `service.json` (ports and cluster id), `tls/` (a
throw-away CA and server certificate, ``cdc.dev.tls``).

Two client listeners: PLAINTEXT, and SSL (server authentication with the dev CA in
`tls/ca.crt`, a PEM keystore, no keytool) for trying and testing TLS. Without openssl the
broker starts with PLAINTEXT only.
The jars live in `$CDC_CACHE_DIR/kafka/` (default ~/.cache/cdc), shared by every checkout.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from structlog.typing import FilteringBoundLogger

from cdc.dev import _proc, tls
from cdc.dev._proc import DevServiceError

POM = "kafka-pom.xml"
START_TIMEOUT_S = 120.0
HEAP = os.environ.get("CDC_DEV_KAFKA_HEAP", "1g")
NODE_ID = 1


def root_dir(state_dir: Path) -> Path:
    return state_dir / "kafka"


def _pid_file(state_dir: Path) -> Path:
    return root_dir(state_dir) / "kafka.pid"


def _service_file(state_dir: Path) -> Path:
    return root_dir(state_dir) / "service.json"


def _config_file(state_dir: Path) -> Path:
    return root_dir(state_dir) / "server.properties"


def log_files(state_dir: Path) -> list[Path]:
    """stdout/stderr of the JVM (start-up failures land here), then the log4j2 server log."""
    return [root_dir(state_dir) / "kafka.out", root_dir(state_dir) / "logs" / "server.log"]


def _markers(state_dir: Path) -> list[str]:
    return [_proc.exact_arg("kafka.Kafka"), _proc.exact_arg(str(_config_file(state_dir)))]


def version() -> str:
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", _proc.package_text(POM))
    if match is None:
        raise DevServiceError(f"no <kafka.version> in the packaged {POM}")
    return match.group(1)


def jars(log: FilteringBoundLogger) -> Path:
    """The directory holding the Kafka runtime jars, fetched with Maven on first use."""
    libs = _proc.maven_fetch(POM, "kafka", f"kafka-{version()}", log) / "libs"
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise DevServiceError(f"the Kafka jar cache {libs} is incomplete; delete {libs.parent} and retry")
    return libs


def _cluster_id() -> str:
    """A random cluster id in Kafka's form: 16 bytes, URL-safe base64 without padding.

    As Kafka's own ``Uuid.randomUuid()`` does, an id whose text starts with '-' (a first byte of
    0xF8-0xFB, 1 in 64) is drawn again: command-line tools would read it as an option.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def tls_dir(state_dir: Path) -> Path:
    return root_dir(state_dir) / "tls"


def _server_properties(state_dir: Path, broker_port: int, controller_port: int, ssl_port: int | None = None) -> str:
    data = root_dir(state_dir) / "data"
    client_listeners = [f"PLAINTEXT://127.0.0.1:{broker_port}"]
    ssl_settings: dict[str, str | int] = {}
    if ssl_port is not None:
        client_listeners.append(f"SSL://127.0.0.1:{ssl_port}")
        ssl_settings = {
            "listener.name.ssl.ssl.keystore.type": "PEM",
            "listener.name.ssl.ssl.keystore.location": str(tls.ensure(tls_dir(state_dir)).server_pem),
        }
    settings: dict[str, str | int] = {
        "process.roles": "broker,controller",
        "node.id": NODE_ID,
        # A static quorum (kraft.version 0) keeps working if the controller port changes later.
        "controller.quorum.voters": f"{NODE_ID}@127.0.0.1:{controller_port}",
        "listeners": ",".join([*client_listeners, f"CONTROLLER://127.0.0.1:{controller_port}"]),
        "advertised.listeners": ",".join(client_listeners),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:PLAINTEXT",
        **ssl_settings,
        "log.dirs": str(data),
        "num.partitions": 1,
        "default.replication.factor": 1,
        "min.insync.replicas": 1,
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 10,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 10,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": 0,
        "log.cleaner.enable": "true",
        "log.cleaner.backoff.ms": 500,
        "num.recovery.threads.per.data.dir": 1,
        "num.network.threads": 3,
        "num.io.threads": 4,
    }
    body = "".join(f"{key}={value}\n" for key, value in settings.items())
    return "# written by cdc.dev.kafka on every start; edits are lost\n" + body


def _log4j2_properties(state_dir: Path) -> str:
    server_log = root_dir(state_dir) / "logs" / "server.log"
    return f"""# written by cdc.dev.kafka on every start; edits are lost
status = warn
name = cdc-dev-kafka
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = {server_log}
appender.file.filePattern = {server_log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
# Chatty at INFO and of no use here: every client config dump and request log.
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def _java_cmd(java: str, libs: Path, state_dir: Path, *main: str) -> list[str]:
    root = root_dir(state_dir)
    return [
        java,
        f"-Dlog4j2.configurationFile={root / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={root / 'logs'}",
        "-Djava.awt.headless=true",
        "-cp",
        str(libs / "*"),
        *main,
    ]


def _format(java: str, libs: Path, state_dir: Path, cluster_id: str, log: FilteringBoundLogger) -> None:
    data = root_dir(state_dir) / "data"
    if (data / "meta.properties").exists():
        return
    cmd = _java_cmd(
        java,
        libs,
        state_dir,
        "-Xmx256m",
        "kafka.tools.StorageTool",
        "format",
        f"--cluster-id={cluster_id}",
        "-c",
        str(_config_file(state_dir)),
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    if proc.returncode != 0:
        raise DevServiceError(f"Kafka storage format failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    log.info("dev.kafka.formatted", cluster_id=cluster_id, log_dir=str(data))


def _answers(bootstrap: str, broker_port: int) -> bool:
    if not _proc.port_open(broker_port):
        return False
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "socket.timeout.ms": 3000})
    try:
        metadata = admin.list_topics(timeout=3)
    except KafkaException:
        return False
    return NODE_ID in metadata.brokers


def running(state_dir: Path, log: FilteringBoundLogger) -> int | None:
    return _proc.live_pid(_pid_file(state_dir), _markers(state_dir), log, "kafka")


def bootstrap(port: int) -> str:
    return f"127.0.0.1:{port}"


def up(state_dir: Path, log: FilteringBoundLogger) -> str:
    """Start (or reuse) the broker; returns its bootstrap address."""
    state_dir = state_dir.resolve()
    root = root_dir(state_dir)
    service = _proc.read_json(_service_file(state_dir))
    pid = running(state_dir, log)
    want_ssl = tls.available()
    if not want_ssl:
        log.warning("dev.kafka.no_ssl_listener", reason="openssl is not installed", effect="PLAINTEXT only")
    if (
        pid is not None
        and isinstance(service.get("broker_port"), int)
        and (isinstance(service.get("ssl_port"), int) or not want_ssl)
    ):
        port = int(service["broker_port"])
        address = bootstrap(port)
        _proc.wait_ready(
            lambda: _answers(address, port),
            pid=pid,
            markers=_markers(state_dir),
            timeout=START_TIMEOUT_S,
            service="kafka",
            logs=log_files(state_dir),
        )
        log.info("dev.kafka.reused", pid=pid, port=port)
        return address
    if pid is not None:
        # Ours, but we lost track of its ports (or it predates the SSL listener): restart it cleanly.
        _proc.stop_pid(pid, _markers(state_dir), log, "kafka")

    java = _proc.find_java()
    libs = jars(log)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    cluster_id = service.get("cluster_id")
    if not isinstance(cluster_id, str) or not (root / "data" / "meta.properties").exists():
        cluster_id = _cluster_id()
    for attempt in (1, 2):
        saved = service if attempt == 1 else {}
        broker_port = _proc.choose_port(saved.get("broker_port"), log, "kafka")
        controller_port = _proc.choose_port(saved.get("controller_port"), log, "kafka-controller", avoid=[broker_port])
        ssl_port = None
        if want_ssl:
            ssl_port = _proc.choose_port(saved.get("ssl_port"), log, "kafka-ssl", avoid=[broker_port, controller_port])
        try:
            return _start(state_dir, java, libs, cluster_id, broker_port, controller_port, log, ssl_port)
        except DevServiceError as exc:
            if attempt == 2 or not _proc.port_in_use(exc):
                raise
            log.warning("dev.port_taken_retry", service="kafka", port=broker_port, controller_port=controller_port)
    raise AssertionError("unreachable")


def _start(
    state_dir: Path,
    java: str,
    libs: Path,
    cluster_id: str,
    broker_port: int,
    controller_port: int,
    log: FilteringBoundLogger,
    ssl_port: int | None = None,
) -> str:
    root = root_dir(state_dir)
    _config_file(state_dir).write_text(_server_properties(state_dir, broker_port, controller_port, ssl_port))
    (root / "log4j2.properties").write_text(_log4j2_properties(state_dir))
    _proc.write_json(
        _service_file(state_dir),
        {
            "broker_port": broker_port,
            "controller_port": controller_port,
            "ssl_port": ssl_port,
            "cluster_id": cluster_id,
            "version": version(),
        },
    )
    _format(java, libs, state_dir, cluster_id, log)

    started = time.monotonic()
    cmd = _java_cmd(
        java,
        libs,
        state_dir,
        f"-Xmx{HEAP}",
        "-Xms256m",
        "-XX:+ExitOnOutOfMemoryError",
        "kafka.Kafka",
        str(_config_file(state_dir)),
    )
    with log_files(state_dir)[1].open("a") as server_log:  # so that tail() shows this start only
        server_log.write(_proc.start_header(cmd))
    pid = _proc.spawn(cmd, log_file=root / "kafka.out", cwd=root)
    _pid_file(state_dir).write_text(f"{pid}\n")
    address = bootstrap(broker_port)
    try:
        _proc.wait_ready(
            lambda: _answers(address, broker_port),
            pid=pid,
            markers=_markers(state_dir),
            timeout=START_TIMEOUT_S,
            service="kafka",
            logs=log_files(state_dir),
        )
    except DevServiceError:
        _proc.stop_pid(pid, _markers(state_dir), log, "kafka", timeout=10.0)
        _pid_file(state_dir).unlink(missing_ok=True)
        raise
    log.info(
        "dev.kafka.started",
        pid=pid,
        port=broker_port,
        controller_port=controller_port,
        ssl_port=ssl_port,
        version=version(),
        seconds=round(time.monotonic() - started, 1),
    )
    return address


def down(state_dir: Path, log: FilteringBoundLogger) -> None:
    state_dir = state_dir.resolve()
    pid = running(state_dir, log)
    if pid is None:
        return
    _proc.stop_pid(pid, _markers(state_dir), log, "kafka", timeout=60.0)
    _pid_file(state_dir).unlink(missing_ok=True)


def status(state_dir: Path) -> dict[str, Any]:
    state_dir = state_dir.resolve()
    service = _proc.read_json(_service_file(state_dir))
    pid = _proc.peek_pid(_pid_file(state_dir), _markers(state_dir))
    alive = pid is not None
    port = service.get("broker_port")
    ssl_port = service.get("ssl_port")
    ca = tls_dir(state_dir) / "ca.crt"
    return {
        "running": alive,
        "pid": pid if alive else None,
        "port": port if isinstance(port, int) else None,
        "ssl_port": ssl_port if isinstance(ssl_port, int) else None,
        "ssl_ca_location": str(ca) if isinstance(ssl_port, int) and ca.exists() else None,
        "controller_port": service.get("controller_port"),
        "version": service.get("version"),
        "log": str(log_files(state_dir)[1]),
    }
