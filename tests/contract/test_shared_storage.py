"""Shared storage on real nodes: a ReadWriteMany claim of the `shared` class,
provisioned by csi-provisioner through the S3 CSI driver, a bucket in
SeaweedFS mounted with s3fs (FUSE) on each node (sunk_testbed.storage).

What /home on login and slurmd pods needs of it: one tree seen by pods on
different nodes, owners and modes kept, one node's writes visible on the
other, and the data gone with the claim.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, codecs
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod

from plugins.nodes import RealNodes, kubectl
from plugins.slurm_pods import wait_for
from sunk_testbed.control_plane import KubeAccess
from sunk_testbed.storage import NAMESPACE, SEAWEEDFS

# A cold cache builds SeaweedFS, the driver and the sidecars first (minutes).
pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]

USER = 5001
FILE = "/shared/home/notes"


def _log(message: str) -> None:
    print(f"[storage] {message}", file=sys.stderr, flush=True)


def claim(name: str, namespace: str, storage_class: str) -> Any:
    return codecs.from_dict(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": storage_class,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )


def user_pod(name: str, namespace: str, node: str, image: str, claim_name: str) -> Any:
    """A pod of user 5001 on `node` with the claim at /shared, idle until exec'd into."""
    return codecs.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsUser": USER, "runAsGroup": USER},
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "command": ["sleep", "3600"],
                        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                    }
                ],
                "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": claim_name}}],
            },
        }
    )


def run_in(access: KubeAccess, namespace: str, pod: str, script: str) -> str:
    done = kubectl(access, "-n", namespace, "exec", pod, "--", "sh", "-c", script)
    assert done.returncode == 0, f"{pod}: {script!r}: {done.stderr}"
    return str(done.stdout)


async def running(kube: AsyncClient, name: str, namespace: str) -> bool:
    pod = await kube.get(Pod, name, namespace=namespace)
    return bool(pod.status and pod.status.phase == "Running")


async def await_running(
    kube: AsyncClient, access: KubeAccess, name: str, namespace: str, node: str
) -> float:
    """Seconds until the pod runs; on a timeout, why not (its events, the
    node plugin's log on its node). kubelet retries a failed mount with a
    growing back-off, so a first failure costs more than the mount itself."""
    started = time.monotonic()
    try:
        await wait_for(f"pod {name} running on {node}", lambda: running(kube, name, namespace), 180)
    except AssertionError as late:
        described = kubectl(access, "-n", namespace, "describe", "pod", name).stdout
        plugin = kubectl(
            access,
            "-n",
            NAMESPACE,
            "logs",
            "-l",
            "app.kubernetes.io/name=csi-s3-node",
            "-c",
            "csi-s3",
            "--tail=40",
            "--prefix",
        ).stdout
        raise AssertionError(f"{late}\n{described[-3000:]}\n{plugin[-4000:]}") from None
    return time.monotonic() - started


async def buckets(kube: AsyncClient) -> set[str]:
    """The buckets SeaweedFS holds: its filer's listing of /buckets/ (plain
    HTTP on port 8888 of its pod; the host routes the room's pod addresses)."""
    pods = [
        p
        async for p in kube.list(
            Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": SEAWEEDFS}
        )
    ]
    address = next(p.status.podIP for p in pods if p.status and p.status.podIP)
    request = urllib.request.Request(
        f"http://{address}:8888/buckets/?limit=1000", headers={"Accept": "application/json"}
    )
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with direct.open(request, timeout=10) as reply:
        listing = json.load(reply)
    return {entry["FullPath"].rsplit("/", 1)[-1] for entry in listing.get("Entries") or []}


async def test_a_shared_claim_is_one_tree_on_two_nodes(
    kube: AsyncClient,
    kube_access: KubeAccess,
    kubelet_nodes: RealNodes,
    shared_storage: str,
    namespace: str,
) -> None:
    image = kubelet_nodes.images.container_test.ref
    first, second = kubelet_nodes.names[:2]

    started = time.monotonic()
    await kube.create(claim("home", namespace, shared_storage))

    async def bound() -> str:
        pvc = await kube.get(PersistentVolumeClaim, "home", namespace=namespace)
        phase = pvc.status.phase if pvc.status else None
        return (pvc.spec.volumeName or "") if phase == "Bound" and pvc.spec else ""

    await wait_for("the claim Bound", bound, timeout=60)
    volume = await bound()
    _log(f"claim bound in {time.monotonic() - started:.1f} s (volume {volume})")
    assert volume in await buckets(kube)

    await kube.create(user_pod("a", namespace, first, image, "home"))
    took = await await_running(kube, kube_access, "a", namespace, first)
    _log(f"first mount (pod a Running on {first}) in {took:.1f} s")
    run_in(
        kube_access,
        namespace,
        "a",
        f"mkdir -p /shared/home && echo from-a > {FILE} && chmod 0640 {FILE}",
    )

    await kube.create(user_pod("b", namespace, second, image, "home"))
    took = await await_running(kube, kube_access, "b", namespace, second)
    _log(f"second node's mount (pod b Running on {second}) in {took:.1f} s")
    assert run_in(kube_access, namespace, "b", f"stat -c '%u %g %a' {FILE}").split() == [
        str(USER),
        str(USER),
        "640",
    ]
    assert run_in(kube_access, namespace, "b", f"cat {FILE}") == "from-a\n"
    run_in(kube_access, namespace, "b", f"echo from-b >> {FILE}")

    started = time.monotonic()

    async def appended() -> bool:
        return run_in(kube_access, namespace, "a", f"cat {FILE}") == "from-a\nfrom-b\n"

    await wait_for(f"b's append seen on {first}", appended, timeout=30)
    _log(f"b's append seen by a in {time.monotonic() - started:.1f} s")
    assert run_in(kube_access, namespace, "a", f"stat -c '%u %a' {FILE}").split() == [
        str(USER),
        "640",
    ]

    # The class's reclaim policy is Delete: the driver removes the bucket.
    started = time.monotonic()
    for name in ("a", "b"):
        await kube.delete(Pod, name, namespace=namespace, grace_period=0)
    await kube.delete(PersistentVolumeClaim, "home", namespace=namespace)

    async def volume_gone() -> bool:
        try:
            await kube.get(PersistentVolume, volume)
        except ApiError as error:
            return error.status.code == 404
        return False

    await wait_for("the volume deleted", volume_gone, timeout=90)
    _log(f"claim and volume deleted in {time.monotonic() - started:.1f} s")
    assert volume not in await buckets(kube)
