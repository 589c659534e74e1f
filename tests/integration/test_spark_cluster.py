"""The jobs on a real cluster: a Spark standalone master and one worker started from the installed pyspark
distribution (loopback only), the rebuild and verify submitted with ``spark-submit --master spark://...``,
declared views included. Marked ``cluster``: ``make test-cluster`` runs it (it takes about two minutes
more than the local-mode tests it repeats)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from cdc import dev
from tests.support.spark import captured_database

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": PYTHON,
        "PYSPARK_DRIVER_PYTHON": PYTHON,
        "SPARK_NO_DAEMONIZE": "1",
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A standalone master and one worker (1 core, 1 GiB), stopped at the end; yields the master URL and
    the port of its status page."""
    logs = tmp_path_factory.mktemp("spark-cluster")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    url = f"spark://127.0.0.1:{port}"
    with open(logs / "master.log", "wb") as out:  # the child keeps its own copy of the descriptor
        master = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with open(logs / "worker.log", "wb") as out:
        worker = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(worker_ui),
                "--work-dir",
                str(logs / "work"),
            ],
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    state = json.loads(r.read())
                if state.get("aliveworkers", 0) >= 1:
                    break
            except OSError:
                pass
            assert master.poll() is None and worker.poll() is None, (logs / "master.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the worker never registered with the master"
            time.sleep(1)
        yield url, ui
    finally:
        for proc in (worker, master):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in (worker, master):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def library(services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    setup = [
        "CREATE TABLE authors (id int PRIMARY KEY, name text NOT NULL)",
        "CREATE TABLE books (isbn text PRIMARY KEY, author_id int, title text, price numeric(12,2))",
    ]
    view = {
        "name": "author_stats",
        "sql": "SELECT a.id AS author_id, a.name, count(b.isbn) AS books, sum(b.price) AS value "
        "FROM public_authors a LEFT JOIN public_books b ON b.author_id = a.id GROUP BY a.id, a.name",
        "key": ["author_id"],
    }
    name = f"cluster_{secrets.token_hex(3)}"
    work = tmp_path_factory.mktemp("cluster-lib")
    with captured_database(
        services, work, name, setup, ["public.authors", "public.books"], spark={"views": [view]}
    ) as db:
        db.run(
            [
                "INSERT INTO authors SELECT i, 'Author ' || i FROM generate_series(1, 20) i",
                "INSERT INTO books SELECT 'isbn-' || i, 1 + i % 20, 'Book ' || i, i * 2.5 FROM generate_series(1, 100) i",
                "DELETE FROM books WHERE isbn = 'isbn-3'",
            ]
        )
        assert db.config is not None
        yield db.config, name


def submit(master: str, job: str, *args: str) -> subprocess.CompletedProcess[str]:
    jars = subprocess.run(
        [PYTHON, str(REPO / "spark" / "cdc_views" / "jars.py"), "submit-args"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    cmd = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master",
        master,
        "--conf",
        "spark.executor.memory=768m",
        *jars,
        str(REPO / "spark" / job),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())


def test_rebuild_and_verify_run_on_a_standalone_cluster(
    cluster: tuple[str, int], library: tuple[Path, str], tmp_path: Path
) -> None:
    master, ui = cluster
    config, _ = library
    warehouse = tmp_path / "wh"
    rebuilt = submit(master, "rebuild.py", "--config", str(config), "--warehouse", str(warehouse))
    assert rebuilt.returncode == 0, rebuilt.stdout[-3000:] + rebuilt.stderr[-6000:]
    summary: dict[str, Any] = json.JSONDecoder().raw_decode(rebuilt.stdout[rebuilt.stdout.index("{\n") :])[0]
    assert summary["view author_stats"] == 20
    verified = submit(master, "verify.py", "--config", str(config), "--warehouse", str(warehouse))
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-6000:]
    assert "view author_stats" in verified.stdout
    with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=10) as r:
        apps = json.loads(r.read())["completedapps"]
    assert len(apps) >= 2 and all(a["state"] == "FINISHED" for a in apps)  # both ran on the cluster's executors
