"""Fixtures for the integration tests: real PostgreSQL and Kafka, started by the project.

By default the services come from `cdc.dev.up()` (local processes, no Docker) in the state
directory `<repo>/.cdc-dev/test` and are left running after the session so the next run starts
in about a second; `CDC_TEST_STOP_SERVICES=1` stops them at the end. When a Docker engine
answers, testcontainers is used instead. Force either with `CDC_TEST_SERVICES=local|docker`.

Per test: `pg_dsn` (a fresh database, dropped afterwards), `slot_name`, `publication_name`,
`topic_prefix` (unique names), `kafka_admin`, and `consume_all(topics, *, timeout)`, which reads
everything currently in the topics from the beginning.

Other environment variables: `CDC_TEST_STATE_DIR` (the local state directory),
`CDC_TEST_REGISTRY=0` (do not start the schema registry), `CDC_TEST_PG=16|17|18` (run the tests against
PostgreSQL 16, 17 or 18 from the binaries cdc.dev.postgres knows, beside the same Kafka; 15 is the default).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import secrets
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest
import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from cdc import dev
from cdc.dev import postgres as dev_postgres
from tests.support.connector import drop_slots

REPO_ROOT = Path(__file__).resolve().parents[2]
log = structlog.get_logger("tests.services")

ConsumeAll = Callable[..., list[Message]]


# --------------------------------------------------------------------------- session services


def _docker_answers() -> bool:
    """Whether a Docker engine answers a ping (without leaving sockets behind when none does)."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False
    try:
        import docker  # type: ignore[import-untyped]  # docker-py ships no type hints
        from docker.errors import DockerException  # type: ignore[import-untyped]  # docker-py ships no type hints
    except ImportError:
        return False
    with warnings.catch_warnings():
        # docker-py leaks the socket of a failed connection; that is not our test's failure.
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (DockerException, OSError):
            return False
        finally:
            gc.collect()


def _service_mode() -> str:
    forced = os.environ.get("CDC_TEST_SERVICES", "").strip().lower()
    if forced in ("local", "docker"):
        return forced
    if forced:
        raise pytest.UsageError(f"CDC_TEST_SERVICES must be 'local' or 'docker', not {forced!r}")
    return "docker" if _docker_answers() else "local"


def _test_state_dir() -> Path:
    env = os.environ.get("CDC_TEST_STATE_DIR")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".cdc-dev" / "test"


def _docker_services(stack: ExitStack) -> dev.Endpoints:
    try:
        from testcontainers.community.kafka import KafkaContainer
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # testcontainers before the community/ split
        from testcontainers.kafka import KafkaContainer
        from testcontainers.postgres import PostgresContainer

    pg = PostgresContainer("postgres:15", username="postgres", password="postgres", dbname="postgres", driver=None)
    pg.with_command(
        "-c wal_level=logical -c max_replication_slots=64 -c max_wal_senders=64 -c max_prepared_transactions=10"
    )
    kafka = KafkaContainer().with_kraft()
    for key, value in {
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_LOG_CLEANER_BACKOFF_MS": "500",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    }.items():
        kafka.with_env(key, value)
    stack.enter_context(pg)
    stack.enter_context(kafka)
    log.info("tests.services.docker", postgres=pg.get_connection_url(), kafka=kafka.get_bootstrap_server())
    return dev.Endpoints(
        postgres_dsn=pg.get_connection_url(),
        kafka_bootstrap=kafka.get_bootstrap_server(),
        schema_registry_url=None,
    )


@pytest.fixture(scope="session")
def services_mode() -> str:
    """'local' (cdc.dev processes) or 'docker' (testcontainers)."""
    return _service_mode()


@pytest.fixture(scope="session")
def dev_state_dir() -> Path:
    """The cdc.dev state directory the local services of the tests live in."""
    return _test_state_dir()


@pytest.fixture(scope="session")
def services(services_mode: str, dev_state_dir: Path) -> Iterator[dev.Endpoints]:
    """The endpoints of the real services, for the whole session."""
    if services_mode == "docker":
        with ExitStack() as stack:
            yield _docker_services(stack)
        return
    state = dev_state_dir
    registry = os.environ.get("CDC_TEST_REGISTRY", "1") != "0"
    endpoints = dev.up(state, registry=registry)
    major = os.environ.get("CDC_TEST_PG", "").strip()
    other: Path | None = None
    if major and major != "15":
        # Another PostgreSQL major version beside the same Kafka: its own state directory (a cluster is
        # bound to the version that made it), the binaries cdc.dev.postgres finds for CDC_PG.
        os.environ["CDC_PG"] = major
        other = state.with_name(f"{state.name}-pg{major}")
        other.mkdir(parents=True, exist_ok=True)
        endpoints = dataclasses.replace(endpoints, postgres_dsn=dev_postgres.up(other, log))
        log.info("tests.services.postgres_version", major=major, dsn=endpoints.postgres_dsn)
    try:
        yield endpoints
    finally:
        if os.environ.get("CDC_TEST_STOP_SERVICES") == "1":
            if other is not None:
                dev_postgres.down(other, log)
            dev.down(state)


# --------------------------------------------------------------------------- names


def _unique(request: pytest.FixtureRequest, max_len: int) -> str:
    """A name from the test's name plus a random suffix, in [a-z0-9_], at most max_len long."""
    base = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower()).strip("_")
    base = re.sub(r"^(test_)+", "", base) or "t"
    suffix = secrets.token_hex(3)
    base = base[: max_len - len(suffix) - 1].rstrip("_")
    name = f"{base}_{suffix}"
    return name if name[0].isalpha() else f"t{name}"[:max_len]


@pytest.fixture
def test_id(request: pytest.FixtureRequest) -> str:
    return _unique(request, 40)


@pytest.fixture
def slot_name(test_id: str) -> str:
    return f"slot_{test_id}"


@pytest.fixture
def publication_name(test_id: str) -> str:
    return f"pub_{test_id}"


@pytest.fixture
def topic_prefix(test_id: str, services: dev.Endpoints) -> Iterator[str]:
    """A unique topic prefix; the test's topics (`<prefix>` and `<prefix>.*`) are deleted afterwards,
    so the long-lived local broker does not pile up topics from run after run."""
    prefix = f"t_{test_id}"
    yield prefix
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    names = [t for t in admin.list_topics(timeout=30).topics if t == prefix or t.startswith(prefix + ".")]
    if names:
        for topic, future in admin.delete_topics(names, operation_timeout=30).items():
            try:
                future.result(timeout=60)
            except KafkaException as exc:
                log.warning("tests.topic_delete_failed", topic=topic, error=str(exc))


# --------------------------------------------------------------------------- postgres


def _with_dbname(dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


def _rollback_prepared(dsn: str, dbname: str) -> None:
    with psycopg.connect(_with_dbname(dsn, dbname), autocommit=True) as conn:
        gids = [row[0] for row in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]
        for gid in gids:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


@pytest.fixture
def pg_dsn(services: dev.Endpoints, test_id: str) -> Iterator[str]:
    """A fresh database for this test (superuser DSN); dropped afterwards with its slots."""
    dbname = f"db_{test_id}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        yield _with_dbname(services.postgres_dsn, dbname)
    finally:
        with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
            drop_slots(admin, dbname)
            if admin.execute("SELECT 1 FROM pg_prepared_xacts WHERE database = %s", (dbname,)).fetchone():
                _rollback_prepared(services.postgres_dsn, dbname)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


# --------------------------------------------------------------------------- kafka


@pytest.fixture
def kafka_admin(services: dev.Endpoints) -> AdminClient:
    return AdminClient({"bootstrap.servers": services.kafka_bootstrap})


@pytest.fixture
def consume_all(services: dev.Endpoints) -> ConsumeAll:
    """`consume_all(topic_or_topics, *, timeout=30.0, isolation="read_committed") -> list[Message]`
    on the session's broker (see `reader_of`)."""
    return reader_of(services.kafka_bootstrap)


def reader_of(bootstrap: str) -> ConsumeAll:
    """`consume_all` for the broker at `bootstrap` (a test's own broker, for one).

    Reads every record now in the topics, from the beginning of each partition up to its end
    as of the call (the high watermark; for read_committed, the last stable offset). Records
    come in partition order; a topic that does not exist yet reads as empty. Raises
    TimeoutError if the end is not reached within `timeout` seconds.
    """

    def _consume(
        topics: str | Sequence[str], *, timeout: float = 30.0, isolation: str = "read_committed"
    ) -> list[Message]:
        names = [topics] if isinstance(topics, str) else list(topics)
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"consume-all-{secrets.token_hex(4)}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "isolation.level": isolation,
            }
        )
        try:
            return _read_to_end(consumer, names, timeout)
        finally:
            consumer.close()

    return _consume


_NOT_READY = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)


def _watermarks(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """A topic the daemon has just created can be in the metadata before its partitions have a leader: the
    broker then answers NOT_LEADER_FOR_PARTITION for a moment. Ask again until the deadline."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic()))
            return low, high
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if not isinstance(err, KafkaError) or err.code() not in _NOT_READY or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _read_to_end(consumer: Consumer, topics: list[str], timeout: float) -> list[Message]:
    deadline = time.monotonic() + timeout
    metadata = consumer.list_topics(timeout=max(1.0, timeout))
    assignment: list[TopicPartition] = []
    pending: set[tuple[str, int]] = set()
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            if meta is not None and meta.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaException(meta.error)
            continue  # not created yet: nothing in it
        for partition in meta.partitions:
            low, high = _watermarks(consumer, TopicPartition(topic, partition), deadline)
            assignment.append(TopicPartition(topic, partition, OFFSET_BEGINNING))
            if high > low:
                pending.add((topic, partition))
    if not pending:
        return []
    consumer.assign(assignment)
    out: list[Message] = []
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"consume_all: did not reach the end of {sorted(pending)} in {timeout}s")
        msg = consumer.poll(min(remaining, 1.0))
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                pending.discard((msg.topic(), msg.partition()))
                continue
            raise KafkaException(err)
        if (msg.topic(), msg.partition()) in pending:
            out.append(msg)
    return out
