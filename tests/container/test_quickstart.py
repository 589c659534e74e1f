"""The quickstart stack running here: `podman kube play deploy/podman/quickstart.yaml`.

Postgres (Debian's postgresql-15), Kafka and the schema registry (the jars `cdc dev up` fetches) and
the daemon, from images built by `scripts/quickstart.sh images`, in one pod; an insert into the
shop's Postgres arrives in the shop's Kafka topic through the daemon. The test plays a copy of the
manifest that differs only where a shared machine needs it to: its own pod name and no host ports
(two runs, or a developer's own Postgres on 5432, must not collide). Both ends are reached inside
the pod with `podman exec`. Skipped, with the reason, where podman cannot be had or cannot run a
container; `CDC_TEST_CONTAINERS=0` skips it on purpose.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

CONSUME = """
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": "kafka:19092", "group.id": "quickstart-test",
              "auto.offset.reset": "earliest", "enable.auto.commit": False})
c.subscribe([sys.argv[1]])
deadline = time.monotonic() + 90
while time.monotonic() < deadline:
    m = c.poll(1.0)
    if m is not None and not m.error() and m.value() and sys.argv[2].encode() in m.value():
        print(m.value().decode())
        sys.exit(0)
sys.exit(1)
"""


READ_CUSTOMER = """
import sys
from cdc_views.session import build_session
spark = build_session("quickstart-read", master="local[1]")
rows = spark.read.format("delta").load("/data/warehouse/tables/public.customers").where(
    f"email = '{sys.argv[1]}'").collect()
print(len(rows), rows[0]["email"] if rows else "-")
"""


def _run(
    args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env, input=stdin, check=False
    )


@dataclass(frozen=True)
class Pod:
    name: str
    env: dict[str, str]  # scripts/quickstart.sh's environment: the manifest copy, the passwords


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """The pod once its connector streams; the pod and its volumes are removed afterwards."""
    if os.environ.get("CDC_TEST_CONTAINERS") == "0":
        pytest.skip("CDC_TEST_CONTAINERS=0: container tests switched off")
    if shutil.which("podman") is None and os.geteuid() != 0:
        pytest.skip("podman is not installed and this is not root: apt-get install podman runc debootstrap catatonit")
    built = _run(["bash", "scripts/quickstart.sh", "images"], timeout=1800)
    if built.returncode != 0:
        if shutil.which("podman") is None:
            pytest.skip(f"podman could not be installed: {built.stderr[-2000:]}")
        pytest.fail(f"scripts/quickstart.sh images failed:\n{built.stderr[-4000:]}")
    probe = _run(
        [
            *PODMAN,
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "postgres",
            "localhost/cdc-postgres:local",
            "--version",
        ]
    )
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {probe.stderr.strip()[-1000:]}")

    pod = f"cdc-qs-{os.getpid()}"
    manifest = yaml.safe_load((REPO / "deploy/podman/quickstart.yaml").read_text())
    manifest["metadata"]["name"] = pod
    for container in manifest["spec"]["containers"]:
        container.pop("ports", None)
    # podman turns the emptyDir into a named volume: one of this pod's own, removed afterwards.
    for container in manifest["spec"]["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount["name"] == "tmp":
                mount["name"] = f"{pod}-tmp"
    for volume in manifest["spec"]["volumes"]:
        if volume["name"] == "tmp":
            volume["name"] = f"{pod}-tmp"
        if "hostPath" in volume:
            volume["hostPath"]["path"] = str(REPO / volume["hostPath"]["path"])
    copy = tmp_path_factory.mktemp("quickstart") / "pod.yaml"
    copy.write_text(yaml.safe_dump(manifest))
    env = {
        **os.environ,
        "MANIFEST": str(copy),
        "POD": pod,
        "POSTGRES_PASSWORD": secrets.token_hex(12),
        "CDC_DB_PASSWORD": secrets.token_hex(12),
        "REGISTRY_DB_PASSWORD": secrets.token_hex(12),
    }
    started = time.monotonic()
    played = _run(["bash", "scripts/quickstart.sh", "play"], env=env, timeout=300)
    try:
        assert played.returncode == 0, f"kube play failed:\n{played.stderr[-4000:]}"
        deadline = time.monotonic() + 240
        logs = ""
        while time.monotonic() < deadline:
            got = _run([*PODMAN, "logs", f"{pod}-connector"])
            logs = got.stdout + got.stderr  # the daemon logs to stderr
            if '"event": "replication_started"' in logs:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the connector did not start streaming in 240 s; its log ends:\n{logs[-4000:]}")
        print(f"quickstart: pod played to connector streaming in {time.monotonic() - started:.1f} s")
        yield Pod(pod, env)
    finally:
        _run(["bash", "scripts/quickstart.sh", "down"], env=env, timeout=180)
        _run([*PODMAN, "volume", "rm", "--force", f"{pod}-tmp", f"{pod}-warehouse"])


def _insert_customer(pod: Pod) -> str:
    email = f"{secrets.token_hex(6)}@quickstart.test"
    insert = _run(
        [
            *PODMAN,
            "exec",
            f"{pod.name}-postgres",
            "psql",
            "-v",
            "ON_ERROR_STOP=1",
            "-U",
            "postgres",
            "-d",
            "shop",
            "-qc",
            f"SET ROLE shop_owner; INSERT INTO customers (name, email) VALUES ('Quick Start', '{email}')",
        ]
    )
    assert insert.returncode == 0, insert.stderr
    return email


def _event(pod: Pod, email: str) -> dict[str, Any]:
    got = _run(
        [*PODMAN, "exec", "-i", f"{pod.name}-connector", "python3", "-", "shop.public.customers", email],
        stdin=CONSUME,
        timeout=150,
    )
    assert got.returncode == 0, f"no event for {email} in shop.public.customers: {got.stderr[-2000:]}"
    event: dict[str, Any] = json.loads(got.stdout.strip().splitlines()[-1])
    return event


def test_an_insert_into_the_quickstart_postgres_arrives_in_its_kafka_topic(quickstart: Pod) -> None:
    email = _insert_customer(quickstart)
    event = _event(quickstart, email)
    assert event["op"] == "c"
    assert event["after"]["email"] == email
    assert event["source"]["table"] == "customers"


@pytest.mark.spark
def test_the_spark_job_in_the_pod_rebuilds_the_warehouse_with_the_last_insert(quickstart: Pod) -> None:
    """`make quickstart-spark`: the warehouse rebuild in the pod; the row inserted last is in it."""
    email = _insert_customer(quickstart)
    _event(quickstart, email)  # in Kafka before the job reads from offset 0
    started = time.monotonic()
    rebuild = _run(["bash", "scripts/quickstart.sh", "spark"], env=quickstart.env, timeout=1200)
    assert rebuild.returncode == 0, rebuild.stdout[-4000:] + rebuild.stderr[-4000:]
    print(f"quickstart: spark rebuild (with the Spark image's build if missing) {time.monotonic() - started:.1f} s")
    # The customer inserted last is in the warehouse's Delta table, read in the same image. (The jobs'
    # verify in the Spark image runs in test_container.py; here one Spark start less keeps the suite short.)
    read = _run(
        ["bash", "scripts/quickstart.sh", "spark", "-c", READ_CUSTOMER, email],
        env={**quickstart.env, "ENTRYPOINT": "python3"},
        timeout=600,
    )
    assert read.returncode == 0, read.stdout[-4000:] + read.stderr[-4000:]
    assert read.stdout.strip().splitlines()[-1] == f"1 {email}"
