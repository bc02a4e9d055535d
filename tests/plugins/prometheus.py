"""A real Prometheus watching a cluster the charts are installed on.

Debian's Prometheus (images/prometheus) runs as a pod in the namespace
`monitoring`, as the slurm chart's NetworkPolicy expects, and finds its
targets the way a plain (not Operator-managed) Prometheus does: Kubernetes
service discovery of EndpointSlices and the charts' `prometheus.io/scrape`
annotations, with the relabelling of the community Prometheus chart. It loads
the charts' rules files from their ConfigMaps, and a copy of the same rules
rendered by helm with the thresholds at zero (the test's own config, not the
charts' defaults), so that what induces an alert shows in seconds, not
after 30 minutes. Scrape and evaluation every 2 s, for the same reason.

`Kubectl` is the cluster's kubectl bound to its admin kubeconfig
(`functools.partial(kubectl_at, kubeconfig)`).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx2
import yaml

from sunk_testbed.helm import CHARTS, Helm, ensure_helm

MONITORING = "monitoring"
INTERVAL = "2s"
TEST_GROUP = "test-"  # prefix of the rule groups rendered with zero thresholds
PROMETHEUS_PORT = 9090
SUNK_COMPONENTS = ("operator", "syncer", "scheduler", "tokens", "gpu-plugin")


class Kubectl(Protocol):
    def __call__(
        self, *args: str, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess[str]: ...


# The community Prometheus chart's job for annotated Services, on EndpointSlices.
SCRAPE_CONFIG = {
    "job_name": "kubernetes-service-endpoints",
    "kubernetes_sd_configs": [{"role": "endpointslice"}],
    "relabel_configs": [
        {
            "source_labels": ["__meta_kubernetes_service_annotation_prometheus_io_scrape"],
            "action": "keep",
            "regex": "true",
        },
        {
            "source_labels": ["__meta_kubernetes_service_annotation_prometheus_io_path"],
            "target_label": "__metrics_path__",
            "regex": "(.+)",
        },
        {
            "source_labels": [
                "__address__",
                "__meta_kubernetes_service_annotation_prometheus_io_port",
            ],
            "target_label": "__address__",
            "regex": r"(.+?)(?::\d+)?;(\d+)",
            "replacement": "$1:$2",
        },
        {"action": "labelmap", "regex": "__meta_kubernetes_service_label_(.+)"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ],
}


class Prometheus:
    """The Prometheus pod and how to ask it things."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx2.Client(base_url=url, timeout=10)

    def api(self, path: str, **params: str) -> Any:
        reply = self.http.get(f"/api/v1/{path}", params=params)
        body = reply.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def rule_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.api("rules")["groups"]
        return groups

    def firing(self, test_rules: bool = True) -> set[str]:
        """Alerts firing, of the zero-threshold copy (or of the charts' own rules)."""
        return {
            rule["name"]
            for group in self.rule_groups()
            if group["name"].startswith(TEST_GROUP) == test_rules
            for rule in group["rules"]
            if rule.get("type") == "alerting" and rule["state"] == "firing"
        }

    def down(self) -> set[str]:
        """The components whose SunkComponentDown fires (zero-threshold copy)."""
        return {
            rule["labels"]["component"]
            for group in self.rule_groups()
            if group["name"].startswith(TEST_GROUP)
            for rule in group["rules"]
            if rule["name"] == "SunkComponentDown" and rule["state"] == "firing"
        }

    def wait(
        self,
        what: str,
        done: Callable[[], bool],
        within: float,
        report: Callable[[], object] | None = None,
    ) -> None:
        deadline = time.monotonic() + within
        while not done():
            if time.monotonic() >= deadline:
                seen = f": {report()}" if report is not None else ""
                raise AssertionError(f"{what}: not within {within:.0f} s{seen}")
            time.sleep(0.5)


def ok(proc: Any) -> str:
    assert proc.returncode == 0, f"{proc.args}: {proc.stdout}\n{proc.stderr}"
    out: str = proc.stdout
    return out


def apply(kubectl: Kubectl, objects: list[dict[str, Any]]) -> None:
    ok(kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects)))


def configmap_data(kubectl: Kubectl, namespace: str, name: str) -> dict[str, str]:
    data: dict[str, str] = json.loads(
        ok(kubectl("-n", namespace, "get", "configmap", name, "-o", "json"))
    )["data"]
    return data


def zero_threshold_rules(
    namespace: str, releases: tuple[str, str], values: tuple[Path, Path]
) -> dict[str, str]:
    """The charts' rules as `helm template` renders them for this cluster's
    releases and values files (cluster, slurm), with every duration and
    threshold at zero; groups renamed."""
    cluster_release, slurm_release = releases
    cluster_values, slurm_values = values
    helm = Helm(ensure_helm(print), None, Path("/tmp"))
    rendered = {
        "test-slurm.rules.yaml": helm.run(
            [
                "template", slurm_release, str(CHARTS / "slurm"), "-n", namespace,
                "-f", str(slurm_values),
                "-s", "templates/metrics.yaml", "--set=metrics.rules.slurmctldDownFor=0s",
            ]
        ),
        "test-sunk.rules.yaml": helm.run(
            [
                "template", cluster_release, str(CHARTS / "sunk-cluster"), "-n", namespace,
                "-f", str(cluster_values),
                "-s", "templates/monitoring.yaml", "--set=monitoring.rules.viewStaleFor=0s",
                "--set=monitoring.rules.drainedForMinutes=0",
                "--set=monitoring.rules.waitingOnSlurmForMinutes=0",
                "--set=monitoring.rules.componentDownFor=0s",
            ]
        ),
    }  # fmt: skip
    files = {}
    for name, out in rendered.items():
        [configmap] = [
            d
            for d in yaml.safe_load_all(out)
            if d and d["metadata"]["name"].endswith("-prometheus-rules")
        ]
        [text] = configmap["data"].values()
        groups = yaml.safe_load(text)
        for group in groups["groups"]:
            group["name"] = TEST_GROUP + group["name"]
        files[name] = yaml.safe_dump(groups)
    return files


def prometheus_objects(image: str, files: dict[str, str]) -> list[dict[str, Any]]:
    name = {"name": "prometheus", "namespace": MONITORING}
    labels = {"app.kubernetes.io/name": "prometheus"}
    config = {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": ["/etc/prometheus/*.rules.yaml"],
        "scrape_configs": [SCRAPE_CONFIG],
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MONITORING}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": name},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "sunk-test-prometheus"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "endpoints", "pods", "nodes"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "sunk-test-prometheus"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "sunk-test-prometheus",
            },
            "subjects": [{"kind": "ServiceAccount", **name}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": name,
            "data": {"prometheus.yml": yaml.safe_dump(config), **files},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**name, "labels": labels},
            "spec": {
                "serviceAccountName": "prometheus",
                "terminationGracePeriodSeconds": 1,
                # sunk's node lock (a Slurm job on the node) must not evict it.
                "tolerations": [{"key": "sunk.dev/slurm-job", "operator": "Exists"}],
                "containers": [
                    {
                        "name": "prometheus",
                        "image": image,
                        "args": [
                            "--config.file=/etc/prometheus/prometheus.yml",
                            "--storage.tsdb.path=/prometheus",
                            f"--web.listen-address=:{PROMETHEUS_PORT}",
                        ],
                        "readinessProbe": {
                            "httpGet": {"path": "/-/ready", "port": PROMETHEUS_PORT},
                            "periodSeconds": 1,
                        },
                        "volumeMounts": [
                            {"name": "config", "mountPath": "/etc/prometheus"},
                            {"name": "data", "mountPath": "/prometheus"},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "config", "configMap": {"name": "prometheus"}},
                    {"name": "data", "emptyDir": {}},
                ],
            },
        },
    ]


def start_prometheus(
    kubectl: Kubectl,
    image: str,
    namespace: str,
    releases: tuple[str, str],
    values: tuple[Path, Path],
) -> Prometheus:
    """Prometheus on the cluster, loading the rules of both charts' releases
    (cluster, slurm) in `namespace` and their zero-threshold copies rendered
    from the releases' values files (cluster, slurm); once Ready, how to ask it."""
    cluster_release, slurm_release = releases
    files = {
        **configmap_data(kubectl, namespace, f"{slurm_release}-prometheus-rules"),
        **configmap_data(kubectl, namespace, f"{cluster_release}-prometheus-rules"),
        **zero_threshold_rules(namespace, releases, values),
    }
    apply(kubectl, prometheus_objects(image, files))
    ok(
        kubectl(
            "-n", MONITORING, "wait", "pod/prometheus", "--for=condition=Ready",
            "--timeout=90s", timeout=120,
        )
    )  # fmt: skip
    ip = ok(kubectl("-n", MONITORING, "get", "pod", "prometheus", "-o", "jsonpath={.status.podIP}"))
    return Prometheus(f"http://{ip}:{PROMETHEUS_PORT}")


def remove_prometheus(kubectl: Kubectl) -> None:
    kubectl("delete", "namespace", MONITORING, "--wait=false")
    kubectl("delete", "clusterrolebinding,clusterrole", "sunk-test-prometheus")


def scraped_services(prometheus: Prometheus) -> dict[str, str]:
    """Service → health of its targets (the worst of them)."""
    health: dict[str, str] = {}
    for target in prometheus.api("targets")["activeTargets"]:
        service = target["labels"].get("service", "")
        if health.get(service) != "down":
            health[service] = target["health"]
    return health


def wait_until_every_target_is_up(prometheus: Prometheus) -> dict[str, str]:
    wanted = {
        *(
            f"slurm-slurmctld-metrics-{e}"
            for e in ("jobs", "nodes", "partitions", "accounts", "scheduler")
        ),
        *(f"sunk-{c}-metrics" for c in SUNK_COMPONENTS),
    }

    def all_up() -> bool:
        health = scraped_services(prometheus)
        return all(health.get(service) == "up" for service in wanted)

    prometheus.wait(f"targets up: {wanted}", all_up, within=60)
    return scraped_services(prometheus)


def each_component_down_fires_its_alert(
    prometheus: Prometheus, kubectl: Kubectl, namespace: str, cluster_release: str
) -> None:
    """The operator, the syncer, the scheduler and the token minter, each
    scaled to zero in turn, then the GPU plugin's pods sent nowhere: its
    SunkComponentDown fires (no target left to scrape; the stale-view alert
    cannot say so, its series gone with the pods) and no other; back, the
    alert ends. (Blocking: run it in a thread from async tests.)"""
    wait_until_every_target_is_up(prometheus)
    # The rules are evaluated on their own interval, after the scrapes.
    prometheus.wait(
        "no SunkComponentDown", lambda: not prometheus.down(), within=60, report=prometheus.down
    )
    for component in ("operator", "syncer", "scheduler", "tokens"):
        deployment = f"{cluster_release}-{component}"
        replicas = ok(
            kubectl("-n", namespace, "get", "deployment", deployment, "-o",
                    "jsonpath={.spec.replicas}")
        )  # fmt: skip
        stopped = time.monotonic()
        try:
            ok(kubectl("-n", namespace, "scale", "deployment", deployment, "--replicas=0"))
            prometheus.wait(
                f"SunkComponentDown for the {component}",
                lambda c=component: c in prometheus.down(),
                within=60,
                report=prometheus.down,
            )
            assert prometheus.down() == {component}
            print(f"{component}: down firing {time.monotonic() - stopped:.1f} s after the scale")
        finally:
            ok(kubectl("-n", namespace, "scale", "deployment", deployment,
                       f"--replicas={replicas}"))  # fmt: skip
            ok(
                kubectl(
                    "-n", namespace, "rollout", "status", f"deployment/{deployment}",
                    "--timeout=120s", timeout=150,
                )
            )  # fmt: skip
        prometheus.wait(
            f"SunkComponentDown for the {component} over",
            lambda: not prometheus.down(),
            within=60,
            report=prometheus.down,
        )
    # The GPU plugin, a DaemonSet, cannot be scaled: its pods go where no
    # node matches its selector (one key added to the chart's, then removed).
    daemonset = f"ds/{cluster_release}-gpu-plugin"
    stopped = time.monotonic()
    nowhere = '{"spec":{"template":{"spec":{"nodeSelector":{"sunk.dev/no-such-node":"x"}}}}}'
    try:
        ok(kubectl("-n", namespace, "patch", daemonset, "-p", nowhere))
        prometheus.wait(
            "SunkComponentDown for the gpu-plugin",
            lambda: "gpu-plugin" in prometheus.down(),
            within=90,
            report=prometheus.down,
        )
        assert prometheus.down() == {"gpu-plugin"}
        print(f"gpu-plugin: down firing {time.monotonic() - stopped:.1f} s after its pods went")
    finally:
        back = '{"spec":{"template":{"spec":{"nodeSelector":{"sunk.dev/no-such-node":null}}}}}'
        ok(kubectl("-n", namespace, "patch", daemonset, "-p", back))
        rollout = kubectl(
            "-n", namespace, "rollout", "status", daemonset, "--timeout=120s", timeout=150
        )
        if rollout.returncode != 0:
            # Why a pod is not back: its node, state and events.
            selector = f"app.kubernetes.io/instance={cluster_release}"
            selector += ",app.kubernetes.io/component=gpu-plugin"
            pods = kubectl("-n", namespace, "describe", "pods", "-l", selector)
            nodes = kubectl("get", "nodes", "-o", "wide")
            raise AssertionError(
                f"{rollout.stdout}\n{rollout.stderr}\n{nodes.stdout}\n{pods.stdout}"
            )
    prometheus.wait(
        "SunkComponentDown for the gpu-plugin over",
        lambda: not prometheus.down(),
        within=60,
        report=prometheus.down,
    )
