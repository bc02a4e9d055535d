"""Each component's ServiceAccount held to its job, field by field, by the
sunk-cluster chart's ValidatingAdmissionPolicies (`componentPolicies`).

RBAC grants verbs on kinds; what a stolen token can do with them is shown
here by using one: the chart's RBAC and policies installed on the real
apiserver, then every call made with a token of the component's own
ServiceAccount (TokenRequest), as the component makes it and as an attacker
holding that token would. The slurmd pod is the slurm chart's NodeSet (its
defaults, as release `slurm`) built by the operator's own pod builder.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from lightkube import ApiError, AsyncClient, codecs
from lightkube.models.core_v1 import NodeSpec, NodeStatus, Taint
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import ValidatingAdmissionPolicy
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

from sunk.api import (
    ANNOTATION_SLURMD_CONF,
    ANNOTATION_SLURMD_GPUS,
    ANNOTATION_SLURMD_REGISTRATION,
)
from sunk.api import nodeset as nodeset_api
from sunk.api.install import install_crds
from sunk.kube.raw import bind_pod, delete_pod
from sunk.nodeset.pods import NodeSetRef, build_pod, template_hash
from sunk.scheduler.pod_writes import (
    lock_toleration_patch,
    pending_job_patch,
    slurm_gpus_patch,
    unschedulable_patch,
)
from sunk_testbed import charts
from sunk_testbed.control_plane import KubeAccess, async_client
from sunk_testbed.helm import CHARTS, Helm, ensure_helm

pytestmark = pytest.mark.contract

# The chart's defaults (componentPolicies.slurmdPods) name this release's Secrets.
SLURM_RELEASE = "slurm"
SCHEDULER = "sunk-scheduler"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
FOREIGN_IMAGE = "docker.io/library/busybox:1.37"


@dataclass
class Installed:
    kube: AsyncClient
    namespace: str  # the release's, also the Slurm one
    tenant: str  # a namespace the scheduler serves
    release: str
    nodeset: dict[str, Any]  # the slurm chart's NodeSet, as created
    slurmd: Pod  # a proper slurmd pod of it, as the operator builds it
    operator: AsyncClient
    syncer: AsyncClient
    scheduler: AsyncClient
    kube_access: KubeAccess
    scratch: Path


async def refusal(call: Awaitable[Any]) -> str:
    """The apiserver's refusal of `call`, "" if it was done."""
    try:
        await call
    except ApiError as error:
        return str(error.status.message)
    return ""


def _pod(doc: dict[str, Any]) -> Pod:
    pod = codecs.from_dict(doc)
    assert isinstance(pod, Pod)
    return pod


async def _wait_for(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    """The apiserver takes a policy in a moment after it is created."""
    deadline = time.monotonic() + 30
    while not await check():
        assert time.monotonic() < deadline, f"{what}: never took effect"
        await asyncio.sleep(0.5)


async def _apply(kube: AsyncClient, docs: list[dict[str, Any]], namespace: str) -> list[Any]:
    made = []
    for doc in docs:
        where = doc["metadata"].get("namespace", namespace)
        obj = codecs.from_dict(doc)
        made.append(await kube.create(obj, namespace=where))  # type: ignore[call-overload]
    return made


@pytest_asyncio.fixture(scope="module")
async def installed(
    kube: AsyncClient, kube_access: KubeAccess, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Installed]:
    """sunk-cluster's RBAC and policies, from `helm template` with its
    defaults, in a namespace of their own (with a tenant namespace the
    scheduler serves); the slurm chart's NodeSet there; a client for each
    component with a token of its ServiceAccount."""
    scratch = tmp_path_factory.mktemp("policies")
    helm = Helm(ensure_helm(print), None, scratch / "helm")
    suffix = secrets.token_hex(3)
    namespace, tenant, release = f"t-policies-{suffix}", f"t-policies-{suffix}-tenant", f"r{suffix}"
    grant = [
        f"--set=scheduler.tenants[0].namespaces={{{tenant}}}",
        "--set=scheduler.tenants[0].uids=5000-5099",
        "--set=scheduler.tenants[0].user=5000",
    ]
    chart = str(CHARTS / "sunk-cluster")
    # The GPU plugin (off by default) on, for its own policy: nothing else
    # the chart renders depends on it.
    out = helm.run(
        ["template", release, chart, "-n", namespace, *grant, "--set=gpuPlugin.enabled=true"]
    )
    docs = [d for d in yaml.safe_load_all(out) if d]
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    policies = [d for d in docs if d["kind"] in POLICY_KINDS]
    slurm = helm.run(["template", SLURM_RELEASE, str(CHARTS / "slurm"), "-n", namespace])
    (nodeset_doc,) = [d for d in yaml.safe_load_all(slurm) if d and d["kind"] == "NodeSet"]

    await install_crds(kube)
    nodeset_api.resource()  # registers the kind with lightkube's codecs
    made: list[Any] = []
    for name in (namespace, tenant):
        made.append(await kube.create(Namespace(metadata=ObjectMeta(name=name))))
    clients: list[AsyncClient] = []
    try:
        made += await _apply(kube, rbac, namespace)
        made += await _apply(kube, policies, namespace)
        created = await kube.create(codecs.from_dict(nodeset_doc), namespace=namespace)  # type: ignore[call-overload]
        nodeset = created.to_dict()
        spec = nodeset_api.NodeSetSpec.model_validate(nodeset["spec"])
        ref = NodeSetRef(namespace, nodeset["metadata"]["name"], nodeset["metadata"]["uid"])
        node = Node(
            metadata=ObjectMeta(name="n1"),
            status=NodeStatus(allocatable={"cpu": "4", "memory": "8Gi"}),
        )
        slurmd = build_pod(ref, spec, node, template_hash(spec))
        for component in ("operator", "syncer", "scheduler"):
            path = await charts.service_account_kubeconfig(
                kube,
                kube_access.server,
                kube_access.ca_file,
                namespace,
                f"{release}-{component}",
                scratch / f"{component}.kubeconfig",
            )
            clients.append(async_client(path, field_manager=f"sunk-{component}"))
        operator, syncer, scheduler = clients
        yield Installed(
            kube,
            namespace,
            tenant,
            release,
            nodeset,
            slurmd,
            operator,
            syncer,
            scheduler,
            kube_access,
            scratch,
        )
    finally:
        for client in clients:
            await client.close()
        for name in (namespace, tenant):
            await kube.deletecollection(Pod, namespace=name, grace_period=0)
        for obj in reversed(made):
            if obj.metadata and not obj.metadata.namespace:  # the rest goes with its namespace
                await kube.delete(type(obj), obj.metadata.name)


async def test_the_policies_compile_and_type_check_without_a_warning(
    installed: Installed,
) -> None:
    """Each policy as the apiserver checked it against the kinds it matches:
    no expression that names a field those kinds lack (which would refuse
    every request it matches at run time)."""
    names = [
        f"{installed.release}-{name}"
        for name in (
            "operator-pods",
            "operator-nodesets",
            "operator-pod-updates",
            "syncer-pods",
            "syncer-nodes",
            "scheduler-pods",
            "scheduler-bindings",
            "gpu-plugin-nodes",
        )
    ]

    async def checked() -> bool:
        for name in names:
            policy = await installed.kube.get(ValidatingAdmissionPolicy, name)
            if not policy.status or policy.status.observedGeneration != policy.metadata.generation:  # type: ignore[union-attr]
                return False
        return True

    await _wait_for("type checking", checked)
    for name in names:
        policy = await installed.kube.get(ValidatingAdmissionPolicy, name)
        assert policy.status is not None
        warnings = (
            policy.status.typeChecking.expressionWarnings if policy.status.typeChecking else []
        )
        assert not warnings, f"{name}: {warnings}"


async def test_the_operator_makes_slurmd_pods_and_no_other(installed: Installed) -> None:
    """As the operator's ServiceAccount: the slurm chart's slurmd pod, as the
    operator builds it, is created; the same pod mounting the JWT key (as a
    volume, a projected source, an env var), sunk's token Secrets, a host
    path, a foreign image, another ServiceAccount, a privileged container, the
    node's PID namespace, a CSI volume, or owned by no NodeSet is refused,
    naming what; it deletes slurmd pods and no other pod."""
    operator, namespace = installed.operator, installed.namespace
    good = installed.slurmd.to_dict()
    jwt = f"{SLURM_RELEASE}-jwt"

    async def create(change: Callable[[dict[str, Any]], None]) -> str:
        doc = copy.deepcopy(good)
        doc["metadata"]["name"] = f"probe-{secrets.token_hex(3)}"
        change(doc)
        return await refusal(operator.create(_pod(doc), namespace=namespace, dry_run=True))

    def volume(entry: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        return lambda doc: doc["spec"]["volumes"].append(entry)

    def slurmd(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        def apply(doc: dict[str, Any]) -> None:
            (container,) = [c for c in doc["spec"]["containers"] if c["name"] == "slurmd"]
            change(container)

        return apply

    def no_owner(doc: dict[str, Any]) -> None:
        del doc["metadata"]["ownerReferences"]

    def other_owner(doc: dict[str, Any]) -> None:
        doc["metadata"]["ownerReferences"][0].update(apiVersion="apps/v1", kind="ReplicaSet")

    env_from_jwt = {"name": "K", "valueFrom": {"secretKeyRef": {"name": jwt, "key": "k"}}}
    tenant_tokens = f"{installed.release}-scheduler-tenant-tokens"
    projected = {"name": "k", "projected": {"sources": [{"secret": {"name": jwt}}]}}
    claim = {"name": "v", "persistentVolumeClaim": {"claimName": "slurm-state"}}
    csi = {"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}
    lookalike = "ghcr.io/sunk-dev/slurm-x:1"
    other_account = f"{installed.release}-scheduler"
    secret_volume = "a Secret no slurmd pod mounts"
    secret_env = "spec.containers: slurmd: env from a Secret no slurmd pod reads"
    privileged = "spec.containers: slurmd: privileged, or a capability beyond"
    not_owned = "the operator creates and deletes only pods a NodeSet (sunk.dev) owns"

    def add_capability(container: dict[str, Any]) -> None:
        container["securityContext"]["capabilities"]["add"].append("SYS_PTRACE")

    cases: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
        ("the JWT key as a volume", volume({"name": "k", "secret": {"secretName": jwt}}),
         f"spec.volumes: k: {secret_volume}"),
        ("the JWT key projected", volume(projected), f"spec.volumes: k: {secret_volume}"),
        ("sunk's tenant tokens", volume({"name": "t", "secret": {"secretName": tenant_tokens}}),
         f"spec.volumes: t: {secret_volume}"),
        ("the JWT key in env", slurmd(lambda c: c.setdefault("env", []).append(env_from_jwt)),
         secret_env),
        ("a Secret as envFrom", slurmd(lambda c: c.update(envFrom=[{"secretRef": {"name": jwt}}])),
         secret_env),
        ("the node's root", volume({"name": "h", "hostPath": {"path": "/"}}),
         "spec.volumes: hostPath / is none a slurmd pod mounts"),
        ("a foreign image", slurmd(lambda c: c.update(image=FOREIGN_IMAGE)),
         f"spec.containers: image {FOREIGN_IMAGE} is none a slurmd pod may run"),
        ("an image named like the chart's", slurmd(lambda c: c.update(image=lookalike)),
         f"image {lookalike} is none a slurmd pod may run"),
        ("a CSI volume", volume(csi), "spec.volumes: c: a volume source no slurmd pod uses"),
        ("a claim not listed", volume(claim),
         "spec.volumes: claim slurm-state is none a slurmd pod mounts"),
        ("a privileged container", slurmd(lambda c: c["securityContext"].update(privileged=True)),
         privileged),
        ("another capability", slurmd(add_capability), privileged),
        ("the node's PIDs", lambda doc: doc["spec"].update(hostPID=True),
         "spec.hostNetwork, hostPID, hostIPC: a slurmd pod shares no namespace of its node"),
        ("the scheduler's ServiceAccount",
         lambda doc: doc["spec"].update(serviceAccountName=other_account),
         "spec.serviceAccountName: a slurmd pod runs as its namespace's default ServiceAccount"),
        ("no owner", no_owner, not_owned),
        ("another controller", other_owner, not_owned),
    ]  # fmt: skip

    # The policies take effect a moment after they are created.
    await _wait_for("the operator's policy", lambda: _refused(create(cases[0][1])))
    wrong = []
    for what, change, expected in cases:
        if expected not in (got := await create(change)):
            wrong.append(f"{what}: {got or 'created'}")
    assert not wrong, "\n".join(wrong)

    # The proper one, for real: the other tests write it.
    assert await refusal(operator.create(installed.slurmd, namespace=namespace)) == ""
    bystander = _pod({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bystander"},
        "spec": {"containers": [{"name": "c", "image": FOREIGN_IMAGE}]},
    })  # fmt: skip
    await installed.kube.create(bystander, namespace=namespace)
    gone = await refusal(operator.delete(Pod, "bystander", namespace=namespace, dry_run=True))
    assert "the operator creates and deletes only pods a NodeSet" in gone
    name = installed.slurmd.metadata.name  # type: ignore[union-attr]
    assert await refusal(operator.delete(Pod, name, namespace=namespace, dry_run=True)) == ""


async def _refused(call: Awaitable[str]) -> bool:
    return bool(await call)


async def test_the_operator_leaves_a_nodesets_spec_alone(installed: Installed) -> None:
    """It writes a NodeSet's finalizer (and status) as it does; a change of the
    spec, where the pods' template is, is refused."""
    operator, namespace = installed.operator, installed.namespace
    resource, name = nodeset_api.resource(), installed.nodeset["metadata"]["name"]
    finalizer = {"metadata": {"finalizers": ["sunk.dev/slurm-nodes"]}}

    async def patch(body: dict[str, Any]) -> str:
        return await refusal(
            operator.patch(
                resource, name, body, namespace=namespace, patch_type=PatchType.MERGE, dry_run=True
            )
        )

    slurmd = {"name": "slurmd", "image": FOREIGN_IMAGE}
    template = {"spec": {"template": {"spec": {"containers": [slurmd]}}}}
    await _wait_for("the NodeSet policy", lambda: _refused(patch(template)))
    assert "spec: the operator may not change a NodeSet's spec" in await patch(template)
    assert await patch(finalizer) == ""
    status = {"status": {"observedGeneration": 1}}
    assert (
        await refusal(
            operator.patch(
                resource.Status, name, status, namespace=namespace, patch_type=PatchType.MERGE
            )
        )
        == ""
    )


async def _slurmd_pod(installed: Installed) -> Pod:
    name = installed.slurmd.metadata.name  # type: ignore[union-attr]
    try:
        return await installed.kube.get(Pod, name, namespace=installed.namespace)
    except ApiError:
        # Alone (-k): the admin creates it; the operator's test shows it may too.
        return await installed.kube.create(installed.slurmd, namespace=installed.namespace)


async def test_the_operator_changes_only_a_slurmd_pods_conf_and_registration(
    installed: Installed,
) -> None:
    """As the operator's ServiceAccount, on a slurmd pod: the annotations that
    have its node register anew (the NodeSet controller's patch) are written;
    its image, another annotation or a label are not, nor anything on a pod
    no NodeSet owns."""
    operator, namespace = installed.operator, installed.namespace
    pod = await _slurmd_pod(installed)
    name = pod.metadata.name  # type: ignore[union-attr]

    async def patch(body: dict[str, Any], on: str = name) -> str:
        return await refusal(
            operator.patch(
                Pod, on, body, namespace=namespace, patch_type=PatchType.STRATEGIC, dry_run=True
            )
        )

    image = {"spec": {"containers": [{"name": "slurmd", "image": FOREIGN_IMAGE}]}}
    await _wait_for("the operator's pod update policy", lambda: _refused(patch(image)))
    assert "spec: the operator may not change a pod's spec" in await patch(image)
    again = {
        "metadata": {
            "annotations": {
                ANNOTATION_SLURMD_CONF: "Feature=compute Gres=gpu:3",
                ANNOTATION_SLURMD_REGISTRATION: "1",
                ANNOTATION_SLURMD_GPUS: "0,2,3",
            }
        }
    }
    assert await patch(again) == ""
    other = {"metadata": {"annotations": {"example.com/x": "1"}}}
    assert "may not change example.com/x" in await patch(other)
    label = {"metadata": {"labels": {"sunk.dev/nodeset": "other"}}}
    assert "may not change sunk.dev/nodeset" in await patch(label)
    bystander = _pod({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-slurmd"},
        "spec": {"containers": [{"name": "c", "image": FOREIGN_IMAGE}]},
    })  # fmt: skip
    await installed.kube.create(bystander, namespace=namespace)
    assert "the operator changes only slurmd pods" in await patch(again, on="not-slurmd")


async def test_the_syncer_changes_only_its_mirror_on_slurmd_pods(installed: Installed) -> None:
    """As the syncer's ServiceAccount, on a slurmd pod: its labels, annotations
    and Slurm conditions are written (the patches the syncer sends); its image,
    another label or annotation, its owner, its IP or another condition are
    not, nor anything on a pod no NodeSet owns."""
    syncer, namespace = installed.syncer, installed.namespace
    pod = await _slurmd_pod(installed)
    name = pod.metadata.name  # type: ignore[union-attr]

    async def patch(body: dict[str, Any], *, status: bool = False, on: str = name) -> str:
        return await refusal(
            syncer.patch(
                Pod.Status if status else Pod, on, body, namespace=namespace,
                patch_type=PatchType.STRATEGIC, dry_run=True,
            )
        )  # fmt: skip

    image = {"spec": {"containers": [{"name": "slurmd", "image": FOREIGN_IMAGE}]}}
    await _wait_for("the syncer's policy", lambda: _refused(patch(image)))
    assert "spec: the syncer may not change a pod's spec" in await patch(image)

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    mirror = {
        "metadata": {
            "labels": {"sunk.dev/slurm-drain": "false", "sunk.dev/slurm-busy": "true"},
            "annotations": {"sunk.dev/slurm-state": "ALLOCATED", "sunk.dev/slurm-reason": None},
        }
    }
    assert await patch(mirror) == ""
    conditions = [
        {"type": kind, "status": "False", "reason": "NotDrained", "message": "",
         "lastTransitionTime": now}
        for kind in ("SlurmDrain", "SlurmDown", "SlurmNotResponding", "SlurmAllocated",
                     "SlurmSynced")
    ]  # fmt: skip
    assert await patch({"status": {"conditions": conditions}}, status=True) == ""

    component = {"metadata": {"labels": {"app.kubernetes.io/component": "login"}}}
    assert "metadata.labels: the syncer may not change app.kubernetes.io/component" in await patch(
        component
    )
    # The status subresource writes labels too.
    assert "metadata.labels: the syncer may not change" in await patch(component, status=True)
    other = {"metadata": {"annotations": {"example.com/note": "x"}}}
    assert "metadata.annotations: the syncer may not change example.com/note" in await patch(other)
    assert "metadata.ownerReferences" in await patch({"metadata": {"ownerReferences": None}})
    ip = {"status": {"podIP": "10.9.9.9", "podIPs": [{"ip": "10.9.9.9"}]}}
    assert "status.podIP" in await patch(ip, status=True)
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": now}
    ready = {"status": {"conditions": [ready]}}
    assert "status.conditions: the syncer may change only its own condition types" in await patch(
        ready, status=True
    )

    bystander = _pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "looks-like-slurmd", "labels": {"sunk.dev/nodeset": "compute"}},
        "spec": {"containers": [{"name": "c", "image": FOREIGN_IMAGE}]},
    })  # fmt: skip
    await installed.kube.create(bystander, namespace=namespace)
    assert "the syncer writes only slurmd pods" in await patch(mirror, on="looks-like-slurmd")


async def test_the_syncer_changes_only_its_mirror_and_lock_on_nodes(installed: Installed) -> None:
    """As the syncer's ServiceAccount, on a node: its labels, annotations,
    Slurm conditions and the node lock's taint are written (as the syncer
    sends them); another taint, a cordon, another label, the node's
    addresses are refused."""
    kube, syncer = installed.kube, installed.syncer
    name = f"{installed.namespace}-node"
    dedicated = {"key": "example.com/dedicated", "value": "x", "effect": "NoSchedule"}
    node = await kube.create(
        Node(metadata=ObjectMeta(name=name), spec=NodeSpec(taints=[Taint(**dedicated)]))
    )
    try:

        async def patch(
            body: Any, *, status: bool = False, kind: PatchType = PatchType.STRATEGIC
        ) -> str:
            return await refusal(
                syncer.patch(
                    Node.Status if status else Node, name, body, patch_type=kind, dry_run=True
                )
            )

        async def taints(wanted: list[dict[str, Any]]) -> str:
            """The syncer's own write: the whole list, guarded by the
            resourceVersion read (the node controller's taints stay)."""
            for _ in range(20):
                current = await kube.get(Node, name)
                assert current.metadata is not None
                assert current.spec is not None
                # In the order they stand, as the syncer writes them: the node
                # controller's and the wanted ones that are there, then the rest.
                keys = {w["key"] for w in wanted}
                kept = [
                    t.to_dict()
                    for t in current.spec.taints or []
                    if t.key.startswith("node.kubernetes.io/") or t.key in keys
                ]
                added = [w for w in wanted if w["key"] not in {t["key"] for t in kept}]
                body = [
                    {"op": "test", "path": "/metadata/resourceVersion",
                     "value": current.metadata.resourceVersion},
                    {"op": "replace", "path": "/spec/taints", "value": [*kept, *added]},
                ]  # fmt: skip
                got = await patch(body, kind=PatchType.JSON)
                if "error in our request" not in got:  # the test op: changed meanwhile
                    return got
            raise AssertionError(f"node {name} kept changing")

        lock = {"key": "sunk.dev/slurm-job", "effect": "NoExecute"}

        async def taint_refused() -> bool:
            return "spec.taints: the syncer may change only the node lock's" in await taints([])

        await _wait_for("the syncer's node policy", taint_refused)
        assert await taints([dedicated, lock]) == ""
        mirror = {
            "metadata": {
                "labels": {"sunk.dev/slurm-drain": "true", "sunk.dev/slurm-busy": "false"},
                "annotations": {"sunk.dev/slurm-state": "IDLE+DRAIN", "sunk.dev/slurm-reason": "x"},
            }
        }
        assert await patch(mirror) == ""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        drained = {"type": "SlurmDrain", "status": "True", "reason": "SlurmDrain", "message": "x",
                   "lastTransitionTime": now, "lastHeartbeatTime": now}  # fmt: skip
        assert await patch({"status": {"conditions": [drained]}}, status=True) == ""

        cordon = {"spec": {"unschedulable": True}}
        assert "spec.unschedulable: the syncer may not change them on a node" in await patch(cordon)
        role = {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}
        assert "metadata.labels: the syncer may not change node-role" in await patch(role)
        moved = {"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}}
        assert "status.addresses" in await patch(moved, status=True)
    finally:
        await kube.delete(Node, node.metadata.name)  # type: ignore[union-attr]


async def test_the_scheduler_changes_only_its_own_on_the_pods_naming_it(
    installed: Installed,
) -> None:
    """As the scheduler's ServiceAccount, in a tenant's namespace: on a pod
    that names it, the writes it makes (the node lock's toleration and the job
    id, PodScheduled, the GPUs' condition, a Binding with the job id, a delete)
    are done; its image, another toleration, label or annotation, its IP, a
    Binding with other annotations are refused, and so is any write to a pod
    that names another scheduler."""
    kube, scheduler, tenant = installed.kube, installed.scheduler, installed.tenant

    def tenant_pod(name: str, scheduler_name: str) -> Pod:
        return _pod({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler_name,
                     "containers": [{"name": "c", "image": "registry.invalid/app:1"}]},
        })  # fmt: skip

    pod = await kube.create(tenant_pod("placed", SCHEDULER), namespace=tenant)
    await kube.create(tenant_pod("elsewhere", "default-scheduler"), namespace=tenant)

    async def patch(
        body: dict[str, Any], *, status: bool = False, on: str = "placed", dry_run: bool = True
    ) -> str:
        return await refusal(
            scheduler.patch(
                Pod.Status if status else Pod, on, body, namespace=tenant,
                patch_type=PatchType.STRATEGIC if status else PatchType.MERGE, dry_run=dry_run,
            )
        )  # fmt: skip

    image = {"spec": {"containers": [{"name": "c", "image": FOREIGN_IMAGE}]}}

    async def image_refused() -> bool:
        got = await refusal(
            scheduler.patch(
                Pod, "placed", image, namespace=tenant, patch_type=PatchType.STRATEGIC,
                dry_run=True,
            )
        )  # fmt: skip
        return "spec.containers: the scheduler may not change them" in got

    await _wait_for("the scheduler's policy", image_refused)

    # What it writes, from its own builders (the first two for real).
    toleration = lock_toleration_patch(pod, 7)
    assert toleration is not None
    assert await patch(toleration, dry_run=False) == ""
    pod = await kube.get(Pod, "placed", namespace=tenant)
    assert pending_job_patch(pod, 8) is not None
    assert await patch(pending_job_patch(pod, 8) or {}) == ""
    now = datetime.datetime.now(datetime.UTC)
    assert await patch(unschedulable_patch(pod, "Resources", now) or {}, status=True) == ""
    assert await patch(slurm_gpus_patch((0, 1), now), status=True) == ""

    have = [t.to_dict() for t in (pod.spec.tolerations if pod.spec else None) or []]
    everything = {"spec": {"tolerations": [*have, {"operator": "Exists"}]}}
    assert "spec.tolerations: the scheduler may add only the node lock's" in await patch(everything)
    other = {"metadata": {"annotations": {"example.com/note": "x"}}}
    assert "metadata.annotations: the scheduler may not change example.com/note" in await patch(
        other
    )
    label = {"metadata": {"labels": {"app": "web"}}}
    assert "metadata.labels: the scheduler may not change app" in await patch(label)
    ip = {"status": {"podIP": "10.9.9.9", "podIPs": [{"ip": "10.9.9.9"}]}}
    assert "status.podIP" in await patch(ip, status=True)
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert "status.conditions: the scheduler may change only its own" in await patch(
        ready, status=True
    )
    for body, status in (({"metadata": {"annotations": {"sunk.dev/slurm-job-id": "9"}}}, False),
                         (slurm_gpus_patch((0,), now), True)):  # fmt: skip
        assert "only pods that name it" in await patch(body, status=status, on="elsewhere")
    assert "only pods that name it" in await refusal(
        scheduler.delete(Pod, "elsewhere", namespace=tenant, dry_run=True)
    )

    uid = pod.metadata.uid or ""  # type: ignore[union-attr]
    foreign = await refusal(
        bind_pod(scheduler, tenant, "placed", "n1", uid, annotations={"example.com/x": "y"})
    )
    assert "a Binding of the scheduler carries only sunk.dev/slurm-job-id" in foreign
    assert (
        await refusal(
            bind_pod(
                scheduler, tenant, "placed", "n1", uid, annotations={"sunk.dev/slurm-job-id": "7"}
            )
        )
        == ""
    )
    assert await delete_pod(scheduler, tenant, "placed", uid)


def test_the_defaults_let_the_slurm_charts_nodesets_through(tmp_path: Path) -> None:
    """The chart's default componentPolicies.slurmdPods cover what every CI
    values file of the slurm chart (release `slurm`) puts in its NodeSets but
    a user's own volumes, which its values must list."""
    helm = Helm(ensure_helm(print), None, tmp_path / "helm")
    values = yaml.safe_load((CHARTS / "sunk-cluster" / "values.yaml").read_text())
    defaults = values["componentPolicies"]["slurmdPods"]
    for case in sorted((CHARTS / "slurm" / "ci").glob("*.yaml")):
        out = helm.run(["template", SLURM_RELEASE, str(CHARTS / "slurm"), "-f", str(case)])
        needs = charts.slurmd_pod_allowance(d for d in yaml.safe_load_all(out) if d)
        assert set(needs["images"]) <= set(defaults["images"]), case.name
        assert set(needs["capabilities"]) <= set(defaults["capabilities"]), case.name
        # Secrets the chart names itself; a registry login is the user's to list.
        own = {s for s in needs["secrets"] if s.startswith(f"{SLURM_RELEASE}-")}
        assert own <= set(defaults["secrets"]), case.name


async def test_the_gpu_plugin_writes_only_its_gpus_on_its_own_node(installed: Installed) -> None:
    """As the GPU plugin's ServiceAccount, with a token bound to its pod on
    node A (as the pod's own projected token is): its annotation
    sunk.dev/gpus on A is written (the plugin's own patch); the same on node
    B, another annotation or a label on A, a cordon, text that is no index
    list, and the same patch with an unbound token are refused."""
    from sunk.gpus.publish import gpus_patch

    kube, namespace, release = installed.kube, installed.namespace, installed.release
    account = f"{release}-gpu-plugin"
    nodes = [f"{namespace}-gpu-{n}" for n in ("a", "b")]
    clients: list[AsyncClient] = []
    try:
        for name in nodes:
            await kube.create(Node(metadata=ObjectMeta(name=name)))
        plugin = await kube.create(
            _pod({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-plugin-a"},
                "spec": {"serviceAccountName": account, "nodeName": nodes[0],
                         "containers": [{"name": "c", "image": FOREIGN_IMAGE}]},
            }),
            namespace=namespace,
        )  # fmt: skip
        for bound in (plugin, None):
            path = await charts.service_account_kubeconfig(
                kube,
                installed.kube_access.server,
                installed.kube_access.ca_file,
                namespace,
                account,
                installed.scratch / f"gpu-plugin-{'bound' if bound else 'unbound'}.kubeconfig",
                bound_to=bound,
            )
            clients.append(async_client(path, field_manager="sunk-gpu-plugin"))
        own, unbound = clients

        async def patch(body: Any, node: str = nodes[0], client: AsyncClient = own) -> str:
            return await refusal(
                client.patch(Node, node, body, patch_type=PatchType.MERGE, dry_run=True)
            )

        async def policy_on() -> bool:
            return "the GPU plugin writes only the Node" in await patch(gpus_patch([0]), nodes[1])

        await _wait_for("the GPU plugin's node policy", policy_on)
        assert await patch(gpus_patch([0, 2, 3])) == ""
        assert await patch(gpus_patch([])) == ""
        refused = {
            "another node": await patch(gpus_patch([0]), nodes[1]),
            "unbound token": await patch(gpus_patch([0]), client=unbound),
            "other annotation": await patch({"metadata": {"annotations": {"x.io/y": "1"}}}),
            "label": await patch({"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}}),
            "cordon": await patch({"spec": {"unschedulable": True}}),
            "not indices": await patch({"metadata": {"annotations": {"sunk.dev/gpus": "all"}}}),
        }
        assert "the GPU plugin writes only the Node" in refused.pop("another node")
        assert "the GPU plugin writes only the Node" in refused.pop("unbound token")
        assert "may not change x.io/y" in refused.pop("other annotation")
        assert "may not change nvidia.com/gpu.present" in refused.pop("label")
        assert "may not change a node's spec" in refused.pop("cordon")
        assert "GPU indices, comma-separated" in refused.pop("not indices")
        assert not refused
    finally:
        for client in clients:
            await client.close()
        for name in nodes:
            with contextlib.suppress(ApiError):
                await kube.delete(Node, name)
