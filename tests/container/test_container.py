"""The daemon's image, built by `make image` and run with podman beside the dev Postgres and Kafka.

Each test runs the real image (`localhost/cdc:local`, built once per session by scripts/image.sh,
from cache when nothing changed) with `--network host`, the configuration mounted read-only and
the root filesystem read-only, as docs/deployment.md tells users to. The password tests use an
extra local Postgres whose pg_hba.conf demands scram-sha-256 over TCP, so a password really is
checked (the session's server trusts every local connection).

Skipped, with the reason, where podman cannot run containers (not root and podman missing, or the
runtime refuses to start one); `CDC_TEST_CONTAINERS=0` skips them on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog

from cdc.dev import postgres as dev_postgres
from tests.support.connector import write_config

pytestmark = [pytest.mark.integration, pytest.mark.container]

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/cdc:local"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
RUN_FLAGS = ["--network", "host", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
SECRET = "c0ntainer-Pa55-never-printed"
SCRAM_HBA = """\
local all all trust
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


def _podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def image() -> str:
    """The daemon's image, built by scripts/image.sh (podman installed first where missing and root)."""
    if os.environ.get("CDC_TEST_CONTAINERS") == "0":
        pytest.skip("CDC_TEST_CONTAINERS=0: container tests switched off")
    if shutil.which("podman") is None and os.geteuid() != 0:
        pytest.skip("podman is not installed and this is not root: apt-get install podman runc debootstrap")
    build = subprocess.run(["bash", "scripts/image.sh"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    if build.returncode != 0:
        if shutil.which("podman") is None:
            pytest.skip(f"podman could not be installed: {build.stderr[-2000:]}")
        pytest.fail(f"make image failed:\n{build.stderr[-6000:]}")
    probe = _podman("run", "--rm", *RUN_FLAGS, "--entrypoint", "true", IMAGE, check=False, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {probe.stderr.strip()[-1000:]}")
    return IMAGE


class Container:
    """One `podman run -d` of the image; removed by cleanup()."""

    def __init__(
        self,
        image: str,
        name: str,
        config: Path,
        *,
        env: dict[str, str] | None = None,
        mounts: list[str] | None = None,
        read_only: bool = True,
    ) -> None:
        self.image, self.name, self.config = image, name, config
        self.env = env or {}
        self.mounts = mounts or []
        self.read_only = read_only

    def start(self) -> Container:
        args = ["run", "-d", "--name", self.name, *RUN_FLAGS, "-v", f"{self.config}:/etc/cdc/cdc.yaml:ro"]
        if self.read_only:
            args += ["--read-only", "--tmpfs", "/tmp"]
        for mount in self.mounts:
            args += ["-v", mount]
        for key in self.env:  # the value comes from podman's environment, never from its command line
            args += ["--env", key]
        args += [self.image, "--log-format", "json", "run", "--config", "/etc/cdc/cdc.yaml"]
        proc = subprocess.run(
            [*PODMAN, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **self.env}
        )
        assert proc.returncode == 0, proc.stderr
        return self

    def logs(self) -> str:
        proc = _podman("logs", self.name, check=False)
        return proc.stdout + proc.stderr

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.logs().splitlines() if line.startswith("{")]

    def running(self) -> bool:
        return _podman("inspect", "--format", "{{.State.Running}}", self.name).stdout.strip() == "true"

    def exit_code(self) -> int:
        return int(_podman("inspect", "--format", "{{.State.ExitCode}}", self.name).stdout.strip())

    def wait_exit(self, timeout: float = 90) -> int:
        _podman("wait", self.name, timeout=timeout)
        return self.exit_code()

    def wait_streaming(self, dsn: str, slot: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                if not self.running():
                    raise AssertionError(f"container exited with {self.exit_code()}:\n{self.logs()}")
                row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
                if row and row[0] and '"replication_started"' in self.logs():
                    return
                time.sleep(0.2)
        raise AssertionError(f"container not streaming after {timeout}s:\n{self.logs()}")

    def http_port(self) -> int:
        for e in self.events():
            if e.get("event") == "http_listening":
                return int(e["port"])
        raise AssertionError(f"no http_listening event:\n{self.logs()}")

    def cleanup(self) -> None:
        _podman("rm", "--force", "--time", "0", self.name, check=False)


@pytest.fixture
def containers(test_id: str) -> Iterator[Any]:
    made: list[Container] = []

    def make(image: str, config: Path, **kw: Any) -> Container:
        c = Container(image, f"cdc-test-{test_id}-{len(made)}".replace("_", "-"), config, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.cleanup()


def _config(
    tmp_path: Path,
    services: Any,
    dsn: str,
    slot: str,
    publication: str,
    prefix: str,
    name: str = "cdc.yaml",
    **extra: Any,
) -> Path:
    path = write_config(
        tmp_path / name,
        source={"dsn": dsn, "slot": slot, "publication": publication, **extra.pop("source", {})},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=prefix,
        status_interval_s=1.0,
        **extra,
    )
    path.chmod(0o644)  # the image's user (10001) reads it through the read-only mount
    return path


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _values(consume_all: Any, topic: str, expect: int, timeout: float = 60) -> list[dict[str, Any] | None]:
    """The values in the topic, once at least `expect` records are there."""
    deadline = time.monotonic() + timeout
    while True:
        msgs = consume_all(topic, timeout=30)
        if len(msgs) >= expect or time.monotonic() > deadline:
            return [json.loads(m.value()) if m.value() is not None else None for m in msgs]
        time.sleep(0.5)


def _ids(values: list[dict[str, Any] | None], op: str) -> set[int]:
    out = set()
    for v in values:
        if v is None:
            continue
        payload = v.get("payload", v)
        if payload.get("op") == op:
            row = payload["before"] if op == "d" else payload["after"]
            out.add(int(row["id"]))
    return out


@pytest.fixture
def items(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    return pg_dsn


# --------------------------------------------------------------------------- the session's Postgres


def test_changes_stream_from_the_container_and_sigterm_exits_0_with_nothing_lost(
    image, containers, tmp_path, services, items, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = _config(tmp_path, services, items, slot_name, publication_name, topic_prefix)
    c = containers(image, cfg).start()
    t0 = time.monotonic()
    c.wait_streaming(items, slot_name)
    structlog.get_logger("test").info("test.container_streaming", seconds=round(time.monotonic() - t0, 2))

    port = c.http_port()
    assert _get(port, "/healthz")[0] == 200
    assert _get(port, "/readyz")[0] == 200
    status, metrics = _get(port, "/metrics")
    assert status == 200 and "cdc_" in metrics

    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 50) g")
        conn.execute("UPDATE items SET name = 'changed' WHERE id <= 10")
        conn.execute("DELETE FROM items WHERE id > 45")
        # Written right before SIGTERM: the daemon must deliver them before it exits.
        conn.execute("INSERT INTO items SELECT g, 'late' FROM generate_series(51, 60) g")
    _podman("stop", "--time", "60", c.name, timeout=90)
    assert c.exit_code() == 0, c.logs()

    values = _values(consume_all, f"{topic_prefix}.public.items", 50 + 10 + 5 + 10)
    assert _ids(values, "c") == set(range(1, 61))
    assert _ids(values, "u") == set(range(1, 11))
    assert _ids(values, "d") == set(range(46, 51))


def test_sigkill_then_a_new_container_on_the_same_slot_loses_nothing(
    image, containers, tmp_path, services, items, slot_name, publication_name, topic_prefix, consume_all
):
    cfg = _config(tmp_path, services, items, slot_name, publication_name, topic_prefix)
    first = containers(image, cfg).start()
    first.wait_streaming(items, slot_name)
    with psycopg.connect(items, autocommit=True) as conn:
        for i in range(1, 201):
            conn.execute("INSERT INTO items VALUES (%s, 'x')", (i,))
    _podman("kill", "--signal", "KILL", first.name)
    assert first.wait_exit() != 0
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 'while down' FROM generate_series(201, 300) g")

    second = containers(image, cfg).start()
    second.wait_streaming(items, slot_name)
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 'after' FROM generate_series(301, 320) g")
    values = _values(consume_all, f"{topic_prefix}.public.items", 320)
    _podman("stop", "--time", "60", second.name, timeout=90)
    assert second.exit_code() == 0, second.logs()
    # At least once: a record may repeat after SIGKILL, none may be missing.
    assert _ids(values, "c") == set(range(1, 321))


def test_read_only_rootfs_spools_a_large_streamed_transaction_to_the_tmpfs(
    image, containers, tmp_path, services, items, slot_name, publication_name, topic_prefix, consume_all
):
    # A tiny logical_decoding_work_mem makes the server stream the transaction before its commit,
    # so the daemon spools it under /tmp, the only writable place in the container.
    dsn = psycopg.conninfo.make_conninfo(items, options="-c logical_decoding_work_mem=64kB")
    cfg = _config(tmp_path, services, dsn, slot_name, publication_name, topic_prefix)
    c = containers(image, cfg).start()
    c.wait_streaming(items, slot_name)
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
    values = _values(consume_all, f"{topic_prefix}.public.items", 5000)
    # Inside the running container: the root is read-only, and the spool directory was made on the tmpfs.
    root = _podman("exec", c.name, "sh", "-c", "touch /opt/cdc/x", check=False)
    spool = _podman("exec", c.name, "sh", "-c", "ls -d /tmp/cdc-spool/*", check=False)
    _podman("stop", "--time", "60", c.name, timeout=90)
    assert c.exit_code() == 0, c.logs()
    assert _ids(values, "c") == set(range(1, 5001))
    assert root.returncode != 0 and "Read-only file system" in root.stderr, root
    assert spool.returncode == 0 and spool.stdout.strip(), (spool, c.logs())


# --------------------------------------------------------------------------- passwords, checked for real


@pytest.fixture(scope="module")
def scram_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(superuser DSN, DSN of role `app` without its password) of a server that checks passwords over TCP."""
    state = tmp_path_factory.mktemp("pg-scram")
    log = structlog.get_logger("test")
    su = dev_postgres.up(state, log)
    try:
        (dev_postgres.data_dir(state) / "pg_hba.conf").write_text(SCRAM_HBA)
        with psycopg.connect(su, autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(f"CREATE ROLE app SUPERUSER LOGIN PASSWORD '{SECRET}'")
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
            conn.execute("SELECT pg_reload_conf()")
        port = psycopg.conninfo.conninfo_to_dict(su)["port"]
        yield su, f"postgresql://app@127.0.0.1:{port}/postgres?sslmode=disable"
    finally:
        dev_postgres.down(state, log)


@pytest.mark.parametrize("how", ["env", "file"])
def test_the_password_from_an_env_var_or_a_mounted_file_connects(
    how, image, containers, tmp_path, services, scram_postgres, slot_name, publication_name, topic_prefix, consume_all
):
    su, app = scram_postgres
    with psycopg.connect(su, autocommit=True) as conn:
        conn.execute("DELETE FROM items")
    if how == "env":
        cfg = _config(tmp_path, services, app, slot_name, publication_name, topic_prefix)
        c = containers(image, cfg, env={"CDC_SOURCE__PASSWORD": SECRET})
    else:
        secret = tmp_path / "pgpass"
        secret.write_text(SECRET + "\n")
        secret.chmod(0o400)
        os.chown(secret, 10001, 10001)  # the image's user, and only it, reads the mounted secret
        cfg = _config(
            tmp_path,
            services,
            app,
            slot_name,
            publication_name,
            topic_prefix,
            source={"password_file": "/run/secrets/pgpass"},
        )
        c = containers(image, cfg, mounts=[f"{secret}:/run/secrets/pgpass:ro"])
    c.start()
    try:
        c.wait_streaming(su, slot_name)
        with psycopg.connect(su, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1, %s)", (how,))
        values = _values(consume_all, f"{topic_prefix}.public.items", 1)
        _podman("stop", "--time", "60", c.name, timeout=90)
        assert c.exit_code() == 0, c.logs()
        assert _ids(values, "c") == {1}
        assert SECRET not in c.logs()
    finally:
        c.cleanup()
        with psycopg.connect(su, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (slot_name,),
            )
            conn.execute(f'DROP PUBLICATION IF EXISTS "{publication_name}"')


def test_a_wrong_password_exits_non_zero_with_a_clear_message_and_no_secret(
    image, containers, tmp_path, services, scram_postgres, slot_name, publication_name, topic_prefix
):
    _, app = scram_postgres
    wrong = "Wr0ng-" + SECRET
    cfg = _config(tmp_path, services, app, slot_name, publication_name, topic_prefix)
    c = containers(image, cfg, env={"CDC_SOURCE__PASSWORD": wrong}).start()
    code = c.wait_exit()
    out = c.logs()
    assert code != 0, out
    assert "password authentication failed" in out, out
    assert wrong not in out and SECRET not in out


# --------------------------------------------------------------------------- the Spark image

# CDC_TEST_SPARK_IMAGE: another tag, so that checkouts with other pyspark pins testing at once do not
# replace each other's image between its build and its runs.
SPARK_IMAGE = os.environ.get("CDC_TEST_SPARK_IMAGE", "localhost/cdc-spark:local")


@pytest.fixture(scope="session")
def spark_image(image: str) -> str:
    """The Spark jobs' image, built by scripts/spark-image.sh (after the daemon's: same base, same checks)."""
    build = subprocess.run(
        ["bash", "scripts/spark-image.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "IMAGE": SPARK_IMAGE},
    )
    if build.returncode != 0:
        pytest.fail(f"make spark-image failed:\n{build.stderr[-6000:]}")
    return SPARK_IMAGE


@pytest.mark.spark
@pytest.mark.timeout(900)  # builds the Spark image first (~2-3 min), then two Spark runs
def test_the_spark_image_rebuilds_the_warehouse_from_what_the_daemon_container_wrote(
    spark_image, image, containers, tmp_path, services, items, slot_name, publication_name, topic_prefix, consume_all
):
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 30) g")
    cfg = _config(tmp_path, services, items, slot_name, publication_name, topic_prefix)
    c = containers(image, cfg).start()
    c.wait_streaming(items, slot_name)
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("UPDATE items SET name = 'changed' WHERE id <= 5")
        conn.execute("DELETE FROM items WHERE id > 25")
    _values(consume_all, f"{topic_prefix}.public.items", 30 + 5 + 5)
    _podman("stop", "--time", "60", c.name, timeout=90)
    assert c.exit_code() == 0, c.logs()

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    os.chown(warehouse, 10001, 10001)  # the Spark image's user writes the Delta tables
    mounts = ["-v", f"{cfg}:/etc/cdc/cdc.yaml:ro", "-v", f"{warehouse}:/data/warehouse"]
    rebuild = _podman(
        "run",
        "--rm",
        *RUN_FLAGS,
        *mounts,
        spark_image,
        "--master",
        "local[1]",
        "/opt/cdc/spark/warehouse.py",
        "--config",
        "/etc/cdc/cdc.yaml",
        "--warehouse",
        "/data/warehouse",
        check=False,
        timeout=600,
    )
    assert rebuild.returncode == 0, rebuild.stdout[-4000:] + rebuild.stderr[-4000:]
    # The project's own check, in the same image: the warehouse equals the database, row for row.
    verify = _podman(
        "run",
        "--rm",
        *RUN_FLAGS,
        *mounts,
        "--entrypoint",
        "python3",
        spark_image,
        "-m",
        "cdc_views",
        "verify",
        "--config",
        "/etc/cdc/cdc.yaml",
        "--warehouse",
        "/data/warehouse",
        check=False,
        timeout=600,
    )
    assert verify.returncode == 0, verify.stdout[-4000:] + verify.stderr[-4000:]
    assert (warehouse / "tables" / "public.items" / "_delta_log").is_dir()
