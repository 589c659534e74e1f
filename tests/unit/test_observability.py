"""deploy/observability/ against the real tools (#40): promtool checks the scrape configuration and the
rules, and its rule unit tests make every alert fire on a series that should fire it and stay silent on
one that should not; the dashboard and the PrometheusRule are what generate.py makes; every metric a
rule or a panel names is one the daemon serves."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.support.prometheus import OBSERVABILITY, ROOT, binary

RULES = OBSERVABILITY / "cdc-rules.yml"
RULES_TEST = OBSERVABILITY / "cdc-rules.test.yml"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"

PROMQL_WORDS = {
    "sum",
    "by",
    "rate",
    "increase",
    "min",
    "max",
    "and",
    "or",
    "on",
    "unless",
    "histogram_quantile",
    "predict_linear",
    "changes",
    "min_over_time",
    "absent",
    "bool",
    "without",
    "ignoring",
    "group_left",
    "group_right",
    "le",
    "count",
    "up",
    "inf",
    "nan",
    "offset",
    "avg",
    "deriv",
}


def _generate() -> ModuleType:
    sys.path.insert(0, str(OBSERVABILITY))
    try:
        return importlib.import_module("generate")
    finally:
        sys.path.remove(str(OBSERVABILITY))


def alerts() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def panel_exprs() -> list[tuple[str, str]]:
    d = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in d["panels"] if p["type"] != "row" for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not its labels, functions, keywords or strings)."""
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"\d+|[eE]\d+", n)}


def test_promtool_checks_the_scrape_configuration(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(binary("promtool")), "check", "config", str(OBSERVABILITY / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


@pytest.mark.parametrize("rules", [RULES, ROOT / "deploy" / "k8s" / "monitoring" / "prometheusrule.yaml"])
def test_promtool_checks_the_rules(rules: Path, tmp_path: Path) -> None:
    if rules.name == "prometheusrule.yaml":  # the operator's wrapper around the same groups
        path = tmp_path / "groups.yml"
        path.write_text(yaml.safe_dump({"groups": yaml.safe_load(rules.read_text())["spec"]["groups"]}))
        rules = path
    proc = subprocess.run(
        [str(binary("promtool")), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_rule_tests_pass(tmp_path: Path) -> None:
    tests = _generate().strip_annotations(tmp_path)
    proc = subprocess.run(
        [str(binary("promtool")), "test", "rules", str(tests)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_rule_test_that_fires_it_and_one_that_keeps_it_silent() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for t in case["alert_rule_test"]:
            (fired if t["exp_alerts"] else silent).add(t["alertname"])
    names = set(alerts())
    assert names - fired == set(), "alerts no test fires"
    assert names - silent == set(), "alerts no test keeps silent"
    for must in (
        "CdcDown",
        "CdcReplicationStreamDown",
        "CdcSlotNearInvalidation",
        "CdcSlotWalGrowthPredictsInvalidation",
        "CdcSlotInvalidated",
        "CdcSourceLagHigh",
        "CdcDeliveryErrors",
        "CdcDeadLetters",
        "CdcQueuePinned",
        "CdcMainLoopStalled",
        "CdcSnapshotStalled",
        "CdcFailoverNotReady",
        "CdcDeliveryStalled",
    ):
        assert must in names


def test_every_alert_has_a_summary_a_description_with_the_first_command_and_a_severity() -> None:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
            assert "cdc status" in rule["annotations"]["description"], rule["alert"]
            assert "Likely cause" in rule["annotations"]["description"], rule["alert"]


def test_the_committed_dashboard_and_prometheus_rule_are_what_generate_py_makes() -> None:
    proc = subprocess.run(
        [sys.executable, str(OBSERVABILITY / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_dashboard_has_its_rows_a_datasource_and_a_table_variable() -> None:
    d = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == [
        "Overview",
        "Per table",
        "Snapshots",
        "Delivery and queue",
        "Errors and dead letters",
        "Failover",
        "Process",
    ]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["table"]["type"] == "query" and "table" in variables["table"]["query"]
    for p in d["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
    per_table = [expr for title, expr in panel_exprs() if "cdc_events_total" in expr or "cdc_snapshot_table" in expr]
    assert per_table and all('table=~"$table"' in e for e in per_table)


def test_every_metric_a_rule_or_a_panel_names_is_one_the_daemon_serves_or_a_recording_rule() -> None:
    """A misspelt name would leave a panel blank or an alert silent forever; the integration test sees
    them with data, this one catches it without any service."""
    from prometheus_client import generate_latest

    from cdc.observe import HttpEndpoint, SlotReading, Stats

    stats = Stats(slot=lambda: SlotReading(0, "reserved", 1), last_server_message=lambda: 0.0, streaming=True)
    endpoint = HttpEndpoint(stats, "127.0.0.1", 0)
    endpoint.start()
    try:
        text = generate_latest(endpoint.registry).decode()
    finally:
        endpoint.stop()
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M):  # families with no series yet too
        names.add(name if kind != "counter" or name.endswith("_total") else f"{name}_total")
    names |= {"cdc_slot_failover_ready", "cdc_slot_standby_behind_bytes"}  # with a multi-host DSN (observe.py)
    names |= {"cdc_events_total", "cdc_snapshot_rows_total"}
    names |= {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r}
    names |= {"up"}
    used = {n: e for e in [*rule_exprs(), *(e for _, e in panel_exprs())] for n in metric_names(e)}
    unknown = {n: e for n, e in used.items() if n not in names}
    assert not unknown, f"expressions name metrics the daemon does not serve: {unknown}"


# -- provisioning: compose and Kubernetes -------------------------------------------------------


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text()))


def test_compose_provisions_prometheus_with_the_rules_and_grafana_with_the_dashboard() -> None:
    services = _compose()["services"]
    prom, grafana = services["prometheus"], services["grafana"]
    assert prom["profiles"] == grafana["profiles"] == ["observability"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in [*prom["volumes"], *grafana["volumes"]] if v.startswith("./")}
    for source in mounts:
        assert (ROOT / "deploy" / source).exists(), source
    assert mounts["./observability/cdc-rules.yml"] == "/etc/prometheus/cdc-rules.yml"
    assert mounts["./observability/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    provider = yaml.safe_load((OBSERVABILITY / "grafana/provisioning/dashboards/cdc.yml").read_text())["providers"][0]
    assert Path(mounts["./observability/grafana-dashboard.json"]).parent == Path(provider["options"]["path"])
    scrape = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    assert scrape["rule_files"] == ["cdc-rules.yml"]
    job = scrape["scrape_configs"][0]
    assert job["job_name"] == "cdc"  # the rules select job="cdc"
    host, port = job["static_configs"][0]["targets"][0].split(":")
    assert host in services and services[host]["ports"][0].endswith(f":{port}")


def test_the_kubernetes_monitoring_kustomization_has_a_service_monitor_a_prometheus_rule_and_the_dashboard() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    proc = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy" / "k8s" / "monitoring")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(proc.stdout) if d}
    assert sorted(docs) == ["ConfigMap", "PrometheusRule", "ServiceMonitor"]
    service = yaml.safe_load((ROOT / "deploy" / "k8s" / "service.yaml").read_text())
    monitor = docs["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert service["metadata"]["name"] == "cdc"  # the operator's job label: the rules select job="cdc"
    assert docs["PrometheusRule"]["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    dashboard = docs["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["cdc.json"]) == json.loads(DASHBOARD.read_text())


def test_the_operations_guide_lists_every_alert() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    missing = [name for name in alerts() if f"| `{name}` |" not in guide]
    assert not missing, f"docs/operations.md does not list these alerts: {missing}"


def test_dev_prometheus_scrapes_the_daemons_endpoint_with_the_rules_and_stops(tmp_path: Path) -> None:
    """`cdc dev up --with-prometheus`: Prometheus from the cache, detached, scraping an HTTP endpoint of the
    daemon's own kind; `cdc dev down` stops it by its pid."""
    import time
    import urllib.parse
    import urllib.request

    from cdc.dev import prometheus
    from cdc.observe import HttpEndpoint, Stats

    binary("prometheus")  # fetched into the cache (or skipped off Debian)
    endpoint = HttpEndpoint(Stats(streaming=True, starting=False), "127.0.0.1", 0)
    endpoint.start()
    state = tmp_path / "prometheus"
    try:
        url = prometheus.up(state, [f"127.0.0.1:{endpoint.port}"])
        assert prometheus.up(state, ["ignored:1"]) == url  # reused
        status = prometheus.status(state)
        assert status is not None
        pid = status["pid"]
        deadline = time.monotonic() + 30
        result: list[Any] = []
        while not result and time.monotonic() < deadline:
            query = urllib.parse.urlencode({"query": 'cdc_streaming{job="cdc"} == 1'})
            with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as r:
                result = json.loads(r.read())["data"]["result"]
            time.sleep(0.5)
        assert result, "Prometheus did not scrape the endpoint"
        with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=5) as r:
            rules = json.loads(r.read())["data"]["groups"]
        assert {g["name"] for g in rules} == {"cdc.recording", "cdc.alerts"}
    finally:
        prometheus.down(state)
        endpoint.stop()
    assert prometheus.status(state) is None
    assert not Path(f"/proc/{pid}").exists() or "prometheus" not in Path(f"/proc/{pid}/cmdline").read_text(
        errors="replace"
    )
