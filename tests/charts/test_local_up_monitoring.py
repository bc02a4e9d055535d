"""A real Prometheus watches the README's cluster (`sunk local up`): Debian's,
as a pod in `monitoring`, finding the charts' targets by their annotations,
with a copy of the charts' rules at zero thresholds (plugins/prometheus.py).

Shown: every target (slurmctld's five OpenMetrics endpoints, the operator,
syncer and scheduler) is up; every expression of both dashboards returns data
and every alert expression evaluates without error; a cordon sunk drains for,
a pod waiting on its Slurm job, and a stopped slurmctld each fire their alert.
The cluster is left as found: nodes uncordoned and idle, slurmctld back.
Each sunk component's down alert: tests/acceptance/test_default_install.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.local_cluster import kubectl, poll_ssh, ssh, summary
from plugins.prometheus import (
    TEST_GROUP,
    Kubectl,
    Prometheus,
    apply,
    configmap_data,
    ok,
    remove_prometheus,
    start_prometheus,
    wait_until_every_target_is_up,
)
from sunk_testbed.bed import USER_NAME

pytestmark = pytest.mark.e2e

_started: dict[Path, Prometheus] = {}


def cluster_kubectl(state: Path) -> Kubectl:
    return functools.partial(kubectl, state)


@pytest.fixture
def prometheus(local_cluster: Path) -> Prometheus:
    """One Prometheus per cluster, started by the first test that asks."""
    if local_cluster in _started:
        return _started[local_cluster]
    info = summary(local_cluster)
    values = local_cluster / "cluster"
    cluster_release, slurm_release = info["slurm"]["releases"]
    started = _started[local_cluster] = start_prometheus(
        cluster_kubectl(local_cluster),
        info["images"]["sunk/prometheus"],
        info["slurm"]["namespace"],
        (cluster_release, slurm_release),
        (values / "sunk-values.yaml", values / "slurm-values.yaml"),
    )
    return started


@pytest.fixture(scope="module", autouse=True)
def _remove_prometheus() -> Iterator[None]:
    yield
    for state, started in _started.items():
        started.http.close()
        if (state / "bed.json").exists():  # the cluster may be down already
            remove_prometheus(cluster_kubectl(state))
    _started.clear()


def dashboard_queries(state: Path) -> list[tuple[str, str, str]]:
    """(dashboard, panel, expr) of both charts' dashboards, as installed."""
    queries = []
    for configmap in ("slurm-grafana-dashboard", "sunk-grafana-dashboard"):
        for key, text in configmap_data(cluster_kubectl(state), "slurm", configmap).items():
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
        apply(cluster_kubectl(state), [pod])
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
