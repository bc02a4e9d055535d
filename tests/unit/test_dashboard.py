"""The Grafana dashboard in the sunk-cluster chart asks only for metrics that exist.

The slurm chart's dashboard asks for slurmctld's own metrics: those are checked
on a real Prometheus scraping a real slurmctld
(tests/charts/test_local_up_monitoring.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from sunk.nodeset.metrics import NodeSetMetrics
from sunk.scheduler.metrics import SchedulerMetrics
from sunk.syncer.metrics import SyncerMetrics

DASHBOARD = Path(__file__).parents[2] / "charts" / "sunk-cluster" / "dashboards" / "sunk.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed(metrics: object) -> dict[str, set[str]]:
    """Series name → its label names, as Prometheus scrapes them."""
    names: dict[str, set[str]] = {}
    for metric in vars(metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        labels = set(metric._labelnames)  # prometheus_client has no public accessor
        for family in metric.describe():
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in expressions(value)]
    if isinstance(node, list):
        return [e for value in node for e in expressions(value)]
    return []


def test_every_series_the_dashboard_asks_for_is_exported() -> None:
    known = exposed(SyncerMetrics()) | exposed(SchedulerMetrics()) | exposed(NodeSetMetrics())
    exprs = expressions(json.loads(DASHBOARD.read_text()))
    assert exprs
    for expr in exprs:
        for name, selector in re.findall(r"(sunk_[a-z_]+)(\{[^}]*\})?", expr):
            assert name in known, f"{expr}: {name} is not exported"
            for label in re.findall(r"([a-z_]+)\s*=", selector):
                assert label in known[name], f"{expr}: {name} has no label {label}"
        for label in re.findall(r"by \(([^)]*)\)", expr):
            for one in (part.strip() for part in label.split(",")):
                assert any(one in labels for labels in known.values()), f"{expr}: no label {one}"


def test_the_dashboard_shows_every_component() -> None:
    exprs = " ".join(expressions(json.loads(DASHBOARD.read_text())))
    for prefix in ("sunk_operator_", "sunk_syncer_", "sunk_scheduler_"):
        assert prefix in exprs
