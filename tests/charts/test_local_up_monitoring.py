"""A real Prometheus watches the README's cluster (`sunk local up`).

Debian's Prometheus (images/prometheus) runs as a pod in the namespace
`monitoring`, as the slurm chart's NetworkPolicy expects, and finds its
targets the way a plain (not Operator-managed) Prometheus does: Kubernetes
service discovery of EndpointSlices and the charts' `prometheus.io/scrape`
annotations, with the relabelling of the community Prometheus chart. It loads
the charts' rules files from their ConfigMaps, and a copy of the same rules
rendered by helm with the thresholds at zero (the test's own config, not the
charts' defaults), so that what induces an alert shows in seconds, not
after 30 minutes. Scrape and evaluation every 2 s, for the same reason.

Shown: every target (slurmctld's five OpenMetrics endpoints, the operator,
syncer and scheduler) is up; every expression of both dashboards returns data
and every alert expression evaluates without error; a cordon sunk drains for,
a pod waiting on its Slurm job, and a stopped slurmctld each fire their alert.
The cluster is left as found: nodes uncordoned and idle, slurmctld back.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from plugins.local_cluster import kubectl, poll_ssh, ssh, summary
from sunk_testbed.bed import CLUSTER_RELEASE, USER_NAME
from sunk_testbed.helm import CHARTS, Helm, ensure_helm

pytestmark = pytest.mark.e2e

MONITORING = "monitoring"
INTERVAL = "2s"
TEST_GROUP = "test-"  # prefix of the rule groups rendered with zero thresholds
PROMETHEUS_PORT = 9090

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

    def __init__(self, state: Path, url: str) -> None:
        self.state = state
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


def apply(state: Path, objects: list[dict[str, Any]]) -> None:
    manifest = yaml.safe_dump_all(objects)
    proc = kubectl(state, "apply", "-f", "-", input=manifest)
    ok(proc)


def configmap_data(state: Path, namespace: str, name: str) -> dict[str, str]:
    data: dict[str, str] = json.loads(
        ok(kubectl(state, "-n", namespace, "get", "configmap", name, "-o", "json"))
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


_started: dict[Path, Prometheus] = {}


@pytest.fixture
def prometheus(local_cluster: Path) -> Prometheus:
    """One Prometheus per cluster, started by the first test that asks."""
    if local_cluster in _started:
        return _started[local_cluster]
    info = summary(local_cluster)
    namespace = info["slurm"]["namespace"]
    cluster_release, slurm_release = info["slurm"]["releases"]
    files = {
        **configmap_data(local_cluster, namespace, f"{slurm_release}-prometheus-rules"),
        **configmap_data(local_cluster, namespace, f"{cluster_release}-prometheus-rules"),
        **zero_threshold_rules(
            namespace,
            (cluster_release, slurm_release),
            (
                local_cluster / "cluster" / "sunk-values.yaml",
                local_cluster / "cluster" / "slurm-values.yaml",
            ),
        ),
    }
    apply(local_cluster, prometheus_objects(info["images"]["sunk/prometheus"], files))
    ok(
        kubectl(
            local_cluster, "-n", MONITORING, "wait", "pod/prometheus",
            "--for=condition=Ready", "--timeout=60s", timeout=90,
        )
    )  # fmt: skip
    ip = ok(
        kubectl(local_cluster, "-n", MONITORING, "get", "pod", "prometheus", "-o",
                "jsonpath={.status.podIP}")
    )  # fmt: skip
    started = _started[local_cluster] = Prometheus(local_cluster, f"http://{ip}:{PROMETHEUS_PORT}")
    return started


@pytest.fixture(scope="module", autouse=True)
def _remove_prometheus() -> Iterator[None]:
    yield
    for state, started in _started.items():
        started.http.close()
        if (state / "bed.json").exists():  # the cluster may be down already
            kubectl(state, "delete", "namespace", MONITORING, "--wait=false")
            kubectl(state, "delete", "clusterrolebinding,clusterrole", "sunk-test-prometheus")
    _started.clear()


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
        *(f"sunk-{c}-metrics" for c in ("operator", "syncer", "scheduler", "tokens", "gpu-plugin")),
    }

    def all_up() -> bool:
        health = scraped_services(prometheus)
        return all(health.get(service) == "up" for service in wanted)

    prometheus.wait(f"targets up: {wanted}", all_up, within=60)
    return scraped_services(prometheus)


def dashboard_queries(state: Path) -> list[tuple[str, str, str]]:
    """(dashboard, panel, expr) of both charts' dashboards, as installed."""
    queries = []
    for configmap in ("slurm-grafana-dashboard", "sunk-grafana-dashboard"):
        for key, text in configmap_data(state, "slurm", configmap).items():
            for panel in json.loads(text)["panels"]:
                for target in panel.get("targets", []):
                    queries.append((key, panel["title"], target["expr"]))
    return queries


@contextlib.contextmanager
def busy_cluster(state: Path) -> Iterator[str]:
    """Every node held by a researcher's exclusive job, local-3 cordoned (sunk
    drains it), and a pod of the scheduler waiting on its Slurm job; all undone
    afterwards. Yields the pod's job id."""
    # The researcher's jobs are charged to an account, as on a production
    # cluster, so per-account series exist: with the directory, its group's
    # (`identity.ldap.accounts`, the default account); with the static
    # provider, this one.
    for command in ("add account research", f"add user {USER_NAME} account=research"):
        kubectl(
            state,
            "-n",
            "slurm",
            "exec",
            "slurm-slurmctld-0",
            "--",
            "sacctmgr",
            "-i",
            *command.split(),
        )
    blocker = ssh(state, "sbatch --parsable --exclusive -N3 --wrap 'sleep 600'").strip()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "waits-on-slurm", "namespace": "default"},
        "spec": {
            "schedulerName": "sunk-scheduler",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": summary(state)["images"]["sunk/slurm"],
                    "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
        },
    }
    try:
        poll_ssh(state, f"squeue -h -j {blocker} -o %T", lambda out: "RUNNING" in out, 30, 0.5)
        ok(kubectl(state, "cordon", "local-3"))
        apply(state, [pod])
        # A scheduler that came back with the cluster (`down`, `up` in the module
        # before) may still wait for its Lease and a fresh view.
        deadline = time.monotonic() + 90
        while True:
            got = json.loads(ok(kubectl(state, "get", "pod", "waits-on-slurm", "-o", "json")))
            job = got["metadata"].get("annotations", {}).get("sunk.dev/slurm-job-id")
            if job:
                break
            assert time.monotonic() < deadline, f"no Slurm job for the pod: {got['status']}"
            time.sleep(0.5)
        yield job
    finally:
        kubectl(state, "delete", "pod", "waits-on-slurm", "--wait=false")
        kubectl(state, "uncordon", "local-3")
        ssh(state, f"scancel {blocker}")
        poll_ssh(state, "squeue -h -o %i", lambda out: out.strip() == "", 60, 0.5)
        poll_ssh(state, "sinfo -h -N -o '%N %t'", three_idle, 60, 0.5)


def three_idle(out: str) -> bool:
    return [line.split()[-1] for line in out.splitlines() if line.strip()] == ["idle"] * 3


def test_dashboards_and_alerts_evaluate_on_a_real_prometheus(
    local_cluster: Path, prometheus: Prometheus
) -> None:
    """Every target up; every dashboard query returns data and every alert
    expression evaluates, the charts' rules load healthy; a node sunk drained
    and a pod waiting on Slurm fire their alerts (zero thresholds)."""
    health = wait_until_every_target_is_up(prometheus)
    print("targets:", health)
    with busy_cluster(local_cluster) as job:
        # Everything a dashboard or an alert reads exists once the next scrapes
        # have seen the busy cluster.
        needed = (
            "sunk_syncer_sunk_drain_seconds",
            "sunk_scheduler_slurm_wait_seconds > 0",
            'slurm_account_jobs_running{account!=""} > 0',
        )
        prometheus.wait(
            "sunk's drain and the waiting pod in the metrics",
            lambda: all(prometheus.query(expr) for expr in needed),
            within=30,
            report=lambda: {expr: prometheus.query(expr) for expr in needed},
        )
        empty = [
            (board, title, expr)
            for board, title, expr in dashboard_queries(local_cluster)
            if not prometheus.query(expr)
        ]
        assert empty == []
        for group in prometheus.rule_groups():
            for rule in group["rules"]:
                assert rule["health"] != "err", f"{group['name']}/{rule['name']}: {rule}"
                prometheus.query(rule["query"])  # asserts success
        loaded = {r["name"] for g in prometheus.rule_groups() for r in g["rules"]}
        assert {"SlurmctldDown", "SunkSlurmViewStale", "SunkNodeDrainedTooLong"} <= loaded
        prometheus.wait(
            "SunkNodeDrainedTooLong and SunkPodsWaitingOnSlurm firing",
            lambda: {"SunkNodeDrainedTooLong", "SunkPodsWaitingOnSlurm"} <= prometheus.firing(),
            within=20,
        )
        [drained] = [
            a["labels"]
            for g in prometheus.rule_groups()
            if g["name"].startswith(TEST_GROUP)
            for r in g["rules"]
            if r["name"] == "SunkNodeDrainedTooLong"
            for a in r["alerts"]
        ]
        assert (drained["kube_node"], drained["by"]) == ("local-3", "syncer")
        # With the charts' own thresholds (30 minutes) nothing fires.
        assert prometheus.firing(test_rules=False) == set()
        print(f"pod's job {job}; firing: {sorted(prometheus.firing())}")


def test_a_stopped_slurmctld_fires_slurmctld_down(
    local_cluster: Path, prometheus: Prometheus
) -> None:
    """slurmctld scaled to zero: SlurmctldDown fires (its targets gone), and
    so does SunkSlurmViewStale (slurmrestd cannot answer sunk). Brought back,
    Slurm runs jobs again and both alerts end."""
    state = local_cluster
    wait_until_every_target_is_up(prometheus)
    assert "SlurmctldDown" not in prometheus.firing()
    replicas = ok(
        kubectl(state, "-n", "slurm", "get", "statefulset", "slurm-slurmctld", "-o",
                "jsonpath={.spec.replicas}")
    )  # fmt: skip
    stopped = time.monotonic()
    try:
        ok(kubectl(state, "-n", "slurm", "scale", "statefulset", "slurm-slurmctld", "--replicas=0"))
        prometheus.wait(
            "SlurmctldDown and SunkSlurmViewStale firing",
            lambda: {"SlurmctldDown", "SunkSlurmViewStale"} <= prometheus.firing(),
            within=60,
        )
        print(f"SlurmctldDown firing {time.monotonic() - stopped:.1f} s after the stop")
    finally:
        ok(kubectl(state, "-n", "slurm", "scale", "statefulset", "slurm-slurmctld",
                   f"--replicas={replicas}"))  # fmt: skip
        ok(
            kubectl(
                state, "-n", "slurm", "rollout", "status", "statefulset/slurm-slurmctld",
                "--timeout=120s", timeout=150,
            )
        )  # fmt: skip
        poll_ssh(state, "sinfo -h -N -o '%N %t' || true", three_idle, 120, 1)
    prometheus.wait(
        "SlurmctldDown and SunkSlurmViewStale over",
        lambda: not {"SlurmctldDown", "SunkSlurmViewStale"} & prometheus.firing(),
        within=60,
    )
    job = ssh(state, "sbatch --parsable --wrap hostname").strip()
    poll_ssh(state, f"sacct -n -X -j {job} -o State", lambda out: "COMPLETED" in out, 60)
    print(f"slurmctld stopped and back in {time.monotonic() - stopped:.1f} s")


@pytest.mark.timeout(900)  # five components, about a minute each
def test_a_component_with_no_replica_left_fires_sunk_component_down(
    local_cluster: Path, prometheus: Prometheus
) -> None:
    """The operator, the syncer, the scheduler and the token minter, each
    scaled to zero in turn, then the GPU plugin's pods sent nowhere:
    its SunkComponentDown fires (no target left to scrape; the stale-view
    alert cannot say so, its series gone with the pods) and no other; back,
    the alert ends."""
    state = local_cluster
    wait_until_every_target_is_up(prometheus)
    # The rules are evaluated on their own interval, after the scrapes.
    prometheus.wait(
        "no SunkComponentDown", lambda: not prometheus.down(), within=60, report=prometheus.down
    )
    for component in ("operator", "syncer", "scheduler", "tokens"):
        deployment = f"{CLUSTER_RELEASE}-{component}"
        replicas = ok(
            kubectl(state, "-n", "slurm", "get", "deployment", deployment, "-o",
                    "jsonpath={.spec.replicas}")
        )  # fmt: skip
        stopped = time.monotonic()
        try:
            ok(kubectl(state, "-n", "slurm", "scale", "deployment", deployment, "--replicas=0"))
            prometheus.wait(
                f"SunkComponentDown for the {component}",
                lambda c=component: c in prometheus.down(),
                within=60,
                report=prometheus.down,
            )
            assert prometheus.down() == {component}
            print(f"{component}: down firing {time.monotonic() - stopped:.1f} s after the scale")
        finally:
            ok(kubectl(state, "-n", "slurm", "scale", "deployment", deployment,
                       f"--replicas={replicas}"))  # fmt: skip
            ok(
                kubectl(
                    state, "-n", "slurm", "rollout", "status", f"deployment/{deployment}",
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
    # node matches its selector.
    daemonset = f"ds/{CLUSTER_RELEASE}-gpu-plugin"
    stopped = time.monotonic()
    nowhere = '{"spec":{"template":{"spec":{"nodeSelector":{"sunk.dev/no-such-node":"x"}}}}}'
    try:
        ok(kubectl(state, "-n", "slurm", "patch", daemonset, "-p", nowhere))
        prometheus.wait(
            "SunkComponentDown for the gpu-plugin",
            lambda: "gpu-plugin" in prometheus.down(),
            within=90,
            report=prometheus.down,
        )
        assert prometheus.down() == {"gpu-plugin"}
        print(f"gpu-plugin: down firing {time.monotonic() - stopped:.1f} s after its pods went")
    finally:
        back = '{"spec":{"template":{"spec":{"nodeSelector":null}}}}'
        ok(kubectl(state, "-n", "slurm", "patch", daemonset, "-p", back))
        ok(
            kubectl(
                state, "-n", "slurm", "rollout", "status", daemonset, "--timeout=120s",
                timeout=150,
            )
        )  # fmt: skip
    prometheus.wait(
        "SunkComponentDown for the gpu-plugin over",
        lambda: not prometheus.down(),
        within=60,
        report=prometheus.down,
    )
