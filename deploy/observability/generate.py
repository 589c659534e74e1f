"""Generates what deploy/observability/ and deploy/k8s/monitoring/ ship from one source each:

- ``grafana-dashboard.json``: the Grafana dashboard, written as code with Grafana's ``grafana-foundation-sdk``
  (its typed builders keep the JSON in Grafana's schema);
- ``deploy/k8s/monitoring/prometheusrule.yaml``: cdc-rules.yml as a Prometheus operator PrometheusRule,
  and a copy of the dashboard beside it for the ConfigMap kustomize makes there.

    python deploy/observability/generate.py                    # write both
    python deploy/observability/generate.py --check            # exit 1 when a committed file is not current
    python deploy/observability/generate.py --strip-annotations DIR   # cdc-rules.yml without annotations
                                                               # and cdc-rules.test.yml, for promtool test rules

tests/unit/test_observability.py checks that the committed files are current.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.common import BigValueGraphMode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DASHBOARD = HERE / "grafana-dashboard.json"
RULES = HERE / "cdc-rules.yml"
RULES_TEST = HERE / "cdc-rules.test.yml"
PROMETHEUS_RULE = ROOT / "deploy" / "k8s" / "monitoring" / "prometheusrule.yaml"
K8S_DASHBOARD = ROOT / "deploy" / "k8s" / "monitoring" / "grafana-dashboard.json"  # kustomize reads files below it only

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
INST = 'instance=~"$instance"'  # every query is filtered by the instance variable
T = 'table=~"$table"'  # per-table queries by the table variable

# (row title, [(panel title, kind, unit, [(expr, legend)], description)])
Panel = tuple[str, str, str, list[tuple[str, str]], str]
ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Overview",
        [
            (
                "Daemon up",
                "stat",
                "none",
                [(f'up{{job="cdc",{INST}}}', "{{instance}}")],
                "1 while Prometheus scrapes the daemon",
            ),
            (
                "Streaming",
                "stat",
                "none",
                [(f"cdc_streaming{{{INST}}}", "{{instance}}")],
                "1 while the replication stream runs",
            ),
            (
                "Starting",
                "stat",
                "none",
                [(f"cdc_starting{{{INST}}}", "{{instance}}")],
                "1 during start-up and the initial snapshot",
            ),
            (
                "Slot lag",
                "timeseries",
                "bytes",
                [(f"cdc_slot_lag_bytes{{{INST}}}", "{{instance}}")],
                "WAL the server retains for the slot",
            ),
            (
                "Source lag",
                "timeseries",
                "s",
                [(f"cdc_source_lag_seconds{{{INST}}}", "{{instance}}")],
                "commit to processing, last transaction",
            ),
            (
                "Events per second",
                "timeseries",
                "ops",
                [(f"sum by (instance) (cdc:events:rate5m{{{INST}}})", "{{instance}}")],
                "change events published",
            ),
            (
                "WAL left before invalidation",
                "timeseries",
                "bytes",
                [(f"cdc_slot_safe_wal_size_bytes{{{INST}}}", "{{instance}} safe_wal_size")],
                "pg_replication_slots.safe_wal_size (empty when max_slot_wal_keep_size is -1)",
            ),
            (
                "WAL left, share",
                "stat",
                "percentunit",
                [(f"cdc:slot_wal_left:ratio{{{INST}}}", "{{instance}}")],
                "safe_wal_size of what the server keeps for the slot",
            ),
            (
                "Slot wal_status",
                "stat",
                "none",
                [(f"cdc_slot_wal_status{{{INST}}} == 1", "{{status}}")],
                "reserved, extended, unreserved, lost",
            ),
            (
                "Since the server's last message",
                "timeseries",
                "s",
                [(f"cdc_server_message_age_seconds{{{INST}}}", "{{instance}}")],
                "keepalives come every wal_sender_timeout/2",
            ),
        ],
    ),
    (
        "Per table",
        [
            (
                "Events per second by table",
                "timeseries",
                "ops",
                [(f"sum by (table, op) (rate(cdc_events_total{{{INST},{T}}}[$__rate_interval]))", "{{table}} {{op}}")],
                "",
            ),
            (
                "Events in the last hour",
                "stat",
                "short",
                [(f"sum by (table) (increase(cdc_events_total{{{INST},{T}}}[1h]))", "{{table}}")],
                "",
            ),
            (
                "Transaction size",
                "timeseries",
                "short",
                [
                    (f"cdc:transaction_events:p99_5m{{{INST}}}", "p99 {{instance}}"),
                    (
                        "histogram_quantile(0.5, sum by (instance, le) "
                        f"(rate(cdc_transaction_events_bucket{{{INST}}}[$__rate_interval])))",
                        "p50 {{instance}}",
                    ),
                ],
                "events per source transaction",
            ),
            (
                "Transactions per second",
                "timeseries",
                "ops",
                [
                    (
                        f"sum by (instance) (rate(cdc_transaction_events_count{{{INST}}}[$__rate_interval]))",
                        "{{instance}}",
                    )
                ],
                "",
            ),
        ],
    ),
    (
        "Snapshots",
        [
            (
                "Rows copied",
                "timeseries",
                "short",
                [
                    (f"cdc_snapshot_table_rows{{{INST},{T}}}", "{{kind}} {{table}}"),
                    (f"cdc_snapshot_table_rows_estimated{{{INST},{T}}}", "{{kind}} {{table}} estimated"),
                ],
                "rows done and pg_class's estimate",
            ),
            (
                "Done",
                "stat",
                "percentunit",
                [(f"cdc:snapshot_table_done:ratio{{{INST},{T}}}", "{{kind}} {{table}}")],
                "rows done of the estimate",
            ),
            (
                "Chunks",
                "timeseries",
                "short",
                [
                    (f"cdc_snapshot_table_chunks{{{INST},{T}}}", "{{kind}} {{table}}"),
                    (f"cdc_snapshot_table_chunks_planned{{{INST},{T}}}", "{{kind}} {{table}} planned"),
                ],
                "",
            ),
            (
                "Snapshot rows per second",
                "timeseries",
                "ops",
                [(f"sum by (table) (rate(cdc_snapshot_rows_total{{{INST},{T}}}[$__rate_interval]))", "{{table}}")],
                "",
            ),
            ("Running", "stat", "none", [(f"cdc_snapshot_running{{{INST}}}", "{{kind}}")], ""),
            (
                "Rate and ETA",
                "timeseries",
                "short",
                [
                    (f"cdc_snapshot_rows_per_second{{{INST}}}", "{{kind}} rows/s"),
                    (f"cdc_snapshot_eta_seconds{{{INST}}}", "{{kind}} seconds left"),
                ],
                "",
            ),
        ],
    ),
    (
        "Delivery and queue",
        [
            (
                "Queue",
                "timeseries",
                "bytes",
                [
                    (f"cdc_queue_bytes{{{INST}}}", "{{instance}} in flight"),
                    (f"cdc_queue_limit_bytes{{{INST}}}", "{{instance}} limits.max_inflight_bytes"),
                ],
                "",
            ),
            ("Queue fill", "stat", "percentunit", [(f"cdc:queue_fill:ratio{{{INST}}}", "{{instance}}")], ""),
            ("Records in flight", "timeseries", "short", [(f"cdc_inflight_records{{{INST}}}", "{{instance}}")], ""),
            (
                "Backpressure",
                "timeseries",
                "percentunit",
                [(f"rate(cdc_backpressure_seconds_total{{{INST}}}[$__rate_interval])", "{{instance}}")],
                "share of the time the loop waited on Kafka",
            ),
            (
                "Kafka requests and retries",
                "timeseries",
                "reqps",
                [
                    (
                        f"sum by (broker) (rate(cdc_kafka_requests_total{{{INST}}}[$__rate_interval]))",
                        "broker {{broker}} requests",
                    ),
                    (
                        f"sum by (broker) (rate(cdc_kafka_request_retries_total{{{INST}}}[$__rate_interval]))",
                        "broker {{broker}} retries",
                    ),
                ],
                "librdkafka's statistics",
            ),
            (
                "Broker round trip",
                "timeseries",
                "s",
                [(f"cdc_kafka_broker_rtt_seconds{{{INST}}}", "broker {{broker}} q{{quantile}}")],
                "",
            ),
            ("Brokers up", "stat", "none", [(f"cdc_kafka_broker_up{{{INST}}}", "broker {{broker}}")], ""),
            (
                "Batches",
                "timeseries",
                "short",
                [
                    (f"rate(cdc_kafka_batches_total{{{INST}}}[$__rate_interval])", "{{instance}} batches/s"),
                    (f"cdc:kafka_batch_bytes:mean5m{{{INST}}}", "{{instance}} mean batch bytes"),
                ],
                "",
            ),
            (
                "Confirmed LSN moves",
                "timeseries",
                "Bps",
                [(f"deriv(cdc_confirmed_lsn{{{INST}}}[$__rate_interval])", "{{instance}}")],
                "WAL bytes per second confirmed to Postgres",
            ),
        ],
    ),
    (
        "Errors and dead letters",
        [
            (
                "Delivery errors",
                "stat",
                "short",
                [(f"increase(cdc_delivery_errors_total{{{INST}}}[1h])", "{{instance}}")],
                "each stops the pipeline",
            ),
            (
                "Dead letters",
                "stat",
                "short",
                [(f"increase(cdc_dead_letters_total{{{INST}}}[1h])", "{{instance}}")],
                "records sent to limits.dead_letter_topic",
            ),
            (
                "Kafka request errors and timeouts",
                "timeseries",
                "reqps",
                [
                    (
                        f"sum by (broker) (rate(cdc_kafka_request_errors_total{{{INST}}}[$__rate_interval]))",
                        "broker {{broker}} errors",
                    ),
                    (
                        f"sum by (broker) (rate(cdc_kafka_request_timeouts_total{{{INST}}}[$__rate_interval]))",
                        "broker {{broker}} timeouts",
                    ),
                ],
                "",
            ),
        ],
    ),
    (
        "Failover",
        [
            (
                "Standby ready",
                "stat",
                "none",
                [(f"cdc_slot_failover_ready{{{INST}}}", "{{host}}")],
                "a synchronized, persistent copy of the slot (multi-host DSN)",
            ),
            ("Standby behind", "timeseries", "bytes", [(f"cdc_slot_standby_behind_bytes{{{INST}}}", "{{host}}")], ""),
        ],
    ),
    (
        "Process",
        [
            (
                "Resident memory",
                "timeseries",
                "bytes",
                [(f'process_resident_memory_bytes{{job="cdc",{INST}}}', "{{instance}}")],
                "",
            ),
            (
                "CPU",
                "timeseries",
                "percentunit",
                [(f'rate(process_cpu_seconds_total{{job="cdc",{INST}}}[$__rate_interval])', "{{instance}}")],
                "cores used by the main process",
            ),
            (
                "Open file descriptors",
                "timeseries",
                "short",
                [(f'process_open_fds{{job="cdc",{INST}}}', "{{instance}}")],
                "",
            ),
            (
                "Main loop heartbeat age",
                "timeseries",
                "s",
                [(f"cdc_main_loop_heartbeat_age_seconds{{{INST}}}", "{{instance}}")],
                "/healthz says stalled past 120 s",
            ),
            (
                "Start-up phases",
                "timeseries",
                "s",
                [(f"cdc_startup_phase_seconds{{{INST}}}", "{{phase}}")],
                "how long each start-up phase took",
            ),
        ],
    ),
]


def _panel(
    panel_id: int, title: str, kind: str, unit: str, queries: list[tuple[str, str]], description: str, x: int, y: int
) -> Any:
    builder: Any = (
        stat.Panel().graph_mode(BigValueGraphMode.AREA).reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"]))
        if kind == "stat"
        else timeseries.Panel()
    )
    builder = (
        builder.id(panel_id)
        .title(title)
        .unit(unit)
        .datasource(DS)
        .height(6)
        .span(8)
        .grid_pos(dm.GridPos(h=6, w=8, x=x, y=y))
    )
    if description:
        builder = builder.description(description)
    for i, (expr, legend) in enumerate(queries):
        builder = builder.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)))
    return builder


def build() -> dict[str, Any]:
    d = (
        gd.Dashboard("cdc: PostgreSQL to Kafka")
        .uid("cdc-overview")
        .tags(["cdc", "postgresql", "kafka"])
        .description("The cdc daemon's metrics (docs/operations.md). Generated by deploy/observability/generate.py.")
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            gd.QueryVariable("instance")
            .label("Instance")
            .datasource(DS)
            .query('label_values(up{job="cdc"}, instance)')
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_variable(
            gd.QueryVariable("table")
            .label("Table")
            .datasource(DS)
            .query("label_values(cdc_events_total, table)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    y = 0
    panel_id = 0
    for title, panels in ROWS:
        panel_id += 1
        d = d.with_row(gd.Row(title).id(panel_id).grid_pos(dm.GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        for i, (ptitle, kind, unit, queries, description) in enumerate(panels):
            x = (i % 3) * 8
            if i and i % 3 == 0:
                y += 6
            panel_id += 1
            d = d.with_panel(_panel(panel_id, ptitle, kind, unit, queries, description, x, y))
        y += 6
    built = d.build()
    out: dict[str, Any] = json.loads(json.dumps(built, cls=JSONEncoder))
    return out


def dashboard_text() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def prometheus_rule_text() -> str:
    rules = yaml.safe_load(RULES.read_text())
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "cdc", "labels": {"app.kubernetes.io/name": "cdc"}},
        "spec": {"groups": rules["groups"]},
    }
    header = "# Generated from deploy/observability/cdc-rules.yml by deploy/observability/generate.py: edit those.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, width=120)


def strip_annotations(dest: Path) -> Path:
    """cdc-rules.yml without annotations, and the promtool unit tests beside it; returns the tests' path."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / RULES.name).write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copyfile(RULES_TEST, dest / RULES_TEST.name)
    return dest / RULES_TEST.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed file is not current")
    parser.add_argument("--strip-annotations", metavar="DIR", type=Path)
    args = parser.parse_args(argv)
    if args.strip_annotations is not None:
        print(strip_annotations(args.strip_annotations))
        return 0
    wanted = {DASHBOARD: dashboard_text(), PROMETHEUS_RULE: prometheus_rule_text(), K8S_DASHBOARD: dashboard_text()}
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is not current: run python deploy/observability/generate.py", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(wanted[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
