"""Contract tests: the Kubernetes behaviour sunk relies on, pinned against the
real kube-apiserver, kube-controller-manager and kube-scheduler of the bed.

Pods that no scheduler should touch use `schedulerName: sunk-test-none`, so a
Node made by another test never attracts them.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio
from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.apiextensions_v1 import (
    CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec,
    CustomResourceDefinitionVersion,
    CustomResourceSubresources,
    CustomResourceValidation,
    JSONSchemaProps,
    ValidationRule,
)
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import (
    Container,
    NodeCondition,
    NodeSpec,
    NodeStatus,
    PodSpec,
    PodTemplateSpec,
    Taint,
    Toleration,
)
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from sunk_testbed.control_plane import (
    KUBERNETES_VERSION,
    KubeAccess,
    KubeControlPlane,
    async_client,
    async_http_client,
)

pytestmark = pytest.mark.contract

NO_SCHEDULER = "sunk-test-none"
IMAGE = "registry.invalid/pause:1"  # never pulled: no kubelet runs these pods
TEST_TAINT = "sunk.test/contract"


def pod(name: str, *, scheduler: str = NO_SCHEDULER, node: str | None = None, **labels: str) -> Pod:
    return Pod(
        metadata=ObjectMeta(name=name, labels=labels or None),
        spec=PodSpec(
            schedulerName=scheduler,
            nodeName=node,
            containers=[Container(name="c", image=IMAGE)],
            terminationGracePeriodSeconds=0,
        ),
    )


async def eventually(probe: Callable[[], Awaitable[Any]], what: str, within: float = 20.0) -> Any:
    """Poll `probe` until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await probe()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.1)


@pytest_asyncio.fixture(loop_scope="session")
async def http(kubeconfig: Path) -> AsyncIterator[httpx2.AsyncClient]:
    async with async_http_client(kubeconfig) as client:
        yield client


# --------------------------------------------------------------- basic semantics


async def test_create_answers_201_and_a_second_create_409(
    http: httpx2.AsyncClient, namespace: str
) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}}
    url = f"/api/v1/namespaces/{namespace}/configmaps"
    first = await http.post(url, json=body)
    assert first.status_code == 201, first.text
    assert first.json()["metadata"]["resourceVersion"]
    again = await http.post(url, json=body)
    assert again.status_code == 409
    assert again.json()["reason"] == "AlreadyExists"


async def test_update_with_a_stale_resource_version_is_a_409_conflict(
    kube: AsyncClient, namespace: str
) -> None:
    created = await kube.create(
        ConfigMap(metadata=ObjectMeta(name="c"), data={"v": "1"}), namespace=namespace
    )
    stale = created.metadata.resourceVersion
    created.data = {"v": "2"}
    updated = await kube.replace(created)
    assert updated.metadata.resourceVersion != stale

    created.data = {"v": "3"}
    created.metadata.resourceVersion = stale
    with pytest.raises(ApiError) as err:
        await kube.replace(created)
    assert err.value.status.code == 409
    assert err.value.status.reason == "Conflict"
    current = await kube.get(ConfigMap, "c", namespace=namespace)
    assert current.data == {"v": "2"}


async def test_label_and_field_selectors_on_pods(kube: AsyncClient, namespace: str) -> None:
    await kube.create(pod("a1", app="a"), namespace=namespace)
    await kube.create(pod("a2", app="a", node="node-x"), namespace=namespace)
    await kube.create(pod("b1", app="b", scheduler="sunk-test-other"), namespace=namespace)

    async def names(**selectors: Any) -> set[str]:
        return {p.metadata.name async for p in kube.list(Pod, namespace=namespace, **selectors)}

    assert await names(labels={"app": "a"}) == {"a1", "a2"}
    assert await names(fields={"spec.nodeName": "node-x"}) == {"a2"}
    # An empty nodeName selects the pods no one has bound yet.
    assert await names(fields={"spec.nodeName": ""}) == {"a1", "b1"}
    assert await names(fields={"spec.schedulerName": "sunk-test-other"}) == {"b1"}
    assert await names(
        labels={"app": "a"}, fields={"spec.schedulerName": NO_SCHEDULER, "spec.nodeName": ""}
    ) == {"a1"}


# ------------------------------------------------------------------------ watch


async def test_watch_resumes_after_a_resource_version(kube: AsyncClient, namespace: str) -> None:
    await kube.create(ConfigMap(metadata=ObjectMeta(name="before")), namespace=namespace)
    mark = (await kube.get(ConfigMap, "before", namespace=namespace)).metadata.resourceVersion
    await kube.create(ConfigMap(metadata=ObjectMeta(name="after")), namespace=namespace)
    await kube.patch(ConfigMap, "after", {"data": {"x": "1"}}, namespace=namespace)

    seen: list[tuple[str, str]] = []

    async def collect() -> None:
        async for kind, obj in kube.watch(ConfigMap, namespace=namespace, resource_version=mark):
            seen.append((kind, obj.metadata.name))
            if obj.metadata.name == "last":
                return

    watcher = asyncio.create_task(collect())
    await kube.create(ConfigMap(metadata=ObjectMeta(name="last")), namespace=namespace)
    await asyncio.wait_for(watcher, 10)
    # Only what happened after `mark`, in order; "before" and the namespace's
    # kube-root-ca.crt (made by kube-controller-manager earlier) are not replayed.
    assert [s for s in seen if s[1] != "kube-root-ca.crt"] == [
        ("ADDED", "after"),
        ("MODIFIED", "after"),
        ("ADDED", "last"),
    ]


async def test_watch_from_a_too_old_resource_version_is_410_expired(
    kube: AsyncClient, http: httpx2.AsyncClient, namespace: str
) -> None:
    # "1" predates everything the watch cache holds since the apiserver started
    # (the bed writes to etcd before starting it, so this holds on a fresh bed too).
    async def first_event() -> object:
        async for event in kube.watch(ConfigMap, namespace=namespace, resource_version="1"):
            return event
        return None

    with pytest.raises(ApiError) as err:
        await asyncio.wait_for(first_event(), 10)
    assert err.value.status.code == 410
    assert err.value.status.reason == "Expired"

    # On the wire it is an ERROR event inside a 200 stream, not an HTTP 410:
    # a client must look at events, not only at the status line.
    url = f"/api/v1/namespaces/{namespace}/configmaps"
    async with http.stream(
        "GET", url, params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "5"}
    ) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            assert '"type":"ERROR"' in line
            assert '"code":410' in line
            break


# ---------------------------------------------------------------------- binding


async def test_pod_binding_sets_node_name_once(
    kube: AsyncClient, http: httpx2.AsyncClient, namespace: str
) -> None:
    await kube.create(pod("p"), namespace=namespace)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-b"},
    }
    # Sent raw: the apiserver answers 201 with a Status, not a Binding, and
    # lightkube 1.0.1's create(Pod.Binding(...)) binds the pod but then raises
    # msgspec.ValidationError ("Object missing required field `target`")
    # decoding that reply as a Binding.
    url = f"/api/v1/namespaces/{namespace}/pods/p/binding"
    reply = await http.post(url, json=binding)
    assert reply.status_code == 201, reply.text
    assert reply.json()["kind"] == "Status"
    assert reply.json()["status"] == "Success"

    bound = await kube.get(Pod, "p", namespace=namespace)
    assert bound.spec.nodeName == "node-b"
    scheduled = [c for c in bound.status.conditions or [] if c.type == "PodScheduled"]
    assert [c.status for c in scheduled] == ["True"]

    # A second binding is refused: two schedulers cannot both win.
    again = await http.post(url, json=binding | {"target": binding["target"] | {"name": "n2"}})
    assert again.status_code == 409
    assert (await kube.get(Pod, "p", namespace=namespace)).spec.nodeName == "node-b"


# ------------------------------------------------------------------------ lease


async def test_lease_compare_and_swap_has_one_winner(kube: AsyncClient, namespace: str) -> None:
    await kube.create(
        Lease(metadata=ObjectMeta(name="leader"), spec=LeaseSpec(holderIdentity="nobody")),
        namespace=namespace,
    )
    base = await kube.get(Lease, "leader", namespace=namespace)

    async def claim(holder: str) -> str:
        mine = Lease(
            metadata=ObjectMeta(
                name="leader", namespace=namespace, resourceVersion=base.metadata.resourceVersion
            ),
            spec=LeaseSpec(holderIdentity=holder, leaseDurationSeconds=15),
        )
        try:
            await kube.replace(mine)
        except ApiError as e:
            return "conflict" if e.status.code == 409 else f"error {e.status.code}"
        return "won"

    results = await asyncio.gather(claim("one"), claim("two"))
    assert sorted(results) == ["conflict", "won"]
    holder = (await kube.get(Lease, "leader", namespace=namespace)).spec.holderIdentity
    assert holder == ("one" if results[0] == "won" else "two")


# ------------------------------------------------------------------- CRD schema

GROUP = "contract.sunk.test"
Widget = create_namespaced_resource(GROUP, "v1", "Widget", "widgets")


def _widget_crd() -> CustomResourceDefinition:
    spec_schema = JSONSchemaProps(
        type="object",
        required=["replicas"],
        properties={
            "replicas": JSONSchemaProps(type="integer", minimum=0),
            "minNodes": JSONSchemaProps(type="integer"),
            "maxNodes": JSONSchemaProps(type="integer"),
        },
        x_kubernetes_validations=[
            ValidationRule(
                rule="!has(self.minNodes) || !has(self.maxNodes) || self.minNodes <= self.maxNodes",
                message="minNodes must not exceed maxNodes",
                fieldPath=".minNodes",
            )
        ],
    )
    status_schema = JSONSchemaProps(
        type="object", properties={"ready": JSONSchemaProps(type="integer")}
    )
    return CustomResourceDefinition(
        metadata=ObjectMeta(name=f"widgets.{GROUP}"),
        spec=CustomResourceDefinitionSpec(
            group=GROUP,
            scope="Namespaced",
            names=CustomResourceDefinitionNames(kind="Widget", plural="widgets", singular="widget"),
            versions=[
                CustomResourceDefinitionVersion(
                    name="v1",
                    served=True,
                    storage=True,
                    subresources=CustomResourceSubresources(status={}),
                    schema=CustomResourceValidation(
                        openAPIV3Schema=JSONSchemaProps(
                            type="object",
                            properties={"spec": spec_schema, "status": status_schema},
                        )
                    ),
                )
            ],
        ),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def widget_crd(kube: AsyncClient) -> AsyncIterator[None]:
    crd = _widget_crd()
    try:
        await kube.create(crd)
    except ApiError as e:  # left over by a crashed session on an external bed
        if e.status.code != 409:
            raise
    await kube.wait(
        CustomResourceDefinition,
        crd.metadata.name,
        for_conditions=["Established"],
        raise_for_conditions=[],
    )

    # Established is not quite "served": the REST handler may still answer 404,
    # then 429 "storage is (re)initializing" while its watch cache fills.
    async def served() -> bool:
        try:
            _ = [w async for w in kube.list(Widget, namespace="default")]
        except ApiError as e:
            if e.status.code in (404, 429):
                return False
            raise
        return True

    await eventually(served, "the Widget CRD to be served")
    yield
    await kube.delete(CustomResourceDefinition, crd.metadata.name)


def widget(
    name: str, spec: dict[str, Any], status: dict[str, Any] | None = None, *, rv: str | None = None
) -> dict[str, Any]:
    # Generic objects are dicts; their `.metadata` is a fresh copy on every
    # access, so a resourceVersion must be set in the dict itself.
    body: dict[str, Any] = {"metadata": {"name": name}, "spec": spec}
    if rv is not None:
        body["metadata"]["resourceVersion"] = rv
    if status is not None:
        body["status"] = status
    return body


@pytest.mark.usefixtures("widget_crd")
async def test_crd_schema_and_cel_rules_reject_bad_objects_naming_the_field(
    kube: AsyncClient, namespace: str
) -> None:
    await kube.create(
        Widget(widget("ok", {"replicas": 1, "minNodes": 1, "maxNodes": 2})), namespace=namespace
    )

    with pytest.raises(ApiError) as err:
        await kube.create(Widget(widget("neg", {"replicas": -1})), namespace=namespace)
    assert err.value.status.code == 422
    assert "spec.replicas" in err.value.status.message

    with pytest.raises(ApiError) as err:
        await kube.create(
            Widget(widget("cel", {"replicas": 1, "minNodes": 3, "maxNodes": 2})),
            namespace=namespace,
        )
    assert err.value.status.code == 422
    assert "spec.minNodes" in err.value.status.message
    assert "minNodes must not exceed maxNodes" in err.value.status.message
    causes = err.value.status.details.causes
    assert [c.field for c in causes] == ["spec.minNodes"]


@pytest.mark.usefixtures("widget_crd")
async def test_status_subresource_is_kept_apart_from_spec(
    kube: AsyncClient, namespace: str
) -> None:
    created = await kube.create(
        Widget(widget("w", {"replicas": 1}, {"ready": 5})), namespace=namespace
    )
    # Status is ignored on create when the status subresource is on.
    assert created.get("status") in (None, {})
    assert created.metadata.generation == 1

    # Writing /status changes status only, even if the body carries another spec.
    body = widget("w", {"replicas": 9}, {"ready": 1}, rv=created.metadata.resourceVersion)
    after_status = await kube.replace(Widget.Status(body), "w", namespace=namespace)
    assert after_status["spec"] == {"replicas": 1}
    assert after_status["status"] == {"ready": 1}
    assert after_status.metadata.generation == 1  # status writes do not bump generation

    # Writing the object changes spec only, even if the body carries another status.
    body = widget("w", {"replicas": 2}, {"ready": 7}, rv=after_status.metadata.resourceVersion)
    after_spec = await kube.replace(Widget(body), namespace=namespace)
    assert after_spec["spec"] == {"replicas": 2}
    assert after_spec["status"] == {"ready": 1}
    assert after_spec.metadata.generation == 2


# ---------------------------------------------------------- the other daemons


async def test_controller_manager_turns_a_deployment_into_pods(
    kube: AsyncClient, namespace: str
) -> None:
    labels = {"app": "d"}
    await kube.create(
        Deployment(
            metadata=ObjectMeta(name="d"),
            spec=DeploymentSpec(
                replicas=2,
                selector=LabelSelector(matchLabels=labels),
                template=PodTemplateSpec(
                    metadata=ObjectMeta(labels=labels),
                    spec=pod("unused").spec,
                ),
            ),
        ),
        namespace=namespace,
    )

    async def pods() -> list[Pod]:
        found = [p async for p in kube.list(Pod, namespace=namespace, labels=labels)]
        return found if len(found) == 2 else []

    made = await eventually(pods, "the Deployment's two pods")
    owners = {ref.kind for p in made for ref in p.metadata.ownerReferences or []}
    assert owners == {"ReplicaSet"}


@pytest_asyncio.fixture(loop_scope="session")
async def ready_node(kube: AsyncClient) -> AsyncIterator[str]:
    """A Node object that looks Ready and has room (no kubelet behind it)."""
    name = f"ct-node-{secrets.token_hex(3)}"
    room = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    await kube.create(
        Node(
            metadata=ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}),
            # Only pods that tolerate this land here, even on a shared cluster.
            spec=NodeSpec(taints=[Taint(key=TEST_TAINT, value="true", effect="NoSchedule")]),
            status=NodeStatus(
                conditions=[NodeCondition(type="Ready", status="True", reason="KubeletReady")],
                capacity=room,
                allocatable=room,
            ),
        )
    )
    yield name
    await kube.delete(Node, name)


async def test_scheduler_binds_a_pod_to_a_ready_node(
    kube: AsyncClient, namespace: str, ready_node: str
) -> None:
    node = await kube.get(Node, ready_node)
    assert node.status.allocatable == {"cpu": "4", "memory": "8Gi", "pods": "110"}
    placed = pod("p", scheduler="default-scheduler")
    placed.spec.nodeSelector = {"kubernetes.io/hostname": ready_node}
    placed.spec.tolerations = [Toleration(key=TEST_TAINT, operator="Exists")]
    await kube.create(placed, namespace=namespace)

    async def bound() -> str | None:
        node_name: str | None = (await kube.get(Pod, "p", namespace=namespace)).spec.nodeName
        return node_name

    assert await eventually(bound, "kube-scheduler to bind the pod") == ready_node


# ------------------------------------------------------------------- identities


async def test_issued_node_identity_is_limited_by_node_restriction(
    kube_control_plane: KubeControlPlane | None, kube: AsyncClient
) -> None:
    if kube_control_plane is None:
        pytest.skip("needs the bed's own PKI")
    name = f"ct-self-{secrets.token_hex(3)}"
    path = kube_control_plane.issue_kubeconfig(name, f"system:node:{name}", ["system:nodes"])
    async with async_client(path) as node_client:
        try:
            await node_client.create(Node(metadata=ObjectMeta(name=name)))
            with pytest.raises(ApiError) as err:
                await node_client.create(Node(metadata=ObjectMeta(name=f"{name}-other")))
            assert err.value.status.code == 403
        finally:
            await kube.delete(Node, name)
            path.unlink()


async def test_component_identities_have_no_rights_until_granted(
    kube_control_plane: KubeControlPlane | None, kube_access: KubeAccess, namespace: str
) -> None:
    if kube_control_plane is None:
        pytest.skip("needs the bed's own identities")
    assert set(kube_access.kubeconfigs) == {
        "sunk-operator",
        "sunk-syncer",
        "sunk-scheduler",
        "admin",
    }
    async with async_client(kube_access.kubeconfigs["sunk-operator"]) as client:
        with pytest.raises(ApiError) as err:
            await client.get(ConfigMap, "kube-root-ca.crt", namespace=namespace)
        assert err.value.status.code == 403
        assert "sunk-operator" in err.value.status.message


async def test_the_apiserver_reports_its_release_version(kubeconfig: Path) -> None:
    """Clients (kubectl, helm) read /version; the build stamps the real release."""
    async with async_http_client(kubeconfig) as http:
        version = (await http.get("/version")).json()
    assert version["gitVersion"] == KUBERNETES_VERSION
    assert version["major"] == "1"
    assert version["minor"] == KUBERNETES_VERSION.split(".")[1]
