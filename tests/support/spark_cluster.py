"""A Spark standalone cluster from the installed pyspark distribution: a master and N workers on loopback,
stopped on exit; and what a job's event log says about where its tasks ran.

Used by tests/integration/test_spark_cluster.py (``make test-cluster``) and bench/spark_cluster.py (the
rebuild on one worker against two).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env() -> dict[str, str]:
    """The environment of the cluster's daemons and of spark-submit: this venv's Python on loopback."""
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": PYTHON,
        "PYSPARK_DRIVER_PYTHON": PYTHON,
        "SPARK_NO_DAEMONIZE": "1",
    }


@dataclass(frozen=True)
class Cluster:
    url: str  # spark://127.0.0.1:<port>
    ui: int  # the master's status page; /json/ gives its state
    workers: int
    logs: Path

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=10) as r:
            state: dict[str, Any] = json.loads(r.read())
        return state


def _daemon(stack: ExitStack, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=spark_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    stack.callback(_stop, proc)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


@contextmanager
def standalone_cluster(logs: Path, workers: int, *, cores: int = 1, memory: str = "1g") -> Iterator[Cluster]:
    """A master and ``workers`` workers (``cores`` and ``memory`` each), up when this yields (every worker
    registered with the master), stopped afterwards. Their logs go to ``logs``."""
    logs.mkdir(parents=True, exist_ok=True)
    port, ui = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    with ExitStack() as stack:
        procs = [
            _daemon(
                stack,
                logs / "master.log",
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)),
            )
        ]
        for n in range(1, workers + 1):
            procs.append(
                _daemon(
                    stack,
                    logs / f"worker{n}.log",
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    *("--host", "127.0.0.1", "--cores", str(cores), "--memory", memory),
                    *("--webui-port", str(free_port()), "--work-dir", str(logs / f"work{n}")),
                )
            )
        cluster = Cluster(url, ui, workers, logs)
        deadline = time.monotonic() + 120
        while True:
            try:
                if cluster.state().get("aliveworkers", 0) >= workers:
                    break
            except OSError:
                pass
            dead = [p.args for p in procs if p.poll() is not None]
            assert not dead, f"a cluster daemon exited: {dead}\n" + (logs / "master.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"not all {workers} workers registered with the master in 120 s"
            time.sleep(1)
        yield cluster


def event_log_conf(directory: Path) -> dict[str, str]:
    """Spark settings that make an application write its event log into ``directory``, and wait for all the
    cluster's executors before its first job (else the first stages run on whichever registered first)."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }


def tasks_by_executor(directory: Path) -> list[tuple[str, Counter[str]]]:
    """Per application whose event log is in ``directory`` (its name, in the order they started): the tasks
    each executor ran, by the executor's host and id (``127.0.0.1/0``), from the log's SparkListenerTaskEnd
    events. An application's log is a file, or a folder of files (Spark 4's rolling ``eventlog_v2_<app>``)."""
    out: list[tuple[str, Counter[str]]] = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name.removeprefix("eventlog_v2_")):
        files = sorted(p for p in entry.iterdir() if p.name.startswith("events_")) if entry.is_dir() else [entry]
        name, tasks = entry.name, Counter[str]()
        for line in (line for f in files for line in f.read_text().splitlines()):
            event = json.loads(line)
            if event["Event"] == "SparkListenerApplicationStart":
                name = event["App Name"]
            elif event["Event"] == "SparkListenerTaskEnd":
                info = event["Task Info"]
                tasks[f"{info['Host']}/{info['Executor ID']}"] += 1
        out.append((name, tasks))
    return out
