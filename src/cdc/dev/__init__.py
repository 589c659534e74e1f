"""Real local services for development and tests, started by the project itself.

`up()` brings up PostgreSQL 15 (logical decoding on), a one-node Kafka 4 in KRaft mode and,
when it can be fetched, Apicurio Registry as a Confluent-compatible schema registry. Each runs
as a plain background process with its files under one state directory; nothing needs Docker.
The same state directory may be brought up again and again: running services are reused,
dead ones restarted. `down()` stops only the processes recorded in that state directory, after
checking their command lines.

    from cdc import dev
    endpoints = dev.up(dev.default_state_dir())
    ...
    dev.down(dev.default_state_dir())
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structlog.typing import FilteringBoundLogger

from cdc.dev import _proc, kafka, postgres
from cdc.dev import registry as registry_module
from cdc.dev._proc import DevServiceError
from cdc.dev.cache import file_lock

__all__ = ["DevServiceError", "Endpoints", "default_state_dir", "down", "status", "up"]


@dataclass(frozen=True)
class Endpoints:
    postgres_dsn: str
    kafka_bootstrap: str
    schema_registry_url: str | None
    kafka_ssl_bootstrap: str | None = None  # the broker's SSL listener (security.protocol=SSL)
    kafka_ssl_ca_location: str | None = None  # the CA that signed its certificate (ssl.ca.location)


def default_state_dir() -> Path:
    """$CDC_DEV_STATE, else `.cdc-dev` in the repository (the folder holding pyproject.toml above cwd)."""
    env = os.environ.get("CDC_DEV_STATE")
    if env:
        return Path(env).expanduser().resolve()
    cwd = Path.cwd().resolve()
    for folder in [cwd, *cwd.parents]:
        if (folder / "pyproject.toml").is_file():
            return folder / ".cdc-dev"
    return cwd / ".cdc-dev"


def _prepare(state_dir: Path) -> Path:
    state_dir = state_dir.expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    return state_dir


def up(state_dir: Path, *, registry: bool = True, log: FilteringBoundLogger | None = None) -> Endpoints:
    """Start whatever is not running yet and return the endpoints. Idempotent."""
    log = _proc.logger(log)
    state_dir = _prepare(state_dir)
    started = time.monotonic()
    postgres.check_installed()
    with file_lock(state_dir / ".lock"), ThreadPoolExecutor(max_workers=3, thread_name_prefix="cdc-dev") as pool:
        pg_future = pool.submit(postgres.up, state_dir, log)
        # Fetch the Java artifacts one after the other (Maven's local repository is shared),
        # while PostgreSQL starts; then start the JVMs side by side.
        if kafka.running(state_dir, log) is None:
            _proc.find_java()
            kafka.jars(log)
        want_registry = registry
        if registry and _registry_running(state_dir, log) is None:
            try:
                registry_module.distribution(log)
            except registry_module.RegistryUnavailable as exc:
                log.warning(
                    "dev.registry.unavailable",
                    reason=str(exc).splitlines()[0],
                    detail=str(exc),
                    effect="schema_registry_url is None; Avro with a registry cannot be used",
                )
                want_registry = False
        early = pg_future.exception() if pg_future.done() else None
        if early is not None:
            raise early  # do not start the JVMs for nothing
        kafka_future = pool.submit(kafka.up, state_dir, log)
        registry_future: Future[str] | None = None
        if want_registry:
            registry_future = pool.submit(registry_module.up, state_dir, log)
        futures: list[Future[Any]] = [f for f in (pg_future, kafka_future, registry_future) if f is not None]
        errors = [exc for exc in (f.exception() for f in futures) if exc is not None]
        if errors:
            if len(errors) > 1:
                detail = "\n\n".join(f"{type(e).__name__}: {e}" for e in errors[1:])
                raise DevServiceError(f"{errors[0]}\n\nalso:\n{detail}") from errors[0]
            raise errors[0]
        url = registry_future.result() if registry_future is not None else None
        if url is None and not registry:
            # Not asked for, but report one that is already running.
            pid = _registry_running(state_dir, log)
            port = registry_module.status(state_dir)["port"]
            url = registry_module.url(port) if pid is not None and isinstance(port, int) else None
        kf = kafka.status(state_dir)
        endpoints = Endpoints(
            postgres_dsn=pg_future.result(),
            kafka_bootstrap=kafka_future.result(),
            schema_registry_url=url,
            kafka_ssl_bootstrap=kafka.bootstrap(kf["ssl_port"]) if isinstance(kf["ssl_port"], int) else None,
            kafka_ssl_ca_location=kf["ssl_ca_location"],
        )
    log.info("dev.up", state_dir=str(state_dir), seconds=round(time.monotonic() - started, 1), **endpoints.__dict__)
    return endpoints


def down(state_dir: Path, *, log: FilteringBoundLogger | None = None) -> None:
    """Stop the services recorded in `state_dir` (and only those). Data is kept for the next up()."""
    log = _proc.logger(log)
    state_dir = state_dir.expanduser().resolve()
    if not state_dir.exists():
        return
    with file_lock(state_dir / ".lock"):
        errors: list[DevServiceError] = []
        for stop in (registry_module.down, kafka.down, postgres.down):
            try:
                stop(state_dir, log)
            except DevServiceError as exc:  # keep stopping the others, then report
                errors.append(exc)
        if errors:
            raise DevServiceError("; ".join(str(e) for e in errors))
    log.info("dev.down", state_dir=str(state_dir))


def status(state_dir: Path) -> dict[str, Any]:
    """What runs, on which ports; JSON-able. Starts and stops nothing."""
    state_dir = state_dir.expanduser().resolve()
    pg = postgres.status(state_dir)
    kf = kafka.status(state_dir)
    rg = registry_module.status(state_dir)
    return {
        "state_dir": str(state_dir),
        "postgres_dsn": postgres.dsn(pg["port"]) if isinstance(pg["port"], int) else None,
        "kafka_bootstrap": kafka.bootstrap(kf["port"]) if isinstance(kf["port"], int) else None,
        "kafka_ssl_bootstrap": kafka.bootstrap(kf["ssl_port"]) if isinstance(kf["ssl_port"], int) else None,
        "kafka_ssl_ca_location": kf["ssl_ca_location"],
        "schema_registry_url": registry_module.url(rg["port"])
        if rg["running"] and isinstance(rg["port"], int)
        else None,
        "postgres": pg,
        "kafka": kf,
        "schema_registry": rg,
    }


def _registry_running(state_dir: Path, log: FilteringBoundLogger) -> int | None:
    return registry_module.running(state_dir, log)
