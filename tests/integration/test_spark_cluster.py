"""The jobs on a real cluster: a Spark standalone master and two workers started from the installed pyspark
distribution (loopback only, one core each), the rebuild and verify submitted with ``spark-submit --master
spark://...``, declared views included; the rebuild's event log shows its tasks ran on both workers'
executors. Marked ``cluster``: ``make test-cluster`` runs it (it takes about two minutes more than the
local-mode tests it repeats; 1 passed in 692 s at load ~20, 2026-12-02, tasks 23/22 on the two executors).
bench/spark_cluster.py times the rebuild on one worker against two.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc import dev
from tests.support.spark import captured_database
from tests.support.spark_cluster import (
    PYTHON,
    SPARK_HOME,
    Cluster,
    event_log_conf,
    spark_env,
    standalone_cluster,
    tasks_by_executor,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master and two workers (1 core, 1 GiB each), stopped at the end."""
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), WORKERS) as cluster:
        yield cluster


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
                "INSERT INTO books SELECT 'isbn-' || i, 1 + i % 20, 'Book ' || i, i * 2.5 FROM generate_series(1, "
                "100) i",
                "DELETE FROM books WHERE isbn = 'isbn-3'",
            ]
        )
        assert db.config is not None
        yield db.config, name


def submit(master: str, job: str, *args: str, conf: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
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
        *[arg for key, value in (conf or {}).items() for arg in ("--conf", f"{key}={value}")],
        *jars,
        str(REPO / "spark" / job),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=840, env=spark_env())  # ~90 s on an idle machine


def test_rebuild_and_verify_run_on_a_standalone_cluster_across_both_workers(
    cluster: Cluster, library: tuple[Path, str], tmp_path: Path
) -> None:
    config, _ = library
    warehouse, events = tmp_path / "wh", tmp_path / "events"
    rebuilt = submit(
        cluster.url, "rebuild.py", "--config", str(config), "--warehouse", str(warehouse), conf=event_log_conf(events)
    )
    assert rebuilt.returncode == 0, rebuilt.stdout[-3000:] + rebuilt.stderr[-6000:]
    summary: dict[str, Any] = json.JSONDecoder().raw_decode(rebuilt.stdout[rebuilt.stdout.index("{\n") :])[0]
    assert summary["view author_stats"] == 20
    # the rebuild's tasks ran on an executor of each worker (the event log names each task's executor)
    [(_, tasks)] = tasks_by_executor(events)
    assert len(tasks) == WORKERS and all(n > 0 for n in tasks.values()), tasks
    state = cluster.state()
    assert len(state["workers"]) == WORKERS and all(w["state"] == "ALIVE" for w in state["workers"])

    verified = submit(cluster.url, "verify.py", "--config", str(config), "--warehouse", str(warehouse))
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-6000:]
    assert "view author_stats" in verified.stdout
    apps = cluster.state()["completedapps"]
    assert len(apps) >= 2 and all(a["state"] == "FINISHED" for a in apps)  # both ran on the cluster's executors
