"""A running daemon's HTTP endpoint, read as an operator does: its port from the log, pages, metric samples."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from tests.support.connector import Connector


def http_port(c: Connector, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in c.log_events():
            if e.get("event") == "http_listening":
                return int(e["port"])
        time.sleep(0.1)
    raise AssertionError(f"no http_listening event:\n{c.output()}")


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The sample of ``name`` with exactly these labels (in any order) in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric_name, _, rest = series.partition("{")
        if metric_name != name:
            continue
        found = dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if part)
        if {k: v.strip('"') for k, v in found.items()} == labels:
            return float(value)
    return None
