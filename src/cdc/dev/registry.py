"""Apicurio Registry 3 as a Confluent-compatible schema registry (ccompat API v7).

Maven Central publishes the Quarkus distribution as
`io.apicurio:apicurio-registry-app:<version>:tar.gz:all`; it is fetched with Maven into
`$CDC_CACHE_DIR/registry/` and unpacked there. Storage is an H2 database in files under
`<state>/registry/db/`, so registered schemas survive a restart just as the Kafka topics do.
"""

from __future__ import annotations

import re
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from structlog.typing import FilteringBoundLogger

from cdc.dev import _proc
from cdc.dev._proc import DevServiceError

POM = "registry-pom.xml"
START_TIMEOUT_S = 120.0
HEAP = "512m"
CCOMPAT_PATH = "/apis/ccompat/v7"


class RegistryUnavailable(DevServiceError):
    """No runnable registry could be obtained (as opposed to one that failed to start)."""


def root_dir(state_dir: Path) -> Path:
    return state_dir / "registry"


def _pid_file(state_dir: Path) -> Path:
    return root_dir(state_dir) / "registry.pid"


def _service_file(state_dir: Path) -> Path:
    return root_dir(state_dir) / "service.json"


def log_file(state_dir: Path) -> Path:
    return root_dir(state_dir) / "registry.log"


def _tag(state_dir: Path) -> str:
    # A harmless system property naming the state dir, so we only ever stop our own registry.
    return f"-Dcdc.dev.state={state_dir}"


def _markers(state_dir: Path) -> list[str]:
    return ["apicurio-registry", _proc.exact_arg(_tag(state_dir))]


def version() -> str:
    match = re.search(
        r"<artifactId>apicurio-registry-app</artifactId>\s*<version>([^<]+)</version>", _proc.package_text(POM)
    )
    if match is None:
        raise DevServiceError(f"no apicurio-registry-app version in the packaged {POM}")
    return match.group(1)


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}{CCOMPAT_PATH}"


def _unpack(work: Path) -> None:
    archives = sorted((work / "libs").glob("apicurio-registry-app-*-all.tar.gz"))
    if not archives:
        raise RegistryUnavailable(f"Maven fetched no apicurio-registry-app tar.gz into {work / 'libs'}")
    app = work / "app"
    app.mkdir()
    with tarfile.open(archives[0]) as tar:
        tar.extractall(app, filter="data")
    for archive in archives:
        archive.unlink()


def _launcher(app: Path) -> Path:
    for pattern in ("quarkus-run.jar", "*-runner.jar"):
        found = sorted(app.glob(pattern))
        if found:
            return found[0]
    raise RegistryUnavailable(f"no quarkus-run.jar or *-runner.jar in {app}")


def distribution(log: FilteringBoundLogger) -> Path:
    """The launcher jar of the unpacked registry, fetched on first use."""
    try:
        root = _proc.maven_fetch(
            POM, "registry", f"apicurio-registry-{version()}", log, goal=["dependency:copy"], postprocess=_unpack
        )
    except _proc.FetchError as exc:
        raise RegistryUnavailable(str(exc)) from exc
    return _launcher(root / "app")


def _http_ok(target: str) -> bool:
    try:
        with urllib.request.urlopen(target, timeout=3) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _answers(port: int) -> bool:
    if not _proc.port_open(port):
        return False
    return _http_ok(f"http://127.0.0.1:{port}/health/ready") and _http_ok(url(port) + "/subjects")


def running(state_dir: Path, log: FilteringBoundLogger) -> int | None:
    return _proc.live_pid(_pid_file(state_dir), _markers(state_dir), log, "schema-registry")


def up(state_dir: Path, log: FilteringBoundLogger) -> str:
    """Start (or reuse) the registry; returns its Confluent-compatible base URL.

    Raises RegistryUnavailable when no runnable registry can be fetched; any other
    DevServiceError means it was there but failed to start.
    """
    state_dir = state_dir.resolve()
    service = _proc.read_json(_service_file(state_dir))
    pid = running(state_dir, log)
    if pid is not None and isinstance(service.get("port"), int):
        port = int(service["port"])
        _proc.wait_ready(
            lambda: _answers(port),
            pid=pid,
            markers=_markers(state_dir),
            timeout=START_TIMEOUT_S,
            service="schema-registry",
            logs=[log_file(state_dir)],
        )
        log.info("dev.registry.reused", pid=pid, port=port)
        return url(port)
    if pid is not None:
        _proc.stop_pid(pid, _markers(state_dir), log, "schema-registry")

    java = _proc.find_java()
    major = _proc.java_major_version(java)
    launcher = distribution(log)
    for attempt in (1, 2):
        port = _proc.choose_port(service.get("port") if attempt == 1 else None, log, "schema-registry")
        try:
            return _start(state_dir, java, major, launcher, port, log)
        except DevServiceError as exc:
            if attempt == 2 or not _proc.port_in_use(exc):
                raise
            log.warning("dev.port_taken_retry", service="schema-registry", port=port)
    raise AssertionError("unreachable")


def _start(state_dir: Path, java: str, major: int, launcher: Path, port: int, log: FilteringBoundLogger) -> str:
    root = root_dir(state_dir)
    tmp = root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    (root / "db").mkdir(exist_ok=True)
    _proc.write_json(_service_file(state_dir), {"port": port, "version": version(), "java": major})
    cmd = [
        java,
        _tag(state_dir),
        f"-Xmx{HEAP}",
        "-XX:+ExitOnOutOfMemoryError",
        # Light load, and starting quickly on a 2-core machine matters more than peak speed.
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        f"-Djava.io.tmpdir={tmp}",
        f"-Dvertx.cacheDirBase={tmp / 'vertx'}",
        "-Dquarkus.http.host=127.0.0.1",
        f"-Dquarkus.http.port={port}",
        f"-Dapicurio.datasource.url=jdbc:h2:file:{root / 'db' / 'registry'}",
        f"-Dapicurio.import.work-dir={tmp}",
        f"-Dapicurio.storage.snapshot.location={tmp}",
        "-Dquarkus.http.access-log.enabled=false",
        # Like Confluent's registry: an equivalent schema (other whitespace) is the same schema.
        "-Dapicurio.ccompat.use-canonical-hash=true",
        "-jar",
        str(launcher),
    ]
    started = time.monotonic()
    pid = _proc.spawn(cmd, log_file=log_file(state_dir), cwd=root)
    _pid_file(state_dir).write_text(f"{pid}\n")
    try:
        _proc.wait_ready(
            lambda: _answers(port),
            pid=pid,
            markers=_markers(state_dir),
            timeout=START_TIMEOUT_S,
            service="schema-registry",
            logs=[log_file(state_dir)],
        )
    except DevServiceError:
        _proc.stop_pid(pid, _markers(state_dir), log, "schema-registry", timeout=10.0)
        _pid_file(state_dir).unlink(missing_ok=True)
        raise
    log.info(
        "dev.registry.started", pid=pid, port=port, version=version(), seconds=round(time.monotonic() - started, 1)
    )
    return url(port)


def down(state_dir: Path, log: FilteringBoundLogger) -> None:
    state_dir = state_dir.resolve()
    pid = running(state_dir, log)
    if pid is None:
        return
    _proc.stop_pid(pid, _markers(state_dir), log, "schema-registry", timeout=30.0)
    _pid_file(state_dir).unlink(missing_ok=True)


def status(state_dir: Path) -> dict[str, Any]:
    state_dir = state_dir.resolve()
    service = _proc.read_json(_service_file(state_dir))
    pid = _proc.peek_pid(_pid_file(state_dir), _markers(state_dir))
    alive = pid is not None
    port = service.get("port")
    return {
        "running": alive,
        "pid": pid if alive else None,
        "port": port if isinstance(port, int) else None,
        "version": service.get("version"),
        "log": str(log_file(state_dir)),
    }
