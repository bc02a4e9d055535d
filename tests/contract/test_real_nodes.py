"""Real nodes: kubelet and containerd built here, pods started from images built
here and pulled from the bed's registry, kube-proxy Services, cluster DNS,
`kubectl logs` and `kubectl exec` through the apiserver, cgroup limits.

No stand-in: every pod below runs on a real kubelet in a real container.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lightkube import AsyncClient, codecs
from lightkube.resources.core_v1 import Node, Pod

from plugins.nodes import RealNodes, kubectl
from plugins.slurm_pods import wait_for
from sunk_testbed import nodeconf
from sunk_testbed.control_plane import KubeAccess
from sunk_testbed.images import DEFAULT_SLURM, SLURM_SUITES
from sunk_testbed.nodes import nodes_ready

pytestmark = pytest.mark.contract


def pod(name: str, namespace: str, node: str, image: str, command: list[str], **extra: object):  # type: ignore[no-untyped-def]
    container: dict[str, object] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        **extra,
    }
    return codecs.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 2,
                "containers": [container],
            },
        }
    )


async def phase(kube: AsyncClient, name: str, namespace: str) -> str:
    got = await kube.get(Pod, name, namespace=namespace)
    return (got.status.phase if got.status else None) or ""


async def test_nodes_register_with_their_own_address(
    kube: AsyncClient, kubelet_nodes: RealNodes
) -> None:
    subnet = kubelet_nodes.room.subnet()
    for name in kubelet_nodes.names:
        node = await kube.get(Node, name)
        assert node.status is not None
        assert node.status.nodeInfo is not None
        assert node.status.nodeInfo.kubeletVersion.startswith("v1.")
        assert node.status.nodeInfo.containerRuntimeVersion.startswith("containerd://2.")
        addresses = {a.type: a.address for a in node.status.addresses or []}
        assert addresses["InternalIP"].startswith(subnet.pods.rsplit(".", 2)[0])


async def test_a_pod_runs_from_its_image_with_logs_and_exec(
    kube: AsyncClient, kube_access: KubeAccess, kubelet_nodes: RealNodes, namespace: str
) -> None:
    image = kubelet_nodes.images.slurm.ref
    node = kubelet_nodes.names[0]
    await kube.create(
        pod("hello", namespace, node, image, ["sh", "-c", "slurmd -V; echo ready; sleep 600"])
    )
    await wait_for("the pod Running", lambda: _is(kube, "hello", namespace, "Running"), 120)
    got = await kube.get(Pod, "hello", namespace=namespace)
    status = got.status.containerStatuses[0]  # type: ignore[union-attr,index]
    assert status.imageID, "a real runtime reports the image's digest"
    assert "registry.sunk.test/" in status.image

    async def logged() -> bool:
        return "ready" in kubectl(kube_access, "-n", namespace, "logs", "hello").stdout

    await wait_for("kubectl logs", logged, 30)
    logs = kubectl(kube_access, "-n", namespace, "logs", "hello").stdout
    assert logs.startswith("slurm-wlm ")  # the image's own slurmd, not the host's

    done = kubectl(kube_access, "-n", namespace, "exec", "hello", "--", "cat", "/etc/os-release")
    assert done.returncode == 0, done.stderr
    # The image's userland (the default Slurm's suite); the host is bookworm.
    assert SLURM_SUITES[DEFAULT_SLURM] in done.stdout


async def test_services_and_dns_reach_the_apiserver(
    kube: AsyncClient, kube_access: KubeAccess, kubelet_nodes: RealNodes, namespace: str
) -> None:
    """kube-proxy's rules and CoreDNS: a pod asks the apiserver by its Service name."""
    image = kubelet_nodes.images.slurm.ref
    script = (
        "getent hosts kubernetes.default.svc.cluster.local;"
        " curl -sS --cacert /var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
        ' -H "Authorization: Bearer $(cat /var/run/secrets/kubernetes.io/serviceaccount/token)"'
        " https://kubernetes.default.svc/version"
    )
    await kube.create(pod("asker", namespace, kubelet_nodes.names[-1], image, ["sh", "-c", script]))
    await wait_for("the pod done", lambda: _done(kube, "asker", namespace), 120)
    out = kubectl(kube_access, "-n", namespace, "logs", "asker").stdout
    assert await phase(kube, "asker", namespace) == "Succeeded", out
    assert "10.96.0.1" in out
    assert '"gitVersion": "v1.36' in out


async def test_a_pod_over_its_memory_limit_is_oom_killed(
    kube: AsyncClient, kubelet_nodes: RealNodes, namespace: str
) -> None:
    image = kubelet_nodes.images.slurm.ref
    hog = ["perl", "-e", '$x = "a" x (256 * 1024 * 1024); sleep 30']
    limits = {"resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}}}
    await kube.create(pod("hog", namespace, kubelet_nodes.names[0], image, hog, **limits))
    await wait_for("the pod failed", lambda: _done(kube, "hog", namespace), 120)
    got = await kube.get(Pod, "hog", namespace=namespace)
    terminated = got.status.containerStatuses[0].state.terminated  # type: ignore[union-attr,index]
    assert terminated is not None
    assert terminated.reason == "OOMKilled"


async def test_a_node_powered_off_leaves_nothing_behind(
    kube: AsyncClient, kubelet_nodes: RealNodes, namespace: str
) -> None:
    """A node with a running pod is stopped: no process, cgroup or mount of it
    stays; started again, it is Ready and runs its bound pod again."""
    group, name = kubelet_nodes.group, kubelet_nodes.names[0]
    image = kubelet_nodes.images.slurm.ref
    sleeper = pod("sleeper", namespace, name, image, ["sleep", "600"])
    sleeper.spec.restartPolicy = "Always"  # type: ignore[union-attr]
    await kube.create(sleeper)
    await wait_for("the pod Running", lambda: _is(kube, "sleeper", namespace, "Running"), 120)

    await asyncio.to_thread(group.stop, [name], kubelet_nodes.bin_dir)
    root = str(group.paths(name).root.resolve())
    assert [m for m in kubelet_nodes.room.mounts() if m.startswith(root)] == []
    cgroup = nodeconf.cgroup_root(kubelet_nodes.room.tag, name)
    left = [
        controller
        for controller in nodeconf.CGROUP_CONTROLLERS
        if await asyncio.to_thread(Path("/sys/fs/cgroup", controller, cgroup.lstrip("/")).exists)
    ]
    assert left == []

    specs = [s for s in kubelet_nodes.specs if s.name == name]
    await asyncio.to_thread(
        kubelet_nodes.bed.start, specs, kubelet_nodes.bin_dir, kubelet_nodes.images.pause.ref
    )
    await wait_for("the node Ready again", lambda: nodes_ready(kube, [name]), 60)
    await wait_for("the pod Running again", lambda: _restarted(kube, "sleeper", namespace), 120)


async def _restarted(kube: AsyncClient, name: str, namespace: str) -> bool:
    got = await kube.get(Pod, name, namespace=namespace)
    statuses = (got.status.containerStatuses if got.status else None) or []
    return bool(statuses) and statuses[0].ready and statuses[0].restartCount >= 1


async def _is(kube: AsyncClient, name: str, namespace: str, wanted: str) -> bool:
    return await phase(kube, name, namespace) == wanted


async def _done(kube: AsyncClient, name: str, namespace: str) -> bool:
    return await phase(kube, name, namespace) in ("Succeeded", "Failed")
