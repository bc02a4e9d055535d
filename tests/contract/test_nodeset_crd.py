"""The NodeSet CRD on the real apiserver: accepted, defaulted, and bad specs refused by field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lightkube import AsyncClient
from lightkube.models.core_v1 import Node, NodeStatus
from lightkube.models.meta_v1 import ObjectMeta

from sunk.api import nodeset as api
from sunk.api.crd import POD_TEMPLATE_SCHEMA, pod_template_schema
from sunk.api.install import install_crds
from sunk.nodeset.pods import NodeSetRef, build_pod, template_hash
from sunk_testbed.control_plane import async_http_client
from sunk_testbed.crd_schemas import fetch_core_openapi
from sunk_testbed.crd_schemas import pod_template_schema as generate_pod_template_schema

pytestmark = pytest.mark.contract

NodeSet = api.resource()


@pytest_asyncio.fixture(scope="session")
async def crds_installed(kube: AsyncClient) -> AsyncIterator[None]:
    await install_crds(kube)
    yield


def nodeset(name: str, **spec: Any) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {"containers": [{"name": "slurmd", "image": "sunk/slurmd", "command": ["slurmd"]}]}
    }
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {"template": template, **spec},
    }


async def test_committed_pod_template_schema_matches_the_apiserver(kubeconfig: Path) -> None:
    """A Kubernetes upgrade that changes the pod API must regenerate the schema."""
    live = generate_pod_template_schema(await fetch_core_openapi(kubeconfig))
    assert live == pod_template_schema(), (
        f"regenerate {POD_TEMPLATE_SCHEMA}: python -m sunk_testbed.crd_schemas KUBECONFIG"
    )


async def test_a_valid_nodeset_is_stored_with_its_defaults(
    kube: AsyncClient, namespace: str, crds_installed: None
) -> None:
    created = await kube.create(NodeSet(nodeset("gpu")), namespace=namespace)
    spec = created["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    assert spec["slurm"]["nodeName"] == "{nodeset}-{node}"
    assert spec["slurm"]["slurmdContainer"] == "slurmd"
    # What the apiserver stores parses back into the typed model.
    api.NodeSetSpec.model_validate(spec)


def _with(path: str, value: Any) -> dict[str, Any]:
    """A nodeset whose field at dotted `path` (under spec) is `value`."""
    body = nodeset("bad")
    node: Any = body["spec"]
    *parents, last = path.split(".")
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[last] = value
    return body


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        (_with("template.spec.containers", []), "spec.template.spec.containers", "at least one"),
        (
            _with("template.spec.containers.0.comand", ["x"]),
            "spec.template.spec.containers[0].comand",
            "unknown field",
        ),
        (
            _with("template.spec.containers.0.resources", {"limits": {"cpu": "lots"}}),
            "spec.template.spec.containers[0].resources.limits.cpu",
            "should match",
        ),
        (
            _with("template.spec.restartPolicy", "Never"),
            "spec.template.spec.restartPolicy",
            "Always",
        ),
        (_with("template.spec.nodeName", "n1"), "spec.template.spec.nodeName", "must not be set"),
        (
            _with("updateStrategy", {"rollingUpdate": {"maxUnavailable": "150%"}}),
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
            "percentage",
        ),
        (
            _with("updateStrategy", {"rollingUpdate": {"maxUnavailable": 0}}),
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
            "positive integer",
        ),
        (_with("updateStrategy", {"type": "Recreate"}), "spec.updateStrategy.type", "Unsupported"),
        (_with("slurm", {"nodeName": "gpu-{nodeset}"}), "spec.slurm.nodeName", "{node} or {ip}"),
        (_with("slurm", {"nodeName": "GPU_{node}"}), "spec.slurm.nodeName", "lower-case"),
        (_with("slurm", {"features": ["has space"]}), "spec.slurm.features[0]", "should match"),
        (_with("slurm", {"resources": {"cpus": 0}}), "spec.slurm.resources.cpus", "greater than"),
    ],
    ids=lambda v: v if isinstance(v, str) and "." in v else "",
)
async def test_invalid_nodesets_are_refused_naming_the_field(
    kubeconfig: Path,
    namespace: str,
    crds_installed: None,
    body: dict[str, Any],
    field: str,
    says: str,
) -> None:
    # Sent as kubectl sends it: strict field validation makes unknown fields
    # an error instead of a warning and a silent prune.
    async with async_http_client(kubeconfig) as http:
        reply = await http.post(
            f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.PLURAL}",
            params={"fieldValidation": "Strict"},
            json=body,
        )
    assert reply.status_code in (400, 422), reply.text
    message = reply.json()["message"]
    assert field in message, message
    assert says in message, message


async def test_a_built_pod_is_valid_for_the_apiserver(
    kube: AsyncClient, namespace: str, crds_installed: None
) -> None:
    """What the builder makes passes the apiserver's own validation (server-side dry run)."""
    from lightkube.resources.core_v1 import Pod

    created = await kube.create(NodeSet(nodeset("gpu")), namespace=namespace)
    spec = api.NodeSetSpec.model_validate(created["spec"])
    node = Node(
        metadata=ObjectMeta(name="worker-1", labels={"nvidia.com/gpu.product": "NVIDIA-H100"}),
        status=NodeStatus(allocatable={"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8"}),
    )
    owner = NodeSetRef(namespace, "gpu", created["metadata"]["uid"])
    pod = build_pod(owner, spec, node, template_hash(spec))
    stored = await kube.create(pod, namespace=namespace, dry_run=True)
    assert isinstance(stored, Pod)
    assert stored.metadata is not None
    assert stored.spec is not None
    assert stored.metadata.name == "gpu-worker-1"
    assert stored.spec.hostname == "gpu-worker-1"
    env = {e.name: e.value for e in stored.spec.containers[0].env or []}
    assert env["SLURMD_NODENAME"] == "gpu-worker-1"
    assert env["SLURMD_CONF"] == "Feature=gpu CPUs=8 RealMemory=32768 Gres=gpu:h100:8"
    assert stored.spec.affinity is not None
    assert json.dumps(stored.spec.affinity.to_dict()).count("worker-1") == 1
