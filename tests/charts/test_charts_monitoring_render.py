"""What the charts give Prometheus and Grafana, as `helm template` renders it.

Two ways, chosen by what the cluster has: where the Prometheus Operator's
CRDs are (`--api-versions monitoring.coreos.com/v1` here), ServiceMonitors and
PrometheusRules; elsewhere `prometheus.io/scrape` annotations on the metrics
Services and ConfigMaps holding the rules files. The rules are the same
either way. A real Prometheus scrapes, evaluates and fires them in
tests/charts/test_local_up_monitoring.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from sunk_testbed.helm import CHARTS, Helm, ensure_helm

pytestmark = pytest.mark.contract

OPERATOR_CRDS = "monitoring.coreos.com/v1"
SLURMCTLD_PATHS = {
    "/metrics/jobs",
    "/metrics/nodes",
    "/metrics/partitions",
    "/metrics/jobs-users-accts",
    "/metrics/scheduler",
}
SUNK_ALERTS = [
    "SunkComponentDown",  # one rule per component, one name
    "SunkTokensNotRefreshed",
    "SunkSlurmViewStale",
    "SunkNodeDrainedTooLong",
    "SunkPodsWaitingOnSlurm",
]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def render(helm: Helm, chart: str, *args: str) -> list[dict[str, Any]]:
    out = helm.run(["template", "rel", str(CHARTS / chart), "-n", "hpc", *args])
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def rules_file(docs: list[dict[str, Any]], configmap: str, key: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(of_kind(docs, "ConfigMap")[configmap]["data"][key])
    return loaded


def alerts(groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups["groups"] for rule in group["rules"]}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_without_the_operator_crds_the_metrics_services_carry_scrape_annotations(
    helm: Helm,
) -> None:
    sunk = render(helm, "sunk-cluster")
    assert of_kind(sunk, "ServiceMonitor") == of_kind(sunk, "PrometheusRule") == {}
    for component in ("operator", "syncer", "scheduler"):
        service = of_kind(sunk, "Service")[f"rel-{component}-metrics"]
        assert service["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9090",
            "prometheus.io/path": "/metrics",
        }
    assert list(alerts(rules_file(sunk, "rel-prometheus-rules", "sunk.rules.yaml"))) == SUNK_ALERTS

    slurm = render(helm, "slurm")
    config = of_kind(slurm, "ConfigMap")["rel-config"]["data"]["slurm.conf"]
    assert "MetricsType=metrics/openmetrics" in config.splitlines()
    scraped = {
        s["metadata"]["annotations"]["prometheus.io/path"]: s
        for s in of_kind(slurm, "Service").values()
        if s["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"
    }
    # An annotation names one path: one Service per slurmctld endpoint.
    assert set(scraped) == SLURMCTLD_PATHS
    for service in scraped.values():
        assert service["metadata"]["name"].startswith("rel-slurmctld-metrics-")
        assert service["metadata"]["annotations"]["prometheus.io/port"] == "6817"
        assert service["spec"]["selector"]["app.kubernetes.io/component"] == "slurmctld"
    assert list(alerts(rules_file(slurm, "rel-prometheus-rules", "slurm.rules.yaml"))) == [
        "SlurmctldDown"
    ]


def test_with_the_operator_crds_service_monitors_select_the_metrics_services(
    helm: Helm,
) -> None:
    for chart, monitor, ports in (
        (
            "sunk-cluster",
            "rel",
            {
                "rel-operator-metrics",
                "rel-syncer-metrics",
                "rel-scheduler-metrics",
                "rel-tokens-metrics",
            },
        ),
        ("slurm", "rel-slurmctld", {"rel-slurmctld-metrics"}),
    ):
        docs = render(helm, chart, "--api-versions", OPERATOR_CRDS)
        services = of_kind(docs, "Service")
        spec = of_kind(docs, "ServiceMonitor")[monitor]["spec"]
        chosen = {
            name
            for name, service in services.items()
            if selects(spec["selector"]["matchLabels"], service["metadata"]["labels"])
        }
        assert chosen == ports
        for name in chosen:
            assert "annotations" not in services[name]["metadata"]  # no second scrape
            assert {p["name"] for p in services[name]["spec"]["ports"]} == {"metrics"}
        assert {e["port"] for e in spec["endpoints"]} == {"metrics"}
        if chart == "slurm":
            assert {e["path"] for e in spec["endpoints"]} == SLURMCTLD_PATHS


def test_the_rules_are_the_same_as_a_prometheus_rule_or_a_rules_file(helm: Helm) -> None:
    for chart, rule, configmap, key in (
        ("sunk-cluster", "rel", "rel-prometheus-rules", "sunk.rules.yaml"),
        ("slurm", "rel-slurmctld", "rel-prometheus-rules", "slurm.rules.yaml"),
    ):
        plain = rules_file(render(helm, chart), configmap, key)
        operator = render(helm, chart, "--api-versions", OPERATOR_CRDS)
        assert of_kind(operator, "PrometheusRule")[rule]["spec"] == plain
        assert configmap not in of_kind(operator, "ConfigMap")


def test_alert_thresholds_and_labels_come_from_values(helm: Helm) -> None:
    sunk = alerts(
        rules_file(
            render(
                helm,
                "sunk-cluster",
                "--set=monitoring.rules.drainedForMinutes=5",
                "--set=monitoring.rules.waitingOnSlurmForMinutes=0",
                "--set=monitoring.rules.viewStaleFor=10s",
            ),
            "rel-prometheus-rules",
            "sunk.rules.yaml",
        )
    )
    assert sunk["SunkNodeDrainedTooLong"]["expr"].endswith("> 300")
    assert sunk["SunkPodsWaitingOnSlurm"]["expr"].endswith("> 0")
    assert sunk["SunkSlurmViewStale"]["for"] == "10s"
    # The components' own namespace, where their metrics Services are.
    assert all('namespace="hpc"' in rule["expr"] for rule in sunk.values())
    slurm = alerts(
        rules_file(
            render(helm, "slurm", "--set=metrics.rules.slurmctldDownFor=30s"),
            "rel-prometheus-rules",
            "slurm.rules.yaml",
        )
    )
    assert slurm["SlurmctldDown"]["for"] == "30s"
    assert 'service=~"rel-slurmctld-metrics(-.*)?"' in slurm["SlurmctldDown"]["expr"]
    for rule in (*sunk.values(), *slurm.values()):
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
    off = render(helm, "sunk-cluster", "--set=monitoring.rules.enabled=false")
    assert "rel-prometheus-rules" not in of_kind(off, "ConfigMap")


def test_slurm_metrics_can_be_turned_off_for_slurm_24_11(helm: Helm) -> None:
    """24.11's slurmctld has no OpenMetrics and refuses MetricsType."""
    docs = render(helm, "slurm", "--set=metrics.enabled=false")
    assert "MetricsType" not in of_kind(docs, "ConfigMap")["rel-config"]["data"]["slurm.conf"]
    assert not [n for n in of_kind(docs, "Service") if "-metrics" in n]
    assert "rel-prometheus-rules" not in of_kind(docs, "ConfigMap")
    assert "rel-grafana-dashboard" not in of_kind(docs, "ConfigMap")
    policy = of_kind(docs, "NetworkPolicy")["rel-slurmctld"]
    assert len(policy["spec"]["ingress"]) == 1


def test_only_prometheus_may_reach_slurmctld_for_its_metrics(helm: Helm) -> None:
    """The metrics share slurmctld's port: the policy opens it to the pods
    `networkPolicy.metricsFrom` names (Prometheus in `monitoring`), not to
    tenants' pods, even ones labelled like Prometheus."""
    policy = of_kind(render(helm, "slurm"), "NetworkPolicy")["rel-slurmctld"]
    [metrics] = [
        rule
        for rule in policy["spec"]["ingress"]
        if any("namespaceSelector" in peer for peer in rule["from"])
    ]
    assert metrics["ports"] == [{"protocol": "TCP", "port": 6817}]

    def admitted(namespace: str, labels: dict[str, str]) -> bool:
        return any(
            selects(
                peer["namespaceSelector"]["matchLabels"],
                {"kubernetes.io/metadata.name": namespace},
            )
            and selects(peer["podSelector"]["matchLabels"], labels)
            for peer in metrics["from"]
        )

    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert admitted("monitoring", prometheus)
    assert not admitted("team-a", prometheus)
    assert not admitted("monitoring", {"app": "grafana"})


def test_each_chart_has_a_grafana_dashboard_for_the_sidecar(helm: Helm) -> None:
    for chart, key, prefix in (
        ("sunk-cluster", "sunk.json", "sunk_"),
        ("slurm", "slurm.json", "slurm_"),
    ):
        configmap = of_kind(render(helm, chart), "ConfigMap")["rel-grafana-dashboard"]
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        board = json.loads(configmap["data"][key])
        panels = [p for p in board["panels"] if p["type"] != "row"]
        assert panels
        assert all(p["targets"] for p in panels)
        assert all(t["expr"] for p in panels for t in p["targets"])
        assert prefix in json.dumps(board)
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
