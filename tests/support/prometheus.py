"""Prometheus and promtool from Debian's `prometheus` package, unpacked into the project's cache by
scripts/prometheus.sh (apt-get download + dpkg-deb -x: nothing is installed system-wide); a Prometheus
server of a test's own, scraping what the test gives it, queried through its HTTP API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "deploy" / "observability"


@cache
def _bin_dir() -> Path | None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "prometheus.sh")], capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/prometheus.sh failed:\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


def binary(name: str) -> Path:
    """``promtool`` or ``prometheus``; skips the test where apt and dpkg are not there (not Debian)."""
    found = _bin_dir()
    if found is None:
        pytest.skip("apt-get and dpkg-deb are needed to fetch Debian's prometheus package")
    return found / name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result = data["result"]
        return result if isinstance(result, list) else [result]

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def reload(self) -> None:
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=30):
            pass


@contextmanager
def running(work: Path, targets: list[str], *, interval: str = "1s") -> Iterator[Prometheus]:
    """A Prometheus of its own scraping ``targets`` (host:port) as job "cdc" every ``interval``, with the
    project's rules (evaluated every ``interval``), its storage under ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(OBSERVABILITY / "cdc-rules.yml", work / "cdc-rules.yml")
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
    config["scrape_configs"][0]["static_configs"] = [{"targets": targets}]
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            str(binary("prometheus")),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prometheus(port)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"prometheus did not start:\n{(work / 'prometheus.log').read_text()}"
                    ) from None
                time.sleep(0.2)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
