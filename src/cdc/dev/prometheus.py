"""Prometheus beside the dev services and the demo: Debian's ``prometheus`` package, unpacked by
scripts/prometheus.sh (``make install`` runs it) into ``$CDC_CACHE_DIR/prometheus/<version>/`` without
installing anything system-wide, with the project's rules (deploy/observability/cdc-rules.yml).

Only in a checkout: the rules and the script live in the repository, not in the installed package."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import structlog
import yaml

from cdc.dev.cache import cache_dir

log = structlog.get_logger("cdc.dev.prometheus")

REPO = Path(__file__).resolve().parents[3]
OBSERVABILITY = REPO / "deploy" / "observability"


def binaries() -> Path | None:
    """The folder with ``prometheus`` and ``promtool`` scripts/prometheus.sh unpacked, or None."""
    found = sorted((cache_dir() / "prometheus").glob("*/usr/bin/prometheus"))
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A Prometheus scraping ``targets`` as job "cdc" with the project's rules; its data under ``state``."""

    def __init__(self, state: Path, targets: list[str], *, interval: str = "2s") -> None:
        self.state = state
        self.targets = targets
        self.interval = interval
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return binaries() is not None and (OBSERVABILITY / "prometheus.yml").exists()

    def start(self, timeout: float = 60.0, *, detach: bool = False) -> str:
        """Starts it and waits until it is ready; ``detach``: in a session of its own, to outlive this process."""
        bin_dir = binaries()
        if bin_dir is None:
            raise FileNotFoundError("no Prometheus in the cache: run `bash scripts/prometheus.sh` (make install does)")
        self.state.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(OBSERVABILITY / "cdc-rules.yml", self.state / "cdc-rules.yml")
        config: dict[str, Any] = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": self.interval, "evaluation_interval": self.interval}
        config["scrape_configs"][0]["static_configs"] = [{"targets": self.targets}]
        (self.state / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.state / "prometheus.log", "ab") as out:
            self._proc = subprocess.Popen(
                [
                    str(bin_dir / "prometheus"),
                    f"--config.file={self.state / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.state / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=detach,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"prometheus did not start: see {self.state / 'prometheus.log'}") from None
                time.sleep(0.2)
        log.info("prometheus_started", url=self.url, targets=self.targets, pid=self._proc.pid)
        return self.url

    def query(self, expr: str) -> list[Any]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as r:
            return list(json.loads(r.read())["data"]["result"])

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None


# -- beside the dev services (cdc dev up --with-prometheus) --------------------------------------------


_DETACHED: list[subprocess.Popen[bytes]] = []


def _pid_file(state: Path) -> Path:
    return state / "prometheus.json"


def _running(state: Path) -> dict[str, Any] | None:
    try:
        info: dict[str, Any] = json.loads(_pid_file(state).read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    cmdline = Path(f"/proc/{info['pid']}/cmdline")
    if cmdline.exists() and str(state) not in cmdline.read_text(errors="replace"):
        return None  # the pid was reused by another process
    return info


def up(state: Path, targets: list[str]) -> str:
    """Starts (or reuses) a Prometheus of the dev services scraping ``targets``; returns its URL."""
    state = state.resolve()
    found = _running(state)
    if found is not None:
        log.info("prometheus_reused", url=found["url"], pid=found["pid"])
        return str(found["url"])
    server = Prometheus(state, targets)
    url = server.start(detach=True)
    assert server._proc is not None
    _DETACHED.append(server._proc)
    _pid_file(state).write_text(json.dumps({"pid": server._proc.pid, "url": url, "targets": targets}))
    return url


def down(state: Path) -> None:
    state = state.resolve()
    found = _running(state)
    if found is None:
        return
    pid = int(found["pid"])
    mine = next((p for p in _DETACHED if p.pid == pid), None)
    os.kill(pid, signal.SIGTERM)
    if mine is not None:  # started by this process: wait for it (a child is a zombie until reaped)
        mine.wait(30)
        _DETACHED.remove(mine)
    else:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.1)
    _pid_file(state).unlink(missing_ok=True)
    log.info("prometheus_stopped", pid=pid)


def status(state: Path) -> dict[str, Any] | None:
    return _running(state.resolve())
