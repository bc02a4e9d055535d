"""The charts as helm sees them, and as the real apiserver does.

`helm lint` for every values file under `charts/*/ci/`; then `helm template`
of each, every object (hooks included) created with a server-side dry-run in
a fresh namespace of the test bed's apiserver, after the chart's CRDs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import secrets
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, AsyncClient, codecs
from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.authorization_v1 import SubjectAccessReview
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from sunk.api import RESOURCE_NODE_GPUS, TAINT_NODE_LOCK
from sunk.api import nodeset as nodeset_api
from sunk.api.install import crds, install_crds
from sunk.scheduler.request import Options
from sunk.scheduler.tenancy import parse_tenancy
from sunk.slurm.conf import kill_wait
from sunk.syncer.decide import LABEL_SLURM_BUSY
from sunk.topology.settings import parse_settings
from sunk_testbed.helm import CHARTS, Helm, HelmError, ensure_helm

pytestmark = pytest.mark.contract

CI_VALUES = sorted(CHARTS.glob("*/ci/*.yaml"))
CRD_HEADER = (
    "# Generated from sunk.api.crd by tests/charts/test_charts_render.py"
    " (SUNK_WRITE_CHART_CRDS=1 rewrites it); do not edit.\n"
)


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def _case(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.stem}"


@pytest.mark.parametrize("values", CI_VALUES, ids=_case)
def test_helm_lint_is_clean(helm: Helm, values: Path) -> None:
    out = helm.run(["lint", "--strict", str(values.parent.parent), "-f", str(values)])
    assert "0 chart(s) failed" in out, out


def test_the_cluster_chart_carries_the_crds_sunk_defines() -> None:
    for crd in crds():
        path = CHARTS / "sunk-cluster" / "crds" / f"{crd['metadata']['name']}.yaml"
        text = CRD_HEADER + yaml.safe_dump(crd, sort_keys=False)
        if os.environ.get("SUNK_WRITE_CHART_CRDS"):
            path.write_text(text)
        assert path.read_text() == text, f"{path} is stale: rerun with SUNK_WRITE_CHART_CRDS=1"


def _render(helm: Helm, values: Path, namespace: str) -> list[dict[str, Any]]:
    chart = values.parent.parent
    out = helm.run(["template", "rel", str(chart), "-n", namespace, "-f", str(values)])
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("values", CI_VALUES, ids=_case)
async def test_every_rendered_object_passes_a_server_side_dry_run(
    helm: Helm, values: Path, kube: AsyncClient, namespace: str
) -> None:
    await install_crds(kube)
    nodeset_api.resource()  # registers the kind with lightkube's codecs
    docs = _render(helm, values, namespace)
    assert docs
    kinds = set()
    for doc in docs:
        if "namespace" in doc["metadata"]:  # a Role in the Slurm namespace: here, for the test
            doc["metadata"]["namespace"] = namespace
        obj = codecs.from_dict(doc)
        kinds.add(doc["kind"])
        try:
            await kube.create(obj, namespace=namespace, dry_run=True)  # type: ignore[call-overload]
        except Exception as error:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {error}") from error
    if values.parent.parent.name == "slurm":
        # No key Secret: the keys hook (a Job) makes them in the cluster.
        assert {"StatefulSet", "NodeSet", "Job", "ConfigMap"} <= kinds


def test_a_render_is_the_same_every_time_and_holds_no_key(helm: Helm) -> None:
    """What GitOps needs: `helm template` twice gives the same objects, and no
    key is in them (the keys hook makes them in the cluster); a key given as
    an existing Secret is neither made nor deleted by the hooks (only its
    public halves are, for ssh host keys)."""
    chart = str(CHARTS / "slurm")
    first, second = (helm.run(["template", "rel", chart, "-n", "hpc"]) for _ in range(2))
    assert first == second
    docs = [d for d in yaml.safe_load_all(first) if d]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"] == ["rel-authorized-keys"]
    assert "lookup" not in "".join(p.read_text() for p in (CHARTS / "slurm").rglob("*.tpl"))

    def hook_env(docs: list[dict[str, Any]], job: str) -> dict[str, str]:
        [spec] = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == job]
        [container] = spec["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in container["env"]}

    made = hook_env(docs, "rel-keys")["KEYS"].splitlines()
    assert made == [
        "rel-munge munge",
        "rel-jwt jwt",
        "rel-jwt-signing jwt-signing",  # the RS256 keys sunk tokens signs with
        "rel-db db",
        "rel-ssh-host-keys ssh-host",
        "rel-compute-ssh-host-keys ssh-host",  # sshd of the compute pods (slurmd.ssh)
        # The public halves, for the peers and Slurm: derived from the private ones.
        "rel-login-ssh-public-keys ssh-public rel-ssh-host-keys",
        "rel-compute-ssh-public-keys ssh-public rel-compute-ssh-host-keys",
        "rel-jwks jwks rel-jwt-signing",
    ]
    assert hook_env(docs, "rel-uninstall")["KEY_SECRETS"].split() == [m.split()[0] for m in made]
    given = [
        "--set=munge.existingSecret=my-munge",
        "--set=login.existingHostKeysSecret=my-host-keys",
        "--set=slurmd.ssh.existingHostKeysSecret=my-compute-host-keys",
        "--set=jwt.existingSigningSecret=my-signing-keys",
    ]
    docs = [d for d in yaml.safe_load_all(helm.run(["template", "rel", chart, *given])) if d]
    made = hook_env(docs, "rel-keys")["KEYS"].splitlines()
    assert made == [
        "rel-jwt jwt",
        "rel-db db",
        "rel-login-ssh-public-keys ssh-public my-host-keys",
        "rel-compute-ssh-public-keys ssh-public my-compute-host-keys",
        "rel-jwks jwks my-signing-keys",
    ]
    assert hook_env(docs, "rel-uninstall")["KEY_SECRETS"].split() == [
        "rel-jwt", "rel-db", "rel-login-ssh-public-keys", "rel-compute-ssh-public-keys",
        "rel-jwks",
    ]  # fmt: skip


def test_busy_slurmd_pods_have_a_disruption_budget_that_can_be_turned_off(helm: Helm) -> None:
    def budgets(*args: str) -> list[dict[str, Any]]:
        out = helm.run(["template", "rel", str(CHARTS / "slurm"), *args])
        return [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PodDisruptionBudget"]

    (budget,) = budgets()
    labels = budget["spec"]["selector"]["matchLabels"]
    assert labels[LABEL_SLURM_BUSY] == "true"  # the label the syncer writes
    assert labels["app.kubernetes.io/component"] == "slurmd"
    assert budgets("--set", "busyNodeBudget=false") == []


def test_each_controller_serves_metrics_on_a_service_of_its_own(helm: Helm) -> None:
    def render(*args: str) -> list[dict[str, Any]]:
        out = helm.run(["template", "rel", str(CHARTS / "sunk-cluster"), *args])
        return [d for d in yaml.safe_load_all(out) if d]

    docs = render()
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for component in ("operator", "syncer", "scheduler"):
        service = services[f"rel-{component}-metrics"]
        assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090}]
        assert service["spec"]["selector"]["app.kubernetes.io/component"] == component
        (deployment,) = (
            d
            for d in docs
            if d["kind"] == "Deployment" and d["metadata"]["name"] == f"rel-{component}"
        )
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert "--metrics-port=9090" in container["command"]
    off = render("--set", "operator.metricsPort=0")
    assert "rel-operator-metrics" not in {d["metadata"]["name"] for d in off}


def test_only_the_tokens_pod_holds_the_jwt_key(helm: Helm) -> None:
    """The components parse what others write: each mounts its own token
    Secret, and only `sunk tokens` the key that can mint any user's token."""
    out = helm.run(["template", "rel", str(CHARTS / "sunk-cluster"), "-n", "hpc"])
    mounts = {}
    for doc in yaml.safe_load_all(out):
        if doc and doc["kind"] == "Deployment":
            volumes = doc["spec"]["template"]["spec"].get("volumes", [])
            mounts[doc["metadata"]["name"]] = [
                v["secret"]["secretName"] for v in volumes if "secret" in v
            ]
    assert mounts == {
        "rel-tokens": ["slurm-jwt-signing"],
        "rel-operator": ["rel-operator-token"],
        "rel-syncer": ["rel-syncer-token"],
        "rel-scheduler": ["rel-scheduler-token", "rel-scheduler-tenant-tokens"],
    }


RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


async def _can(kube: AsyncClient, account: str, home: str, **attributes: str) -> bool:
    """`kubectl auth can-i --as` for a ServiceAccount of namespace `home`, asked of
    the real apiserver."""
    review = SubjectAccessReview(
        spec=SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{home}:{account}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{home}"],
            resourceAttributes=ResourceAttributes(**attributes),
        )
    )
    answer = await kube.create(review)
    return bool(answer.status and answer.status.allowed)


# (component, verb, resource, where, name, allowed): what each ServiceAccount
# may do, and what it must not. `where`: "home" (the release's namespace, also
# the Slurm one by default), "elsewhere" (a tenant's), "" (cluster-scoped).
CAN_I = [
    ("operator", "create", "pods", "home", "", True),
    ("operator", "delete", "pods", "home", "", True),
    ("operator", "create", "pods", "elsewhere", "", False),
    ("operator", "delete", "pods", "elsewhere", "", False),
    # Two annotations of a slurmd pod (its node registering anew): a policy.
    ("operator", "patch", "pods", "home", "", True),
    ("operator", "patch", "pods", "elsewhere", "", False),
    ("operator", "patch", "pods/status", "home", "", False),
    ("operator", "patch", "nodesets", "home", "", True),
    ("operator", "patch", "nodesets", "elsewhere", "", False),
    ("operator", "get", "nodes", "", "", True),
    ("operator", "patch", "nodes", "", "", False),
    ("operator", "patch", "customresourcedefinitions", "", "nodesets.sunk.dev", True),
    ("operator", "patch", "customresourcedefinitions", "", "other.example.com", False),
    ("operator", "update", "leases", "home", "sunk-operator", True),
    ("operator", "update", "leases", "home", "sunk-syncer", False),
    ("operator", "get", "secrets", "home", "slurm-jwt", False),
    # The topology and gres controllers: the slurm chart's two ConfigMaps alone.
    ("operator", "update", "configmaps", "home", "slurm-topology", True),
    ("operator", "watch", "configmaps", "home", "slurm-topology", True),
    ("operator", "update", "configmaps", "home", "slurm-gres", True),
    ("operator", "watch", "configmaps", "home", "slurm-gres", True),
    ("operator", "update", "configmaps", "home", "slurm-config", False),
    ("operator", "list", "configmaps", "home", "", False),
    ("operator", "update", "configmaps", "elsewhere", "slurm-topology", False),
    ("syncer", "patch", "pods", "home", "", True),
    ("syncer", "patch", "pods", "elsewhere", "", False),
    ("syncer", "create", "pods", "home", "", False),
    ("syncer", "delete", "pods", "home", "", False),
    ("syncer", "patch", "nodes", "", "", True),
    ("syncer", "update", "leases", "home", "sunk-syncer", True),
    ("syncer", "update", "leases", "home", "sunk-operator", False),
    ("scheduler", "create", "secrets", "home", "", True),
    ("scheduler", "get", "secrets", "home", "{release}-scheduler-seal", True),
    ("scheduler", "get", "secrets", "home", "slurm-jwt", False),
    ("scheduler", "list", "secrets", "home", "", False),
    ("scheduler", "delete", "secrets", "home", "{release}-scheduler-seal", False),
    ("scheduler", "get", "configmaps", "home", "{release}-scheduler-tenancy", True),
    ("scheduler", "get", "configmaps", "home", "other", False),
    ("scheduler", "update", "configmaps", "home", "{release}-scheduler-tenancy", False),
    # slurm.conf's KillWait: the slurm chart's config ConfigMap, read only.
    ("scheduler", "watch", "configmaps", "home", "slurm-config", True),
    ("scheduler", "update", "configmaps", "home", "slurm-config", False),
    ("scheduler", "get", "configmaps", "elsewhere", "slurm-config", False),
    ("scheduler", "create", "pods", "elsewhere", "", False),
    ("scheduler", "list", "pods", "elsewhere", "", True),
    ("scheduler", "patch", "pods", "tenant", "", True),
    ("scheduler", "delete", "pods", "tenant", "", True),
    ("scheduler", "create", "pods/binding", "tenant", "", True),
    ("scheduler", "patch", "pods/status", "tenant", "", True),
    ("scheduler", "patch", "pods", "elsewhere", "", False),
    ("scheduler", "delete", "pods", "elsewhere", "", False),
    ("scheduler", "create", "pods/binding", "elsewhere", "", False),
    ("scheduler", "patch", "pods/status", "elsewhere", "", False),
    ("scheduler", "delete", "pods", "home", "", False),
    ("scheduler", "update", "leases", "home", "sunk-scheduler", True),
    # DRA: a tenant pod's claims read and allocated; no claim's spec, nor
    # another namespace's; the drivers' devices read, never written.
    ("scheduler", "get", "resourceclaims", "tenant", "", True),
    ("scheduler", "patch", "resourceclaims/status", "tenant", "", True),
    # The allocation's own permission, asked at the cluster scope (1.36).
    ("scheduler", "patch", "resourceclaims/binding", "", "", True),
    ("scheduler", "patch", "resourceclaims", "tenant", "", False),
    ("scheduler", "patch", "resourceclaims/status", "elsewhere", "", False),
    ("scheduler", "get", "resourceclaims", "elsewhere", "", False),
    ("scheduler", "list", "resourceslices", "", "", True),
    ("scheduler", "patch", "resourceslices", "", "", False),
    ("scheduler", "get", "deviceclasses", "", "gpu.nvidia.com", True),
    ("scheduler", "get", "deviceclasses", "", "other.example.com", False),
    ("tokens", "update", "secrets", "home", "{release}-syncer-token", True),
    ("tokens", "update", "secrets", "home", "slurm-jwt", False),
    ("tokens", "update", "secrets", "home", "slurm-jwt-signing", False),
    ("operator", "get", "secrets", "home", "slurm-jwt-signing", False),
    ("scheduler", "get", "secrets", "home", "slurm-jwt-signing", False),
    ("tokens", "update", "secrets", "home", "{release}-scheduler-seal", False),
    ("tokens", "list", "secrets", "home", "", False),
    ("tokens", "get", "serviceaccounts", "home", "{release}-tokens", True),
    ("tokens", "get", "serviceaccounts", "home", "{release}-syncer", False),
    ("tokens", "update", "secrets", "home", "{release}-scheduler-tenant-tokens", True),
    ("tokens", "watch", "configmaps", "home", "{release}-scheduler-tenancy", True),
    ("tokens", "update", "configmaps", "home", "{release}-scheduler-tenancy", False),
    ("scheduler", "get", "secrets", "home", "{release}-scheduler-tenant-tokens", False),
    ("syncer", "get", "secrets", "home", "{release}-syncer-token", False),
    # The GPU plugin reads the pods bound to its node, and writes only its
    # Node's GPU list (tests/charts/test_component_policies.py).
    ("gpu-plugin", "list", "pods", "elsewhere", "", True),
    ("gpu-plugin", "patch", "pods", "elsewhere", "", False),
    ("gpu-plugin", "patch", "pods/status", "elsewhere", "", False),
    ("gpu-plugin", "get", "secrets", "home", "slurm-jwt", False),
    ("gpu-plugin", "patch", "nodes", "", "", True),  # its own, one annotation: a policy
    ("gpu-plugin", "patch", "nodes/status", "", "", False),
]


async def test_each_component_may_do_what_it_needs_and_no_more(
    helm: Helm, kube: AsyncClient, namespace: str
) -> None:
    """The chart's RBAC, installed on the real apiserver and asked as each
    component's ServiceAccount (`kubectl auth can-i --as`), what it needs and
    what it must not: pods and NodeSets only in the Slurm namespace, the
    scheduler's pod writes only in its tenants' namespaces, Secrets and
    ConfigMaps and Leases only by name."""
    release = f"r{secrets.token_hex(3)}"
    tenant = f"{namespace}-tenant"
    chart = CHARTS / "sunk-cluster"
    grant = [
        f"--set=scheduler.tenants[0].namespaces={{{tenant}}}",
        "--set=scheduler.tenants[0].uids=5000-5099",
        "--set=scheduler.tenants[0].user=5000",
        "--set=gpuPlugin.enabled=true",
    ]
    out = helm.run(["template", release, str(chart), "-n", namespace, *grant])
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"] in RBAC_KINDS]
    made: list[Any] = [await kube.create(Namespace(metadata=ObjectMeta(name=tenant)))]
    try:
        for doc in docs:
            obj = codecs.from_dict(doc)
            where = doc["metadata"].get("namespace", namespace)
            made.append(await kube.create(obj, namespace=where))  # type: ignore[call-overload]
        wrong = []
        for component, verb, resource, where, name, allowed in CAN_I:
            resource, _, subresource = resource.partition("/")
            attributes = {"verb": verb, "resource": resource}
            if subresource:
                attributes["subresource"] = subresource
            if resource == "customresourcedefinitions":
                attributes["group"] = "apiextensions.k8s.io"
            elif resource == "nodesets":
                attributes["group"] = "sunk.dev"
            elif resource == "leases":
                attributes["group"] = "coordination.k8s.io"
            elif resource in ("resourceclaims", "resourceslices", "deviceclasses"):
                attributes["group"] = "resource.k8s.io"
            if where:
                attributes["namespace"] = {"home": namespace, "tenant": tenant}.get(where, where)
            if name:
                attributes["name"] = name.format(release=release)
            account = f"{release}-{component}"
            if await _can(kube, account, namespace, **attributes) != allowed:
                wrong.append(f"{component} {verb} {resource} {where} {name}: not {allowed}")
        assert not wrong, wrong
    finally:
        for obj in made:
            if obj.metadata and isinstance(obj, (ClusterRole, ClusterRoleBinding, Namespace)):
                await kube.delete(type(obj), obj.metadata.name or "")


def test_the_scheduler_follows_the_slurm_releases_kill_wait_which_fits_the_default_grace(
    helm: Helm,
) -> None:
    """One value: slurm.conf's KillWait, which the scheduler reads from the
    slurm release's config ConfigMap; the slurm chart's default takes a pod
    with Kubernetes' default grace period (30 s)."""
    out = helm.run(["template", "rel", str(CHARTS / "sunk-cluster"), "-n", "hpc"])
    (scheduler,) = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "rel-scheduler"
    ]
    args = scheduler["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--slurm-config=hpc/slurm-config" in args
    assert not [a for a in args if a.startswith("--kill-wait")]
    out = helm.run(["template", "slurm", str(CHARTS / "slurm"), "-n", "hpc"])
    (config,) = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "slurm-config"
    ]
    seconds = kill_wait(config["data"]["slurm.conf"])
    assert seconds - Options().grace_margin >= 30, seconds
    with pytest.raises(HelmError, match="killWait"):
        helm.run(
            ["template", "rel", str(CHARTS / "sunk-cluster"), "--set", "scheduler.killWait=60"]
        )


def test_each_component_has_probes_a_budget_and_spread_replicas(helm: Helm) -> None:
    """With the chart's defaults (two replicas each): a PodDisruptionBudget of
    one, replicas preferring different nodes, and for the components with
    /metrics a readiness and a liveness probe on it and a SunkComponentDown
    alert."""
    out = helm.run(["template", "rel", str(CHARTS / "sunk-cluster"), "-n", "hpc"])
    docs = [d for d in yaml.safe_load_all(out) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    budgets = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    for component in ("operator", "syncer", "scheduler", "tokens"):
        deployment = deployments[f"rel-{component}"]
        selector = deployment["spec"]["selector"]
        assert budgets[f"rel-{component}"] == {"maxUnavailable": 1, "selector": selector}
        spec = deployment["spec"]["template"]["spec"]
        (term,) = spec["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["podAffinityTerm"]["labelSelector"] == selector
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        (container,) = spec["containers"]
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        assert container["ports"] == [{"name": "metrics", "containerPort": 9090}]
        services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
        assert services[f"rel-{component}-metrics"]["spec"]["selector"] == selector["matchLabels"]
    (rules,) = [d for d in docs if d["metadata"]["name"] == "rel-prometheus-rules"]
    groups = yaml.safe_load(rules["data"]["sunk.rules.yaml"])["groups"]
    down = [r for g in groups for r in g["rules"] if r.get("alert") == "SunkComponentDown"]
    assert [r["labels"]["component"] for r in down] == ["operator", "syncer", "scheduler", "tokens"]
    assert 'absent(up{namespace="hpc", service="rel-syncer-metrics"})' in down[1]["expr"]
    (refreshed,) = [
        r for g in groups for r in g["rules"] if r.get("alert") == "SunkTokensNotRefreshed"
    ]
    assert 'sunk_tokens_written_timestamp_seconds{namespace="hpc"}) > 1200' in refreshed["expr"]
    one = helm.run(["template", "rel", str(CHARTS / "sunk-cluster"), "--set=operator.replicas=1"])
    budgets_of_one = [
        d for d in yaml.safe_load_all(one) if d and d["kind"] == "PodDisruptionBudget"
    ]
    assert "rel-operator" not in {d["metadata"]["name"] for d in budgets_of_one}


def test_the_gpu_plugin_has_probes_a_metrics_service_and_its_alerts(helm: Helm) -> None:
    """A DaemonSet, one pod a node: SunkComponentDown when none is left, and
    SunkGpuPluginNotServing for one node's plugin that serves nothing."""
    out = helm.run(
        [
            "template",
            "rel",
            str(CHARTS / "sunk-cluster"),
            "-n",
            "hpc",
            "--set=gpuPlugin.enabled=true",
        ]
    )
    docs = [d for d in yaml.safe_load_all(out) if d]
    (plugin,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (container,) = plugin["spec"]["template"]["spec"]["containers"]
    assert "--metrics-port=9090" in container["command"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    selector = plugin["spec"]["selector"]["matchLabels"]
    assert services["rel-gpu-plugin-metrics"]["spec"]["selector"] == selector
    (rules,) = [d for d in docs if d["metadata"]["name"] == "rel-prometheus-rules"]
    groups = yaml.safe_load(rules["data"]["sunk.rules.yaml"])["groups"]
    gpu = {
        r["alert"]: r["expr"]
        for g in groups
        for r in g["rules"]
        if r.get("labels", {}).get("component") == "gpu-plugin"
    }
    assert set(gpu) == {"SunkComponentDown", "SunkGpuPluginNotServing"}
    assert 'sunk_gpu_plugin_serving{namespace="hpc"}) == 0' in gpu["SunkGpuPluginNotServing"]
    off = helm.run(
        ["template", "rel", str(CHARTS / "sunk-cluster"), "--set=gpuPlugin.enabled=true",
         "--set=gpuPlugin.metricsPort=0"]
    )  # fmt: skip
    assert "gpu-plugin-metrics" not in off
    assert "SunkGpuPluginNotServing" not in off


def test_slurmd_pods_request_memory_only_and_are_not_best_effort(helm: Helm) -> None:
    """Requests, so the kubelet does not take them for BestEffort; no CPU
    request (Slurm would lose a whole CPU for it) and no limit (it would cap
    every job on the node)."""
    out = helm.run(["template", "rel", str(CHARTS / "slurm")])
    (nodeset,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "NodeSet"]
    spec = nodeset["spec"]["template"]["spec"]
    containers = spec["containers"] + spec.get("initContainers", [])
    resources = {c["name"]: c.get("resources") or {} for c in containers}
    assert resources["slurmd"] == {"requests": {"memory": "256Mi"}}
    for name, asked in resources.items():
        assert "limits" not in asked, name
        assert "cpu" not in asked.get("requests", {}), name


def test_admins_without_accounting_are_refused_naming_both_values(helm: Helm) -> None:
    """Admins live in slurmdbd: without accounting the admins hook cannot run,
    and the operator and syncer would be refused every drain."""
    with pytest.raises(HelmError) as refused:
        helm.run(["template", "rel", str(CHARTS / "slurm"), "--set", "accounting.enabled=false"])
    assert "admins: Slurm keeps AdminLevel in its accounting database" in str(refused.value)
    assert "accounting.enabled is false" in str(refused.value)
    # With the defaults that need slurmdbd cleared too (they are refused on their own).
    helm.run(
        ["template", "rel", str(CHARTS / "slurm"), "--set", "accounting.enabled=false",
         "--set-json", "admins=[]",
         "--set-json", 'slurmConfig={"PreemptType": null, "PreemptMode": null,'
                       ' "AccountingStorageEnforce": null, "AccountingStorageTRES": null}',
         "--set-json", 'partitions=[{"name": "compute", "nodesets": ["compute"]}]']
    )  # fmt: skip


def test_the_tenancy_values_render_to_what_the_scheduler_reads(helm: Helm) -> None:
    """`scheduler.tenants` becomes the ConfigMap the scheduler parses; the chart's
    schema refuses a uid below 1000 before anything is installed."""
    chart = CHARTS / "sunk-cluster"
    values = chart / "ci" / "all-components-values.yaml"
    out = helm.run(["template", "rel", str(chart), "-f", str(values)])
    (configmap,) = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "rel-scheduler-tenancy"
    ]
    tenancy = parse_tenancy(configmap["data"]["tenancy.yaml"], "the rendered ConfigMap")
    grant = tenancy.grant_for("inference")
    assert grant is not None
    assert (grant.user, grant.accounts, grant.partitions) == (5000, ["inference"], ["k8s"])
    with pytest.raises(HelmError, match="minimum"):
        helm.run(
            [
                "template",
                "rel",
                str(chart),
                "--set-json",
                'scheduler.tenants=[{"namespaces":["a"],"uids":"0","user":0}]',
            ]
        )


# NetworkPolicy as the API defines it (networking.k8s.io/v1): a pod that an
# Ingress policy of its namespace selects accepts only what one of those
# policies' ingress rules allows, and a pod that an Egress policy selects
# connects only where one of those policies' egress rules allows; a flow needs
# both. The bed's CNI (bridge) enforces none, so the flows are checked against
# the rendered policies here; the server-side dry run above shows the
# apiserver accepts them.
Pod_ = tuple[str, dict[str, str]]  # namespace, labels
# A flow's destination: a pod (with its address, or None), or an address
# outside the cluster.
Dest = tuple[Pod_ | None, str | None]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for rule in selector.get("matchExpressions", []):
        key, values = rule["key"], rule.get("values", [])
        held = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[rule["operator"]]
        if not held:
            return False
    return True


def _in_block(block: dict[str, Any], address: str | None) -> bool:
    if address is None:
        return False
    ip = ipaddress.ip_address(address)
    cidr = ipaddress.ip_network(block["cidr"])
    if ip.version != cidr.version or ip not in cidr:
        return False
    return not any(ip in ipaddress.ip_network(e) for e in block.get("except", []))


def _peer_matches(
    peer: dict[str, Any], policy_ns: str, pod: Pod_ | None, address: str | None
) -> bool:
    """Whether `peer` names a pod (by its labels and namespace) or an address.
    An ipBlock is taken to match a pod's address too (implementations differ),
    so that a flow found refused is refused under either reading."""
    if "ipBlock" in peer:
        return _in_block(peer["ipBlock"], address)
    if pod is None:
        return False
    namespace, labels = pod
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}):
            return False
    elif namespace != policy_ns:
        return False
    return _selects(peer.get("podSelector", {}), labels)


def _port_matches(ports: list[dict[str, Any]], port: int, protocol: str) -> bool:
    return not ports or any(
        p.get("protocol", "TCP") == protocol
        and ("port" not in p or p["port"] <= port <= p.get("endPort", p["port"]))
        for p in ports
    )


def _rules_allow(
    policies: list[dict[str, Any]],
    kind: str,
    selected: Pod_,
    peer: Dest,
    port: int,
    protocol: str,
) -> bool:
    namespace, labels = selected
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == namespace
        and kind in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(kind.lower()) or []:
            peers = rule.get("from" if kind == "Ingress" else "to", [])
            if peers and not any(_peer_matches(p, namespace, *peer) for p in peers):
                continue
            if _port_matches(rule.get("ports", []), port, protocol):
                return True
    return False


def _allowed(
    policies: list[dict[str, Any]],
    source: Pod_,
    target: Pod_ | str,
    port: int,
    protocol: str = "TCP",
    address: str | None = None,
) -> bool:
    """Whether `source` may connect to `target` (a pod, at `address` if given,
    or an address outside the cluster) on `port`."""
    if isinstance(target, str):
        return _rules_allow(policies, "Egress", source, (None, target), port, protocol)
    return _rules_allow(
        policies, "Egress", source, (target, address), port, protocol
    ) and _rules_allow(policies, "Ingress", target, (source, None), port, protocol)


def _rendered(helm: Helm, *flags: str) -> tuple[list[dict[str, Any]], dict[str, Pod_]]:
    """Both charts' NetworkPolicies (in namespace hpc) and pods by owner name;
    `flags` for the slurm chart."""
    rendered: list[dict[str, Any]] = []
    for chart, given in (("slurm", flags), ("sunk-cluster", ())):
        out = helm.run(["template", "rel", str(CHARTS / chart), "-n", "hpc", *given])
        rendered += [d for d in yaml.safe_load_all(out) if d]
    policies = [d for d in rendered if d["kind"] == "NetworkPolicy"]
    for policy in policies:
        policy["metadata"].setdefault("namespace", "hpc")
    pods: dict[str, Pod_] = {}
    for doc in rendered:
        template = doc.get("spec", {}).get("template")
        if template:
            pods[doc["metadata"]["name"]] = ("hpc", template["metadata"]["labels"])
    return policies, pods


def test_network_policies_let_slurm_talk_and_keep_tenants_from_its_daemons(
    helm: Helm,
) -> None:
    """The flows Slurm and sunk need are open; a tenant's pod (even one
    labelled like sunk's) reaches no daemon but ssh, and neither a job (it runs
    in a slurmd pod) nor a login user reaches MariaDB or slurmrestd. Egress,
    with the chart's defaults: slurmd and login pods reach DNS, Slurm and (the
    slurmd pods, for container jobs) HTTPS outside the cluster's and private
    ranges, and nothing else: not the cloud's metadata address, sunk's
    /metrics, the apiserver, a tenant's pod, another resolver."""
    policies, pods = _rendered(helm)
    slurm = {
        name: pods[key]
        for name, key in {
            "ctld": "rel-slurmctld",
            "slurmd": "compute",
            "login": "rel-login",
            "dbd": "rel-slurmdbd",
            "restd": "rel-slurmrestd",
            "mariadb": "rel-mariadb",
            "uninstall": "rel-uninstall",
        }.items()
    }
    sunk = [pods[f"rel-{c}"] for c in ("operator", "syncer", "scheduler")]
    tenant: Pod_ = ("team-a", {"app": "web"})
    forged: Pod_ = ("team-a", dict(sunk[0][1]))  # a tenant's pod labelled like sunk's
    dns: Pod_ = ("kube-system", {"k8s-app": "kube-dns"})
    ephemeral = 40_000  # srun, step and PMIx ports
    registry = "198.51.100.7"  # an address on the internet
    jobs = ("slurmd", "login")  # the pods users' programs run in
    needed: list[tuple[Any, ...]] = [
        *((slurm[s], slurm["ctld"], 6817) for s in ("slurmd", "login", "restd", "dbd", "ctld")),
        *(
            (slurm[s], slurm["slurmd"], p)
            for s in ("ctld", "slurmd", "login")
            for p in (6818, ephemeral)
        ),
        *((slurm[s], slurm["login"], ephemeral) for s in ("ctld", "slurmd")),
        *((slurm[s], slurm["dbd"], 6819) for s in ("ctld", "login", "restd", "slurmd")),
        (slurm["dbd"], slurm["mariadb"], 3306),
        *((s, slurm["restd"], 6820) for s in (slurm["uninstall"], *sunk)),
        (tenant, slurm["login"], 22),
        (slurm["login"], slurm["slurmd"], 22),  # ssh into the nodes of one's jobs
        *((slurm[s], dns, 53, proto) for s in jobs for proto in ("UDP", "TCP")),
        (slurm["slurmd"], registry, 443),  # a container job's image
    ]
    refused: list[tuple[Any, ...]] = [
        *((tenant, slurm[t], p) for t, p in (("mariadb", 3306), ("restd", 6820), ("dbd", 6819))),
        *(
            (tenant, slurm[t], p)
            for t, p in (("ctld", 6817), ("slurmd", 6818), ("slurmd", 22), ("login", ephemeral))
        ),
        (forged, slurm["restd"], 6820),
        *((slurm[s], slurm["mariadb"], 3306) for s in ("slurmd", "login", "ctld", "restd")),
        *((slurm[s], slurm["restd"], 6820) for s in ("slurmd", "login")),
        *((s, slurm["mariadb"], 3306) for s in sunk),
        *(
            (slurm[s], *flow)
            for s in jobs
            for flow in (
                ("169.254.169.254", 80),  # the cloud's instance metadata
                ("fd00:ec2::254", 80),
                ("10.96.0.1", 443),  # the apiserver's Service
                ("192.168.1.10", 6443),  # the apiserver on its node
                ("8.8.8.8", 53, "UDP"),  # a resolver not the cluster's
            )
        ),
        (slurm["login"], registry, 443),  # login users get no internet by default
        (slurm["slurmd"], registry, 80),
    ]
    # Pods with their addresses: an ipBlock must not let them through either.
    in_cluster: list[tuple[Any, ...]] = [
        *((slurm[s], tenant, 8080, "TCP", "10.244.2.7") for s in jobs),
        *((slurm[s], pod, 9090, "TCP", "10.244.1.5") for s in jobs for pod in sunk),  # /metrics
    ]
    assert [f for f in needed if not _allowed(policies, *f)] == []
    assert [f for f in refused if _allowed(policies, *f)] == []
    assert [f for f in in_cluster if _allowed(policies, *f)] == []
    # With directory users the in-chart directory, and only it, is reachable.
    ldap, ldap_pods = _rendered(
        helm, "--set=identity.provider=ldap", "--set=identity.ldap.server.enabled=true"
    )
    directory = ldap_pods["rel-ldap"]
    assert all(_allowed(ldap, ldap_pods[p], directory, 1389) for p in ("compute", "rel-login"))
    assert not _allowed(policies, slurm["slurmd"], ("hpc", directory[1]), 1389)
    # Without container jobs, no internet for the slurmd pods; egress can be
    # left open, and an entry dropped or added.
    off, off_pods = _rendered(helm, "--set=containers.enabled=false")
    assert not _allowed(off, off_pods["compute"], registry, 443)
    opened, opened_pods = _rendered(helm, "--set=networkPolicy.egress.enabled=false")
    assert _allowed(opened, opened_pods["compute"], "169.254.169.254", 80)
    mirror = (
        '{"pods": ["login"], "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],'
        ' "ports": [{"port": 443}]}'
    )
    changed, changed_pods = _rendered(
        helm, "--set=networkPolicy.egress.allow.registries=null",
        f"--set-json=networkPolicy.egress.allow.mirror={mirror}",
    )  # fmt: skip
    assert not _allowed(changed, changed_pods["compute"], registry, 443)
    assert _allowed(changed, changed_pods["rel-login"], "10.1.2.3", 443)
    assert not _allowed(changed, changed_pods["compute"], "10.1.2.3", 443)
    with pytest.raises(HelmError, match=r"minItems|minimum|at least"):
        _rendered(helm, '--set-json=networkPolicy.egress.allow.all={"pods": ["slurmd"], "to": []}')
    off = helm.run(["template", "rel", str(CHARTS / "slurm"), "--set=networkPolicy.enabled=false"])
    assert "kind: NetworkPolicy" not in off


TREE_AND_BLOCKS = (
    '{"plugin": "tree", "tree": {"levels": ["topology.kubernetes.io/zone"]},'
    ' "block": {"label": "example.com/nvlink-domain", "sizes": [8]}}'
)


def test_blocks_beside_the_tree_ask_the_operator_for_a_second_topology(helm: Helm) -> None:
    """What the operator is asked for (settings.yaml in the topology ConfigMap):
    the tree as the cluster's default, blocks as a second topology for
    partitions with Topology=block (docs/training.md, "Topology")."""
    out = helm.run(
        ["template", "rel", str(CHARTS / "slurm"), f"--set-json=topology={TREE_AND_BLOCKS}"]
    )
    [configmap] = [
        d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"] == "rel-topology"
    ]
    settings = parse_settings(configmap["data"]["settings.yaml"])
    assert (settings.plugin, settings.also()) == ("tree", "block")
    # topology.conf (24.11) holds one topology: refused, naming the fields.
    with pytest.raises(HelmError, match=r"topology\.tree\.levels and topology\.block\.label"):
        helm.run(
            [
                "template", "rel", str(CHARTS / "slurm"),
                f"--set-json=topology={TREE_AND_BLOCKS}", "--set=topology.file=topology.conf",
            ]
        )  # fmt: skip


def _gpu_pod(
    name: str,
    scheduler: str,
    node: str | None,
    *,
    init: bool = False,
    tolerate: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    container = {
        "name": "c",
        "image": "registry.invalid/pause:1",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    spec: dict[str, Any] = {"schedulerName": scheduler}
    if init:
        spec["initContainers"] = [container]
        spec["containers"] = [{"name": "main", "image": "registry.invalid/pause:1"}]
    else:
        spec["containers"] = [container]
    if node:
        spec["nodeName"] = node
    if tolerate:
        spec["tolerations"] = tolerate
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def dry_run_refusal(kube: AsyncClient, namespace: str, pod: dict[str, Any]) -> str:
    """Why the apiserver refuses to create `pod` (a dry run); "" if it admits it."""
    try:
        await kube.create(codecs.from_dict(pod), namespace=namespace, dry_run=True)  # type: ignore[call-overload]
    except ApiError as error:
        return str(error.status.message)
    return ""


async def install_policy(
    kube: AsyncClient, rendered: str, kind: str, namespace: str, name: str | None = None
) -> list[Any]:
    """The chart's `kind` (an admission policy; the one called `name` where
    there are several) and its binding, from `rendered`, created on the
    apiserver with the binding narrowed to `namespace`, so no other test's
    pods meet it."""
    docs = [
        d
        for d in yaml.safe_load_all(rendered)
        if d
        and d["kind"].startswith(kind)
        and name in (None, d["metadata"]["name"], d["spec"].get("policyName"))
    ]
    assert [d["kind"] for d in docs] == [kind, f"{kind}Binding"]
    docs[1]["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    return [await kube.create(codecs.from_dict(doc)) for doc in docs]  # type: ignore[call-overload]


async def test_gpu_pods_that_could_reach_slurm_must_be_placed_by_sunks_scheduler(
    helm: Helm, kube: AsyncClient, namespace: str
) -> None:
    """`gpuPlugin.admissionPolicy`, installed on the real apiserver (its binding
    narrowed to this test's namespace, so no other test's pods meet it).
    Where the scheduler serves the namespace: a pod asking for GPUs with
    another scheduler or its own nodeName is refused when created, naming the
    field and why; through sunk's scheduler it is admitted, and so is a pod
    asking for no GPU. Where it does not: another team's GPU pod is admitted,
    unless it tolerates sunk's node lock (it could run on a Slurm node)."""
    lock = [{"key": TAINT_NODE_LOCK, "operator": "Exists"}]
    everything = [{"operator": "Exists"}]

    def refusal(pod: dict[str, Any]) -> Awaitable[str]:
        return dry_run_refusal(kube, namespace, pod)

    # Not served first: a deleted policy lingers a moment in the apiserver, and
    # this one refuses nothing the served round expects admitted.
    for served in (False, True):
        release = f"r{secrets.token_hex(3)}"
        grant = [
            "--set-string=scheduler.tenants[0].uids=5000",
            "--set=scheduler.tenants[0].user=5000",
        ]
        tenant = namespace if served else f"{namespace}-other"
        out = helm.run(
            ["template", release, str(CHARTS / "sunk-cluster"), "-n", namespace,
             "--set=gpuPlugin.enabled=true", "--set=componentPolicies.enabled=false",
             f"--set=scheduler.tenants[0].namespaces={{{tenant}}}", *grant]
        )  # fmt: skip
        made = await install_policy(
            kube, out, "ValidatingAdmissionPolicy", namespace, f"{release}-gpu-pods"
        )
        try:
            # The apiserver takes the policy in a moment after it is created.
            deadline = time.monotonic() + 30
            probe = _gpu_pod("probe", "default-scheduler", None, tolerate=None if served else lock)
            while not await refusal(probe):
                assert time.monotonic() < deadline, "the policy never took effect"
                await asyncio.sleep(0.5)
            if served:
                elsewhere = await refusal(_gpu_pod("a", "default-scheduler", None))
                assert (
                    "spec.schedulerName: a pod asking for nvidia.com/gpu must be placed by"
                    in elsewhere
                )
                assert f"not by default-scheduler: namespace {namespace} is served by" in elsewhere
                pinned = await refusal(_gpu_pod("b", "sunk-scheduler", "some-node"))
                assert "spec.nodeName: a pod asking for nvidia.com/gpu may not name" in pinned
                assert await refusal(_gpu_pod("c", "default-scheduler", None, init=True))
                assert await refusal(_gpu_pod("d", "sunk-scheduler", None)) == ""
                plain = _gpu_pod("e", "default-scheduler", "some-node")
                plain["spec"]["containers"][0]["resources"] = {}
                assert await refusal(plain) == ""
            else:
                # Another team's GPU pods, placed by anyone, pinned or not.
                assert await refusal(_gpu_pod("f", "default-scheduler", None)) == ""
                assert await refusal(_gpu_pod("g", "default-scheduler", "gpu-node-9")) == ""
                for tolerations in (lock, everything):
                    said = await refusal(
                        _gpu_pod("h", "default-scheduler", None, tolerate=tolerations)
                    )
                    assert "it tolerates sunk's node lock (sunk.dev/slurm-job)" in said, said
                pinned = await refusal(_gpu_pod("i", "sunk-scheduler", "n1", tolerate=lock))
                assert "spec.nodeName: a pod asking for nvidia.com/gpu may not name" in pinned
        finally:
            for obj in reversed(made):
                await kube.delete(type(obj), obj.metadata.name)


async def test_slurm_gpu_nodes_take_no_pod_that_skips_slurm(
    helm: Helm, kube: AsyncClient, namespace: str
) -> None:
    """The chart's two other GPU policies, installed on the real apiserver
    (bindings narrowed to this test's namespace), with two Node objects, one
    labelled as `gpuPlugin.nodeSelector` picks GPU nodes. Outside the Slurm
    namespace: a pod naming the GPU node is refused, naming the field, the
    node and the way in; one naming the other node, or none, is admitted; a
    pod asking for `sunk.dev/node-gpus` is refused. In the Slurm namespace: a
    NodeSet's pod may ask for every GPU and name the GPU node; another pod
    may not ask for every GPU."""
    token = secrets.token_hex(3)
    gpu_node, other_node = f"gpu-{token}", f"cpu-{token}"
    for name, labels in ((gpu_node, {"sunk-test/gpu": token}), (other_node, {})):
        await kube.create(Node.from_dict({"metadata": {"name": name, "labels": labels}}))

    def refusal(pod: dict[str, Any]) -> Awaitable[str]:
        return dry_run_refusal(kube, namespace, pod)

    def pod(
        name: str, node: str | None = None, *, every_gpu: bool = False, nodeset: bool = False
    ) -> dict[str, Any]:
        body = _sunk_pod(name, {"nodeName": node} if node else {})
        if every_gpu:
            body["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE_NODE_GPUS: "1"}}
        if nodeset:
            owner = {"apiVersion": "sunk.dev/v1alpha1", "kind": "NodeSet", "name": "gpu",
                     "uid": "00000000-0000-0000-0000-000000000001", "controller": True}  # fmt: skip
            body["metadata"]["ownerReferences"] = [owner]
        return body

    # The Slurm namespace first: its policies refuse nothing the round
    # outside it admits (a deleted policy lingers a moment in the apiserver).
    try:
        for slurm_namespace in (namespace, f"{namespace}-slurm"):
            release = f"r{secrets.token_hex(3)}"
            out = helm.run(
                ["template", release, str(CHARTS / "sunk-cluster"), "-n", namespace,
                 "--set=gpuPlugin.enabled=true", "--set=componentPolicies.enabled=false",
                 f"--set=slurm.namespace={slurm_namespace}",
                 f"--set-string=gpuPlugin.nodeSelector.sunk-test/gpu={token}"]
            )  # fmt: skip
            made = []
            for policy in (f"{release}-node-gpus", f"{release}-slurm-gpu-nodes"):
                made += await install_policy(
                    kube, out, "ValidatingAdmissionPolicy", namespace, policy
                )
            try:
                deadline = time.monotonic() + 30
                # Refused by this round's policy alone (not the last one's).
                inside = slurm_namespace == namespace
                probe = pod("probe", every_gpu=True, nodeset=not inside)
                while not await refusal(probe):
                    assert time.monotonic() < deadline, "the policy never took effect"
                    await asyncio.sleep(0.5)
                said = await refusal(pod("a", every_gpu=True))
                assert (
                    f"{RESOURCE_NODE_GPUS} (every GPU of a node) goes only to a NodeSet's" in said
                )
                if inside:
                    assert await refusal(pod("b", gpu_node, every_gpu=True, nodeset=True)) == ""
                    continue
                assert "goes only to a NodeSet's" in await refusal(
                    pod("c", every_gpu=True, nodeset=True)
                )
                # The Nodes are the policy's params: the apiserver takes them in a moment.
                while not (said := await refusal(pod("d", gpu_node))):
                    assert time.monotonic() < deadline, "the GPU node never refused a pod"
                    await asyncio.sleep(0.5)
                assert said.endswith(
                    f"spec.nodeName: node {gpu_node} is a Slurm GPU node (sunk's GPU plugin "
                    "runs there); a pod runs there only through Slurm: name sunk-scheduler as "
                    f"its schedulerName and no node, or create it in namespace {slurm_namespace}"
                ), said
                assert await refusal(pod("e", other_node)) == ""
                assert await refusal(pod("f")) == ""
            finally:
                for obj in reversed(made):
                    await kube.delete(type(obj), obj.metadata.name)
    finally:
        for name in (gpu_node, other_node):
            await kube.delete(Node, name)


async def test_a_claim_is_allocated_on_a_slurm_gpu_node_only_by_sunks_scheduler(
    helm: Helm, kube: AsyncClient, namespace: str
) -> None:
    """The chart's DRA policy, installed on the real apiserver (its binding
    narrowed to this test's namespace), with two Node objects, one labelled
    as `gpuPlugin.nodeSelector` picks GPU nodes. Allocating a claim on the
    GPU node as anyone but sunk's scheduler (here the admin, as Kubernetes'
    scheduler would) is refused, naming the field and the node; on the other
    node it is admitted; a driver's status write that allocates nothing new
    is admitted on the GPU node. (sunk's scheduler allocating there is
    tests/charts/test_local_up_gpus.py's DRA test, on the default install.)"""
    token = secrets.token_hex(3)
    gpu_node, other_node = f"gpu-{token}", f"cpu-{token}"
    for name, labels in ((gpu_node, {"sunk-test/gpu": token}), (other_node, {})):
        await kube.create(Node.from_dict({"metadata": {"name": name, "labels": labels}}))
    release = f"r{secrets.token_hex(3)}"
    out = helm.run(
        ["template", release, str(CHARTS / "sunk-cluster"), "-n", namespace,
         "--set=gpuPlugin.enabled=true", "--set=componentPolicies.enabled=false",
         f"--set-string=gpuPlugin.nodeSelector.sunk-test/gpu={token}"]
    )  # fmt: skip
    made: list[Any] = []

    def allocated_on(node: str) -> dict[str, Any]:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        result = {"request": "gpus", "driver": "gpu.example.com", "pool": node, "device": "gpu-0"}
        return {
            "status": {
                "allocation": {
                    "devices": {"results": [result]},
                    "nodeSelector": {"nodeSelectorTerms": [term]},
                }
            }
        }

    async def allocate(claim: str, node: str) -> str:
        """Why the apiserver refuses the allocation; "" once it is made."""
        try:
            await kube.patch(
                ResourceClaim.Status,
                claim,
                allocated_on(node),
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as error:
            return str(error.status.message)
        return ""

    try:
        claims = []
        for i in range(3):
            claim = ResourceClaim.from_dict(
                {
                    "metadata": {"name": f"c{i}-{token}", "namespace": namespace},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpus", "exactly": {"deviceClassName": "gpu.example.com"}}
                            ]
                        }
                    },
                }
            )
            await kube.create(claim)
            claims.append(f"c{i}-{token}")
        # Allocated there before the policy, as by sunk's scheduler.
        assert await allocate(claims[2], gpu_node) == ""
        made = await install_policy(
            kube, out, "ValidatingAdmissionPolicy", namespace, f"{release}-slurm-gpu-claims"
        )
        deadline = time.monotonic() + 30
        # The Nodes are the policy's params: the apiserver takes them in a moment.
        while not (said := await allocate(claims[0], gpu_node)):
            assert time.monotonic() < deadline, "the GPU node never refused an allocation"
            await kube.patch(
                ResourceClaim.Status,
                claims[0],
                {"status": {"allocation": None}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
            await asyncio.sleep(0.5)
        assert said.endswith(
            f"status.allocation: node {gpu_node} is a Slurm GPU node (sunk's GPU plugin runs "
            "there); its devices are allocated by sunk-scheduler with the GPUs of the pod's "
            "Slurm job: name it as the pod's schedulerName"
        ), said
        assert await allocate(claims[1], other_node) == ""
        # A driver's status write on a claim allocated there (its device's
        # state) allocates nothing new.
        device = {"driver": "gpu.example.com", "pool": gpu_node, "device": "gpu-0"}
        await kube.patch(
            ResourceClaim.Status,
            claims[2],
            {"status": {"devices": [{**device, "data": {"ready": True}}]}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    finally:
        for obj in reversed(made):
            await kube.delete(type(obj), obj.metadata.name)
        for name in (gpu_node, other_node):
            await kube.delete(Node, name)


def _sunk_pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    spec = {"containers": [{"name": "c", "image": "registry.invalid/pause:1"}], **spec}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def test_pods_for_sunks_scheduler_get_the_lock_toleration_when_created(
    helm: Helm, kube: AsyncClient, namespace: str
) -> None:
    """`scheduler.lockTolerationPolicy`, installed on the real apiserver (its
    binding narrowed to this test's namespace): a pod naming sunk's scheduler
    gets the node lock's toleration as it is created, so the scheduler has no
    PATCH to send before its bind; a pod that tolerates it already, names its
    own node or another scheduler is left as it is. Without the API (an older
    cluster) nothing is rendered and the scheduler's PATCH stays."""
    release = f"r{secrets.token_hex(3)}"
    chart = str(CHARTS / "sunk-cluster")
    older = helm.run(["template", release, chart, "-n", namespace])
    assert "MutatingAdmissionPolicy" not in older
    api = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
    out = helm.run(["template", release, chart, "-n", namespace, "--api-versions", api])
    made = await install_policy(kube, out, "MutatingAdmissionPolicy", namespace)
    lock = {"key": TAINT_NODE_LOCK, "operator": "Exists"}

    async def tolerations(spec: dict[str, Any]) -> list[dict[str, Any]]:
        pod = _sunk_pod(f"p{secrets.token_hex(3)}", spec)
        created = await kube.create(codecs.from_dict(pod), namespace=namespace, dry_run=True)  # type: ignore[call-overload]
        return [t.to_dict() for t in created.spec.tolerations or []]

    try:
        # The apiserver takes the policy in a moment after it is created.
        deadline = time.monotonic() + 30
        while lock not in await tolerations({"schedulerName": "sunk-scheduler"}):
            assert time.monotonic() < deadline, "the policy never took effect"
            await asyncio.sleep(0.5)
        own = {"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        placed = await tolerations({"schedulerName": "sunk-scheduler", "tolerations": [own]})
        assert own in placed
        assert lock in placed
        everything = {"operator": "Exists"}
        assert await tolerations(
            {"schedulerName": "sunk-scheduler", "tolerations": [everything]}
        ) == [everything]
        assert lock not in await tolerations({"schedulerName": "sunk-scheduler", "nodeName": "n1"})
        assert lock not in await tolerations({})
    finally:
        for obj in reversed(made):
            await kube.delete(type(obj), obj.metadata.name)
